package durable

import (
	"context"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// TestClientEndedHereComesBackSeeded: the session layer ends alice's
// client (its idle timeout, or evicted past MaxClients: sessions.Manager
// tells the keeper nothing), and her next request comes before the
// heartbeat's sweep forgets the claim. The claim, verified under the same
// fence, seeded nothing, so her new client's instance started afresh
// under fence 0, whose checkpoint is refused as stale; the instance was
// then dropped as moved, and every later lease failed with ErrMoved (the
// store's state is read under the claim's fence, not the new client's):
// the sweep keeps the claim of a live client, so the session stayed
// refused (-32053) until the new client ended too. Now a claim whose
// client is not seeded under it any more seeds it again from the record.
func TestClientEndedHereComesBackSeeded(t *testing.T) {
	w := newLossyWorld(t)
	c := w.claim()
	w.callSaved(c, w.p)
	w.callSaved(c, w.p) // p: 2, saved
	w.ses.End(w.ctx, w.key)
	if got := w.d.CheckLater(w.key); got != nil {
		t.Errorf("CheckLater after the client ended here: a claim, want none (its next call is claimed first)")
	}
	for attempt := 1; ; attempt++ {
		c = w.claim()
		l, err := w.ses.Acquire(w.ctx, w.key, w.p)
		if err != nil {
			t.Fatalf("attempt %d: acquire: %v", attempt, err)
		}
		got, reset := w.count(l), l.Notice().Reset
		why, err := w.d.AfterCall(w.ctx, w.key, c, l, nil)
		if err != nil {
			l.Done(sessions.ErrMoved) // as the host does
			t.Errorf("attempt %d: count %s, checkpoint %q: %v", attempt, got, why, err)
			if attempt < 3 {
				continue
			}
			return
		}
		l.Done(nil)
		if got != "3" || reset != nil {
			t.Errorf("attempt %d: count %s, reset %+v; want 3, no reset (the state saved before the client ended here)", attempt, got, reset)
		}
		return
	}
}

// TestClientEndedHereUnderDrainSaysReset: under --checkpoint drain a
// replica takes alice's session over (count 2 in the record, from
// another replica's checkpoint) and serves two calls that are in its
// memory only (count 4). The session layer ends her client here, and her
// next request comes before the sweep: reseed seeds the new client from
// the record, count 2, and her next call says 3 with no notice, her two
// acknowledged calls rolled back silently. Under this policy the record
// is no newer than the last drain: the plugins start afresh and say so,
// as an eviction does (Keeper.Saved).
func TestClientEndedHereUnderDrainSaysReset(t *testing.T) {
	w := newLossyWorld(t)
	c := w.claim()
	w.callSaved(c, w.p)
	w.callSaved(c, w.p) // p: 2, saved by replica a
	var b *Keeper
	bSes := sessions.New(&sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		return b.Stored(ctx, key, p)
	}})
	t.Cleanup(func() { bSes.Close(w.ctx) })
	b = New(Options{Store: w.st, Sessions: bSes, Replica: "b", Checkpoint: CheckpointOnDrain})
	call := func() (string, *sessions.Reset) {
		t.Helper()
		if _, err := b.BeforeCall(w.ctx, w.key); err != nil {
			t.Fatalf("claim at b: %v", err)
		}
		l, err := bSes.Acquire(w.ctx, w.key, w.p)
		if err != nil {
			t.Fatal(err)
		}
		got, reset := w.count(l), l.Notice().Reset
		if _, err := b.AfterCall(w.ctx, w.key, nil, l, nil); err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
		return got, reset
	}
	call()
	if got, _ := call(); got != "4" {
		t.Fatalf("count at b %s, want 4", got)
	}
	bSes.End(w.ctx, w.key)
	if got, reset := call(); reset == nil {
		t.Errorf("after the client ended here: count %s with no reset; want a reset said (count 4 was acknowledged and is gone)", got)
	}
}

// TestClientEndedHereKeepsUnsavedResults: a call served from memory while
// the store was away (its result kept for its at-most-once key, its
// state marked not saved), then alice's client ended here, and her next
// request came before the sweep. reseed read the record, and its
// plugin's results (none kept) took the place of the claim's: the
// unsaved call's result was gone, so her retry with the same key, its
// first answer lost, ran the call a second time.
func TestClientEndedHereKeepsUnsavedResults(t *testing.T) {
	w := newLossyWorld(t)
	c := w.claim()
	w.callSaved(c, w.p) // p: 1, saved
	l := w.acquire(w.p)
	w.count(l)
	w.d.ServedFromMemory(w.key, c, w.p.Name(), &Once{Key: "k1", Result: []byte(`{"content":[]}`)})
	l.Done(nil)
	w.ses.End(w.ctx, w.key)
	c = w.claim()
	if got := w.d.Replay(c, "k1"); got == nil {
		t.Errorf("after the client ended here and came back: no result kept for the call served from memory (its retry runs it again)")
	}
}
