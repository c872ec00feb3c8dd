package durable

import (
	"context"
	"errors"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// An instance evicted for room whose restore cannot read the store (one
// read with no answer) keeps its saved state: Keeper.Saved says it could
// not ask, and the lease fails as retryable (sessions.ErrMoved, -32053),
// as Options.Stored's does; the retry, once the store answers, restores
// it. Before stop 57, Saved's (nil, "") for a read that failed started the
// plugin afresh, told "evicted", and its checkpoint wrote the fresh state
// over the saved one (a review's finding).
func TestEvictedRestoreWithLostReadKeepsState(t *testing.T) {
	w := newEvictingWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p) // 1
	w.callSaved(c, w.p) // 2
	w.callSaved(c, w.p) // 3, acknowledged, saved
	// Another client's instance evicts alice's p for room.
	lb, err := w.ses.Acquire(ctx, sessions.Client("bob"), w.q)
	if err != nil {
		t.Fatal(err)
	}
	lb.Done(nil)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("claim: %v %v", c2, err)
	}
	w.st.loseGet.Store(true) // Saved's read of the record gets no answer
	if l, err := w.ses.Acquire(ctx, w.key, w.p); !errors.Is(err, sessions.ErrMoved) {
		got, reset := "", (*sessions.Reset)(nil)
		if err == nil {
			got, reset = w.count(l), l.Notice().Reset
			l.Done(nil)
		}
		t.Fatalf("after one lost read, the lease: %v, count %s (reset %+v); want it refused as retryable (ErrMoved), not started afresh", err, got, reset)
	}
	// The retry, once the store answers, restores the saved 3.
	d.downUntil.Store(0)
	l, err := w.ses.Acquire(ctx, w.key, w.p)
	if err != nil {
		t.Fatal(err)
	}
	got, reset := w.count(l), l.Notice().Reset
	if why, err := d.AfterCall(ctx, w.key, c2, l, nil); err != nil || why != "" {
		t.Fatalf("checkpoint: %q %v", why, err)
	}
	l.Done(nil)
	if got != "4" || reset != nil {
		t.Fatalf("the retry counts %s (reset %+v), want 4 and no reset", got, reset)
	}
}

// newEvictingWorld is newLossyWorld with room for one instance, and
// Saved and Stored wired as the host wires them: a second client's
// instance evicts the first's.
func newEvictingWorld(t *testing.T) *lossyWorld {
	w := newLossyWorld(t)
	w.ses = sessions.New(&sessions.Options{
		MaxInstances: 1,
		Saved: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool) {
			return w.d.Saved(ctx, key, p)
		},
		Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
			return w.d.Stored(ctx, key, p)
		},
	})
	t.Cleanup(func() { w.ses.Close(w.ctx) })
	w.d = New(Options{Store: w.st, Sessions: w.ses, Replica: "a"})
	return w
}

// A plugin whose last state was not saved (the store did not answer its
// checkpoint) and whose instance was then evicted has lost that state:
// this replica says so at its next use (Saved: stateReset not-saved). Once
// the store answers again, the heartbeat's resave, and a drain, write that
// into the record too, so that a replica taking the session over says it
// as well, rather than restoring the older state the record holds without
// a word (a review's question, confirmed here: count 4 was answered, not
// saved, and replica b answered 4 again).
func TestEvictedUnsavedStateLostElsewhereToo(t *testing.T) {
	for _, how := range []string{"resave", "drain", "here"} {
		t.Run(how, func(t *testing.T) {
			w := newEvictingWorld(t)
			d, ctx := w.d, w.ctx
			c := w.claim()
			// 4 is answered, its write gets no answer, and p is evicted.
			unsavedThenEvictedBy(t, w, c, func() { w.st.losePut.Store(true) })
			switch how {
			case "resave":
				d.renewAll([]*claimOf{{w.key, c}})
			case "drain":
				if err := d.Drain(ctx); err != nil {
					t.Fatal(err)
				}
			case "here":
				// Recorded lost, the plugin is said reset here as well.
				d.renewAll([]*claimOf{{w.key, c}})
				l := w.acquire(w.p)
				defer l.Done(nil)
				if got, reset := w.count(l), l.Notice().Reset; got != "1" || reset == nil || reset.Reason != ReasonNotSaved {
					t.Fatalf("replica a after the resave counts %s (reset %+v); want 1, reset not-saved", got, reset)
				}
				return
			}
			// Replica b takes the session over from the store.
			ses := sessions.New(nil)
			t.Cleanup(func() { ses.Close(ctx) })
			b := New(Options{Store: w.st.Store, Sessions: ses, Replica: "b"})
			if _, err := b.BeforeCall(ctx, w.key); err != nil {
				t.Fatal(err)
			}
			lb, err := ses.Acquire(ctx, w.key, w.p)
			if err != nil {
				t.Fatal(err)
			}
			defer lb.Done(nil)
			got, reset := w.count(lb), lb.Notice().Reset
			if reset == nil || got != "1" {
				t.Fatalf("replica b counts %s (reset %+v); want 1, and its state said to be reset: 4 was answered and lost", got, reset)
			}
			if reset.Reason != ReasonNotSaved {
				t.Errorf("replica b's reset reason %q, want %q", reset.Reason, ReasonNotSaved)
			}
		})
	}
}
