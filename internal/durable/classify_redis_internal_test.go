package durable

import (
	"cmp"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// front is a TCP relay between a Redis store and redis-server that plays
// the store's faults to the client: it forwards, or (mode) swallows what
// either side sends (a frozen store, a link blackholed: connections stay
// open and new ones are accepted), resets a connection the client sends
// on, or answers every command -LOADING (a Redis restarted, loading its
// data).
type front struct {
	t      *testing.T
	ln     net.Listener
	target string
	mode   atomic.Int32
	mu     sync.Mutex
	conns  map[net.Conn]bool
}

const (
	frontPass int32 = iota
	frontSilent
	frontReset
	frontLoading
)

func newFront(t *testing.T, target string) *front {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front{t: t, ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { f.stop(); f.closeAll() })
	go f.accept()
	return f
}

func (f *front) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", f.target)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns[c], f.conns[u] = true, true
		f.mu.Unlock()
		go f.up(c, u)
		go f.down(c, u)
	}
}

// up forwards what the client sends, as the mode says.
func (f *front) up(c, u net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if err != nil {
			u.Close()
			return
		}
		switch f.mode.Load() {
		case frontPass:
			u.Write(buf[:n])
		case frontReset:
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			u.Close()
			return
		case frontLoading:
			// One command a read: go-redis writes each whole.
			c.Write([]byte("-LOADING Redis is loading the dataset in memory\r\n"))
		}
	}
}

// down forwards what redis-server answers while the mode is frontPass.
func (f *front) down(c, u net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := u.Read(buf)
		if err != nil {
			c.Close()
			return
		}
		if f.mode.Load() == frontPass {
			c.Write(buf[:n])
		}
	}
}

// stop stops listening: dials are refused.
func (f *front) stop() { f.ln.Close() }

// closeAll closes every connection, the client's ends with a FIN.
func (f *front) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		c.Close()
		delete(f.conns, c)
	}
}

// TestRedisFaultsClassified holds the classification (refusedConn,
// silent) to what the Redis store really returns, through bounded, as
// ServeElsewhere's probe meets it: go-redis retries a command once after
// a network error (MaxRetries 1), dials up to five times before it gives
// up, and checks a pooled connection before it uses it, so what a fault
// leaves of the errors met is the last attempt's. A store that went down
// (its port refusing, its connections dropped or reset) or is restarting
// (LOADING) must be noted refused, so that no session is handed over
// until it answers again; one that is silent (frozen, blackholed) may
// hand over.
func TestRedisFaultsClassified(t *testing.T) {
	if _, ok := proxytest.Find("redis-server"); !ok {
		t.Skip("no redis-server")
	}
	addr := proxytest.StartRedis(t)
	for _, c := range []struct {
		name    string
		fault   func(*front)
		refused bool          // noted refused; else silent
		bound   time.Duration // bounded's, DefaultStoreTimeout if 0
	}{
		{"down", func(f *front) { f.stop(); f.closeAll() }, true, 0},
		// go-redis dials five times, 100 ms apart, and then once more
		// (MaxRetries): a shorter bound (or a busy machine) ends the
		// exchange first, and its error is the deadline's.
		{"down, short bound", func(f *front) { f.stop(); f.closeAll() }, true, 300 * time.Millisecond},
		{"frozen", func(f *front) { f.mode.Store(frontSilent) }, false, 0},
		{"reset mid-command", func(f *front) { f.mode.Store(frontReset) }, true, 0},
		{"loading", func(f *front) { f.mode.Store(frontLoading) }, true, 0},
		// Its connections closed (a Redis host shutting down), then
		// nothing answers (the host down): a drop this replica met.
		{"dropped, then silent", func(f *front) { f.mode.Store(frontSilent); f.closeAll() }, true, 0},
	} {
		for _, detached := range []bool{false, true} {
			name := c.name
			if detached {
				name += ", detached"
			}
			t.Run(name, func(t *testing.T) {
				f := newFront(t, addr)
				r, err := statestore.NewRedis("redis://" + f.ln.Addr().String() + "/0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { r.Close() })
				d := &Keeper{}
				d.epochAt.Store(1)
				st := bounded{Store: r, d: cmp.Or(c.bound, DefaultStoreTimeout), refusedAt: &d.refusedAt}
				ctx := context.Background()
				if detached {
					ctx = statestore.Detach(ctx)
				}
				owner := statestore.Owner{Replica: "a", Boot: "b"}
				// A connection pooled, past bounded: only the client's own
				// bounds, not the case's (300 ms), for the first dial and
				// script load of a machine under load.
				if err := r.Heartbeat(ctx, owner, time.Minute); err != nil {
					t.Fatal(err)
				}
				c.fault(f)
				// An exchange the machine stalled past its bound before it
				// met the fault (a busy machine under -race: the bound is
				// 300 ms in one case) met nothing, and is rightly not noted:
				// a fault that must be noted is met again, a few times. A
				// fault never noted fails each.
				for try := 1; ; try++ {
					err = st.Heartbeat(ctx, owner, time.Minute)
					if err == nil {
						t.Fatal("answered")
					}
					if !c.refused || d.refusedLately() || try == 5 {
						break
					}
					t.Logf("try %d: %v: not noted refused; again", try, err)
				}
				if got := d.refusedLately(); got != c.refused {
					t.Errorf("%v: noted refused %v; want %v", err, got, c.refused)
				}
				if !c.refused && !silent(err) {
					t.Errorf("%v: not silent", err)
				}
				t.Logf("%v (%T)", err, err)
			})
		}
	}
}
