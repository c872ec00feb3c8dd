package sessions_test

import (
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// ClientNumber, which every tool call asks (the host's callEnv.bind), is
// answered while another holds the manager's lock, which every lease takes:
// with 64 sessions calling at once it was the host's most contended wait
// (issue 27, item 2). Its answers are still the live client's number, 0
// once the client ended, and a higher one for the key's next client.
func TestClientNumberTakesNoLock(t *testing.T) {
	w := newWorld(t, sessions.Options{})
	a, b := sessions.Client("a"), sessions.Client("b")
	for _, key := range []sessions.Key{a, b} {
		l, err := w.m.Acquire(w.ctx, key, w.plugin("counter"))
		if err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
	}
	number := func(key sessions.Key) uint64 {
		t.Helper()
		unlock := w.m.Lock()
		defer unlock()
		got := make(chan uint64, 1)
		go func() { got <- w.m.ClientNumber(key) }()
		select {
		case n := <-got:
			return n
		case <-time.After(10 * time.Second):
			t.Fatalf("ClientNumber(%s) waits for the manager's lock", key)
			return 0
		}
	}
	na, nb := number(a), number(b)
	if na == 0 || nb <= na {
		t.Fatalf("numbers a %d, b %d: want a > 0 and b > a", na, nb)
	}
	w.m.End(w.ctx, a)
	if n := number(a); n != 0 {
		t.Fatalf("a ended: number %d, want 0", n)
	}
	if n := number(sessions.Client("c")); n != 0 {
		t.Fatalf("c, never made: number %d, want 0", n)
	}
	l, err := w.m.Acquire(w.ctx, a, w.plugin("counter"))
	if err != nil {
		t.Fatal(err)
	}
	l.Done(nil)
	if n := number(a); n <= nb {
		t.Fatalf("a's next client: number %d, want above b's %d", n, nb)
	}
	if n := number(b); n != nb {
		t.Fatalf("b: number %d, want %d still", n, nb)
	}
}
