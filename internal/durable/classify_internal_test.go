package durable

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// errorCase is an error as the store returns it, and how ServeElsewhere
// must read it: refused (the store's process went down, or may have:
// noted, and no session is handed over until the store answers again),
// silent (a timeout: the probe may hand over), unanswered (the breaker).
type errorCase struct {
	name                        string
	err                         error
	refused, silent, unanswered bool
}

// realNetErrors makes, over loopback, the errors the network calls of a
// Redis client meet: a refused dial, a dial timeout, a read timeout on an
// established connection, a connection the other end reset or closed.
func realNetErrors(t *testing.T) []errorCase {
	t.Helper()
	var cases []errorCase
	add := func(name string, err error, refused, silent bool) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", name)
		}
		cases = append(cases, errorCase{name, err, refused, silent, true})
	}

	// Nothing listens: ECONNREFUSED.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close()
	_, err = net.Dial("tcp", closedAddr)
	add("dial refused", err, true, false)

	// A dial its context's deadline ended (go-redis dials under the
	// exchange's context).
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	_, err = (&net.Dialer{}).DialContext(ctx, "tcp", closedAddr)
	cancel()
	add("dial timeout (context)", err, false, true)
	_, err = net.DialTimeout("tcp", closedAddr, time.Nanosecond)
	add("dial timeout (Dialer.Timeout)", err, false, true)

	// Established connections to a server that answers nothing, resets,
	// or closes.
	addr, accepted := proxytest.Listen(t)
	dial := func() (client, server net.Conn) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, <-accepted
	}
	buf := make([]byte, 16)

	c, _ := dial()
	c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err = c.Read(buf)
	add("read timeout", err, false, true)

	c, s := dial()
	s.(*net.TCPConn).SetLinger(0)
	s.Close()
	_, err = c.Read(buf)
	add("read reset", err, true, false)

	c, s = dial()
	s.Close()
	_, err = c.Read(buf)
	add("read EOF (closed)", err, true, false)

	// A write after the other end closed: the first is taken (and reset
	// by the peer), a later one fails.
	c, s = dial()
	s.Close()
	for range 100 {
		if _, err = c.Write([]byte("PING\r\n")); err != nil {
			break
		}
		// Until the peer's reset has come back: a read returns once it
		// has (or at the FIN, EOF).
		c.SetReadDeadline(time.Now().Add(time.Second))
		c.Read(buf)
	}
	add("write after close", err, true, false)
	return cases
}

// TestStoreErrorClassification holds refusedConn, silent and unanswered
// to what the store's errors say of it (see ServeElsewhere): wrapped as
// the Redis store wraps them ("statestore: redis: %w"), by bounded
// (stalledError), or bare.
func TestStoreErrorClassification(t *testing.T) {
	cases := realNetErrors(t)
	var wrapped []errorCase
	for _, c := range cases {
		wrapped = append(wrapped,
			errorCase{c.name + ", wrapped", fmt.Errorf("statestore: redis: %w", c.err), c.refused, c.silent, true},
			errorCase{c.name + ", stalled", &stalledError{fmt.Errorf("statestore: redis: %w", c.err)}, c.refused, c.silent, true})
	}
	cases = append(cases, wrapped...)
	cases = append(cases, []errorCase{
		{"context deadline", context.DeadlineExceeded, false, true, true},
		{"context deadline, stalled", &stalledError{context.DeadlineExceeded}, false, true, true},
		{"os deadline", fmt.Errorf("statestore: redis: %w", os.ErrDeadlineExceeded), false, true, true},
		{"bare ECONNREFUSED", syscall.ECONNREFUSED, true, false, true},
		{"bare ECONNRESET", syscall.ECONNRESET, true, false, true},
		{"EPIPE", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}, true, false, true},
		{"io.EOF", fmt.Errorf("statestore: redis: %w", io.EOF), true, false, true},
		{"io.ErrUnexpectedEOF", fmt.Errorf("statestore: redis: %w", io.ErrUnexpectedEOF), true, false, true},
		// The Redis store's mark of a deadline whose exchange met a
		// refusal or a drop (go-redis retried past it), or LOADING.
		{"deadline, dropped meanwhile", fmt.Errorf("%w (%w)", context.DeadlineExceeded, statestore.ErrDropped), true, true, true},
		{"loading", fmt.Errorf("statestore: redis: LOADING x (%w)", statestore.ErrDropped), true, false, true},
		// Neither refused nor silent: no hand-over, nothing noted.
		{"no route", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.EHOSTUNREACH)}, false, false, true},
		{"canceled", context.Canceled, false, false, true},
		{"breaker", errStoreDown, false, false, true},
		{"closed", statestore.ErrClosed, false, false, true},
		{"server error", errors.New("statestore: redis: ERR something"), false, false, true},
		// The store answered.
		{"nil", nil, false, false, false},
		{"fenced", statestore.ErrFenced, false, false, false},
		{"not found", fmt.Errorf("x: %w", statestore.ErrNotFound), false, false, false},
		{"store lost", statestore.ErrStoreLost, false, false, false},
		{"record lost", statestore.ErrRecordLost, false, false, false},
		{"too large", statestore.ErrTooLarge, false, false, false},
		{"held", statestore.ErrHeld, false, false, false},
		{"leased", statestore.ErrLeased, false, false, false},
		{"budget", statestore.ErrBudget, false, false, false},
	}...)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := refusedConn(c.err); got != c.refused {
				t.Errorf("refusedConn(%v) = %v; want %v", c.err, got, c.refused)
			}
			if got := c.err != nil && silent(c.err); got != c.silent {
				t.Errorf("silent(%v) = %v; want %v", c.err, got, c.silent)
			}
			if got := unanswered(c.err); got != c.unanswered {
				t.Errorf("unanswered(%v) = %v; want %v", c.err, got, c.unanswered)
			}
		})
	}
}

// TestStoreBookkeepingRefusedSinceAnswer holds refusedLately to its rule:
// a connection refused or dropped since this replica last read the
// store's epoch (or ever, before a first read) keeps sessions here; one
// before the last read does not. Times are since clockBase, as bounded
// and noteEpoch record them.
func TestStoreBookkeepingRefusedSinceAnswer(t *testing.T) {
	type event struct {
		at      time.Duration
		refused bool // a refusal noted at at; else an epoch read begun at at
		ok      bool // the read was answered
	}
	for _, c := range []struct {
		name   string
		events []event
		want   bool
	}{
		{"nothing", nil, false},
		{"read, never refused", []event{{at: 1, ok: true}}, false},
		{"refused before any read", []event{{at: 1, refused: true}}, true},
		{"refused, then a read unanswered", []event{{at: 1, refused: true}, {at: 2}}, true},
		{"read, then refused", []event{{at: 1, ok: true}, {at: 2, refused: true}}, true},
		{"read, refused, unanswered", []event{{at: 1, ok: true}, {at: 2, refused: true}, {at: 3}}, true},
		{"refused, then read", []event{{at: 1, refused: true}, {at: 2, ok: true}}, false},
		// A refusal noted while an answered read was in flight (the read
		// is dated when it began): which came first is unknown.
		{"refused as an answered read began", []event{{at: 2, refused: true}, {at: 2, ok: true}}, true},
		{"refused, read, refused again", []event{{at: 1, refused: true}, {at: 2, ok: true}, {at: 3, refused: true}}, true},
		{"refused, unanswered, read", []event{{at: 1, refused: true}, {at: 2}, {at: 3, ok: true}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := &Keeper{}
			for _, e := range c.events {
				if e.refused {
					d.refusedAt.Store(int64(e.at))
				} else if e.ok {
					d.epochAt.Store(int64(e.at))
				}
			}
			if got := d.refusedLately(); got != c.want {
				t.Errorf("refusedLately = %v; want %v", got, c.want)
			}
		})
	}
	// Through the store wrapper, which every exchange goes through: only
	// a refusal or a drop is noted, at the time it was seen; and through
	// noteEpoch, whose answered read clears it.
	st := &refusingStore{Store: statestore.NewMemory(), refuse: map[string]bool{}}
	d := New(Options{Store: st, Replica: "a"})
	ctx := context.Background()
	if _, err := d.noteEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{nil, context.DeadlineExceeded, statestore.ErrFenced, errors.New("ERR x")} {
		d.store.(bounded).ended(ctx, time.Now(), err)
		if d.refusedLately() {
			t.Fatalf("after %v: refusedLately", err)
		}
	}
	st.set(func(s *refusingStore) { s.refuse["Heartbeat"] = true })
	if err := d.store.Heartbeat(ctx, d.owner, time.Minute); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("refused heartbeat: %v", err)
	}
	if !d.refusedLately() {
		t.Fatal("after a refusal: not refusedLately")
	}
	if _, err := d.noteEpoch(ctx); err != nil {
		t.Fatal(err)
	}
	if d.refusedLately() {
		t.Fatal("the epoch read after the refusal: still refusedLately")
	}
}
