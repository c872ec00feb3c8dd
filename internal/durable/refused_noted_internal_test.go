package durable

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// refusingStore refuses the connection of each exchange named in refuse
// (its process down), answers Epoch with silence while epochSilent, and
// Get with silence while getSilent. With gets set, each Get, once
// answered, sends gets a channel and returns only once that is closed
// (or stop is): the heartbeat's round cannot end, nor the next begin,
// before the test has looked and made its change, however late the
// test runs.
type refusingStore struct {
	statestore.Store
	mu          sync.Mutex
	refuse      map[string]bool
	epochSilent bool
	getSilent   bool
	gets        chan chan struct{}
	stop        chan struct{}
}

var errRefusedConn = fmt.Errorf("statestore: redis: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})

// fault is what the store does to exchange op: refuse it, answer nothing
// (a timeout), or nil to pass it on.
func (s *refusingStore) fault(op string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.refuse[op]:
		return errRefusedConn
	case op == "Epoch" && s.epochSilent, op == "Get" && s.getSilent:
		return context.DeadlineExceeded
	}
	return nil
}

func (s *refusingStore) set(f func(s *refusingStore)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *refusingStore) Heartbeat(ctx context.Context, o statestore.Owner, ttl time.Duration) error {
	if err := s.fault("Heartbeat"); err != nil {
		return err
	}
	return s.Store.Heartbeat(ctx, o, ttl)
}

func (s *refusingStore) Leave(ctx context.Context, o statestore.Owner) error {
	if err := s.fault("Leave"); err != nil {
		return err
	}
	return s.Store.Leave(ctx, o)
}

func (s *refusingStore) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	if err := s.fault("Claim"); err != nil {
		return statestore.Claim{}, err
	}
	return s.Store.Claim(ctx, id, o, ttl, steal)
}

func (s *refusingStore) Get(ctx context.Context, id string) (map[string][]byte, error) {
	if s.gets != nil {
		defer func() {
			resume := make(chan struct{})
			select {
			case s.gets <- resume:
				select {
				case <-resume:
				case <-s.stop:
				}
			case <-s.stop:
			}
		}()
	}
	if err := s.fault("Get"); err != nil {
		return nil, err
	}
	return s.Store.Get(ctx, id)
}

func (s *refusingStore) Release(ctx context.Context, id string, fence uint64) error {
	if err := s.fault("Release"); err != nil {
		return err
	}
	return s.Store.Release(ctx, id, fence)
}

func (s *refusingStore) Epoch(ctx context.Context, seen uint32, window time.Duration) (uint32, statestore.Loss, error) {
	if err := s.fault("Epoch"); err != nil {
		return 0, statestore.Loss{}, err
	}
	return s.Store.Epoch(ctx, seen, window)
}

// TestRefusalNotedByEveryExchange: a connection the store refuses keeps
// a cut-off replica's sessions here (refusedLately: the store's process
// went down, and may come back empty) whichever exchange of the keeper
// met it, not only the heartbeat's own and the calls' (observe): a
// session's end (Ended's claim, its release), a read of a session's
// record (ReadSession), the heartbeat's epoch and its key check, a
// drain's leave. Fails: none of them noted the refusal.
func TestRefusalNotedByEveryExchange(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		refuse []string
		do     func(d *Keeper)
	}{
		{"Ended's claim", []string{"Claim"}, func(d *Keeper) { d.Ended(sessions.Client("alice")) }},
		{"Ended's release", []string{"Release"}, func(d *Keeper) { d.Ended(sessions.Client("alice")) }},
		{"ReadSession", []string{"Get"}, func(d *Keeper) { d.ReadSession(ctx, "s1") }},
		{"the heartbeat's epoch", []string{"Epoch"}, func(d *Keeper) { d.noteEpoch(ctx) }},
		{"the key check", []string{"Get"}, func(d *Keeper) { d.checkKey(ctx) }},
		{"a drain's leave", []string{"Leave"}, func(d *Keeper) { d.Drain(ctx) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := &refusingStore{Store: statestore.NewMemory(), refuse: map[string]bool{}}
			ses := sessions.New(&sessions.Options{})
			t.Cleanup(func() { ses.Close(ctx) })
			d := New(Options{Store: st, Sessions: ses, Replica: "a"})
			if d.refusedLately() {
				t.Fatal("refusedLately before any refusal")
			}
			for _, op := range c.refuse {
				st.refuse[op] = true
			}
			c.do(d)
			if !d.refusedLately() {
				t.Errorf("the store refused %v: not refusedLately", c.refuse)
			}
		})
	}
}

// TestRefusedLatelyClearedOnlyOnceEpochSeen: a refusal is forgotten only
// once this replica has read the store's epoch since: a store that
// refused may have come back empty, which only its epoch tells, and the
// hand-over trusts a claim of the epoch as last seen. A round whose
// heartbeat the store answered but whose epoch read met silence (the
// link cut between the two) clears nothing; the next round, whose epoch
// is read, does. Fails: the heartbeat's answer cleared it.
//
// Each round's key check (its Get silent, so asked again each round, once,
// after the round's heartbeat and epoch) holds the round until the test
// has looked: the rounds are the first and second whatever the scheduling.
func TestRefusedLatelyClearedOnlyOnceEpochSeen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	st := &refusingStore{Store: statestore.NewMemory(), refuse: map[string]bool{"Heartbeat": true}, epochSilent: true, getSilent: true, gets: make(chan chan struct{}), stop: make(chan struct{})}
	ses := sessions.New(&sessions.Options{})
	t.Cleanup(func() { ses.Close(context.Background()) })
	d := New(Options{Store: st, Sessions: ses, Replica: "a"})
	// A call's exchange meets the store refusing; it is back.
	d.observe(d.store.Heartbeat(ctx, d.owner, heartbeatTTL))
	if !d.refusedLately() {
		t.Fatal("a refused exchange not noted")
	}
	st.set(func(s *refusingStore) { s.refuse = nil })
	d.downUntil.Store(0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.Heartbeat(ctx)
	}()
	t.Cleanup(func() { close(st.stop); cancel(); <-done })
	// round waits for a round's key check, which waits for the test to
	// close what round returns.
	round := func() chan struct{} {
		t.Helper()
		select {
		case resume := <-st.gets:
			return resume
		case <-time.After(30 * time.Second):
			t.Fatal("no heartbeat round")
			return nil
		}
	}
	resume := round()
	if !d.refusedLately() {
		t.Error("a round answered but its epoch unread cleared the refusal")
	}
	st.set(func(s *refusingStore) { s.epochSilent = false })
	close(resume)
	round()
	if d.refusedLately() {
		t.Error("a round that read the store's epoch left the refusal")
	}
}
