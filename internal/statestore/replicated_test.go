package statestore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// openURL opens a Redis store at url for t, with no lease (as backends').
func openURL(t *testing.T, url string) *statestore.Redis {
	t.Helper()
	s, err := statestore.NewRedis(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetLease(0)
	return s
}

// TestWaitNotReplicated: with wait_replicas=1 and its one replica stopped
// (SIGSTOP: connected, acknowledging nothing), every exchange that writes
// fails with ErrNotReplicated once WAIT's bound passes, and not for want
// of an answer: under a 1 s deadline (internal/durable's default bound)
// and the default wait_timeout, WAIT is given 2/3 of what the deadline
// leaves, and answers before it. The replica continued, writes are
// acknowledged again.
func TestWaitNotReplicated(t *testing.T) {
	primary := proxytest.StartRedis(t)
	_, replica := proxytest.StartRedisReplica(t, primary)
	s := openURL(t, "redis://"+primary+"/0?wait_replicas=1")
	bg := context.Background()
	c, err := s.Claim(bg, "w", ownerA, time.Minute, false)
	must(t, err)
	must(t, s.Put(bg, "w", "f", []byte("v1"), c.Fence, time.Minute))
	must(t, s.Heartbeat(bg, ownerA, time.Minute))

	must(t, replica.Signal(syscall.SIGSTOP))
	big := bytes.Repeat([]byte("x"), 64<<10) // out of line: staged beside the script
	for _, op := range []struct {
		name string
		f    func(ctx context.Context) error
	}{
		{"heartbeat", func(ctx context.Context) error { return s.Heartbeat(ctx, ownerA, time.Minute) }},
		{"leave", func(ctx context.Context) error { return s.Leave(ctx, ownerA) }},
		{"put", func(ctx context.Context) error { return s.Put(ctx, "w", "f", []byte("v2"), c.Fence, time.Minute) }},
		{"put out of line", func(ctx context.Context) error { return s.Put(ctx, "w", "g", big, c.Fence, time.Minute) }},
		{"renew", func(ctx context.Context) error {
			_, err := s.Renew(ctx, "w", c.Fence, time.Minute, false)
			return err
		}},
		{"release", func(ctx context.Context) error { return s.Release(ctx, "w", c.Fence) }},
		{"delete", func(ctx context.Context) error { return s.Delete(ctx, "w", c.Fence) }},
		{"claim", func(ctx context.Context) error {
			_, err := s.Claim(ctx, "w", ownerB, time.Minute, true)
			return err
		}},
	} {
		ctx, cancel := context.WithTimeout(bg, time.Second)
		begun := time.Now()
		err := op.f(ctx)
		took := time.Since(begun)
		cancel()
		if !errors.Is(err, statestore.ErrNotReplicated) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, statestore.ErrDropped) {
			t.Errorf("%s with the replica stopped: %v, want ErrNotReplicated, answered", op.name, err)
		}
		t.Logf("%s: %v in %v", op.name, err, took)
		if took > 5*time.Second {
			t.Errorf("%s took %v", op.name, took)
		}
	}

	must(t, replica.Signal(syscall.SIGCONT))
	ctx, cancel := context.WithTimeout(bg, 5*time.Second)
	defer cancel()
	must(t, s.Heartbeat(ctx, ownerA, time.Minute))
}

// TestSentinelFailoverKeepsAcknowledged: a store found through Sentinel
// with wait_replicas=1 writes under WAIT; its primary is killed (-9), and
// Sentinel promotes the replica. The store reaches the new primary, which
// holds every write the store acknowledged, under the same epoch; with
// no replica left, a write is not acknowledged (ErrNotReplicated); with a
// new one, a claim gets a higher fence than any acknowledged before, and
// a write under an old fence is fenced.
func TestSentinelFailoverKeepsAcknowledged(t *testing.T) {
	primary := proxytest.FreeAddr(t)
	pp := proxytest.StartRedisAt(t, primary)
	replica, _ := proxytest.StartRedisReplica(t, primary)
	sentinel, _ := proxytest.StartSentinel(t, "wt", primary, 1)
	s := openURL(t, "redis://"+sentinel+"/0?master_name=wt&wait_replicas=1")
	bg := context.Background()
	epoch, _, err := s.Epoch(bg, 0, time.Minute)
	must(t, err)

	const n = 10
	fences := map[string]uint64{}
	values := map[string][]byte{}
	for i := range n {
		id := fmt.Sprintf("fo%d", i)
		c, err := s.Claim(bg, id, ownerA, time.Minute, false)
		must(t, err)
		f := c.Fence
		if i%2 == 1 { // a fence bump, acknowledged
			f, err = s.Renew(bg, id, f, time.Minute, true)
			must(t, err)
		}
		v := []byte(fmt.Sprintf("value %d", i))
		if i%3 == 0 {
			v = bytes.Repeat(v, 4<<10) // out of line
		}
		must(t, s.Put(bg, id, "f", v, f, time.Minute))
		fences[id], values[id] = f, v
	}

	must(t, pp.Signal(syscall.SIGKILL))
	<-pp.Done()
	proxytest.WaitSentinelMaster(t, sentinel, "wt", replica, 30*time.Second)

	// The store's connections to the old primary fail; it dials the new
	// one, which Sentinel names now.
	reached := time.NewTimer(20 * time.Second)
	defer reached.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ctx, cancel := context.WithTimeout(bg, time.Second)
		_, err := s.Get(ctx, "fo0")
		cancel()
		if err == nil {
			break
		}
		select {
		case <-tick.C:
		case <-reached.C:
			t.Fatalf("the store did not reach the new primary %s: %v", replica, err)
		}
	}
	for id, v := range values {
		got, err := s.Get(bg, id)
		must(t, err)
		if !bytes.Equal(got["f"], v) {
			t.Errorf("%s after the failover: %d bytes, want the %d acknowledged", id, len(got["f"]), len(v))
		}
	}
	if err := s.Heartbeat(bg, ownerA, time.Minute); !errors.Is(err, statestore.ErrNotReplicated) {
		t.Errorf("a write with no replica left: %v, want ErrNotReplicated", err)
	}

	proxytest.StartRedisReplica(t, replica)
	e, lost, err := s.Epoch(bg, epoch, time.Minute)
	must(t, err)
	if e != epoch || lost.Recorded {
		t.Errorf("epoch after the failover %d (lost %v), want %d", e, lost, epoch)
	}
	for id, f := range fences {
		c, err := s.Claim(bg, id, ownerB, time.Minute, true)
		must(t, err)
		if c.Fence <= f {
			t.Errorf("%s: claim after the failover got fence %#x, not above the acknowledged %#x", id, c.Fence, f)
		}
		wantErr(t, id+": write under the old fence", s.Put(bg, id, "f", []byte("stale"), f, time.Minute), statestore.ErrFenced)
	}
}
