package durable

import (
	"context"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// A checkpoint that writes a state whole reserves its base field at 0
// bytes (reserve(…, 0)) before the write; the base written after it is
// then skipped by putLocked when it is byte for byte the base the claim
// last wrote (c.saved), so it is never reserved again: the byte budget
// counts 0 bytes for a base the store holds. (Here: a split write gets no
// answer, the claim forgets its base, and the next checkpoint of the
// same state writes it whole and the same base.)
func TestBudgetCountsSkippedBase(t *testing.T) {
	w := newNotesWorld(t)
	budget := &recordBudget{limit: 1 << 30, fields: map[string]int{}}
	var d *Keeper
	ses := sessions.New(&sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		return d.Stored(ctx, key, p)
	}})
	t.Cleanup(func() { ses.Close(w.ctx) })
	d = New(Options{Store: w.st, Sessions: ses, Replica: "a", Reserve: budget.reserve})
	w.aSes, w.a = ses, d
	for range 5 {
		w.add()
	}
	// A checkpoint of the instance as it is (no call in between: the
	// same state, the same frames).
	again := func() NotSaved {
		t.Helper()
		c, err := d.BeforeCall(w.ctx, w.key)
		if err != nil || c == nil {
			t.Fatalf("claim: %v %v", c, err)
		}
		l, err := ses.Acquire(w.ctx, w.key, w.p)
		if err != nil {
			t.Fatal(err)
		}
		why, _ := d.AfterCall(w.ctx, w.key, c, l, nil)
		l.Done(nil)
		d.downUntil.Store(0)
		return why
	}
	check := func(when string) {
		t.Helper()
		rec := w.record()
		budget.mu.Lock()
		counted := budget.fields["b/notes"]
		budget.mu.Unlock()
		if counted != len(rec["b/notes"]) {
			t.Fatalf("%s: the budget counts %d bytes for b/notes, the store holds %d", when, counted, len(rec["b/notes"]))
		}
	}
	// A call whose split write gets no answer: the claim forgets its
	// base.
	w.notes++
	w.st.losePut.Store(true)
	if _, why := w.call(ses, d, "note_add", `{"text":"lost"}`); why != NotSavedUnavailable {
		t.Fatalf("lost write: %q", why)
	}
	w.notes-- // its note is in the instance, but not acknowledged as saved
	d.downUntil.Store(0)
	// The same state, written whole, then its base X: counted.
	if why := again(); why != "" {
		t.Fatalf("whole: %q", why)
	}
	check("after the base was written")
	// The same state again: split against X, and the write gets no
	// answer: the claim forgets X.
	w.st.losePut.Store(true)
	if why := again(); why != NotSavedUnavailable {
		t.Fatalf("lost split write: %q", why)
	}
	// The same state once more: written whole, and the same base X,
	// which putLocked skips (c.saved): reserved at 0 bytes.
	if why := again(); why != "" {
		t.Fatalf("whole again: %q", why)
	}
	if _, err := readPlugin(w.record(), "notes"); err != nil {
		t.Fatal(err)
	}
	check("after the same base was written again")
}

// The same undercount when the base written after a state whole gets no
// answer: the base field was reserved at 0 before the state's write (its
// undo only runs when the state's write fails), the base's own
// reservation is undone, and the budget counts 0 bytes while the store
// still holds the old base (or the new one, should it land).
func TestBudgetCountsLostBase(t *testing.T) {
	w := newNotesWorld(t)
	budget := &recordBudget{limit: 1 << 30, fields: map[string]int{}}
	var d *Keeper
	ses := sessions.New(&sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		return d.Stored(ctx, key, p)
	}})
	t.Cleanup(func() { ses.Close(w.ctx) })
	d = New(Options{Store: w.st, Sessions: ses, Replica: "a", Reserve: budget.reserve})
	w.aSes, w.a = ses, d
	for range 5 {
		w.add()
	}
	// The next checkpoint writes the state whole (as after any write
	// that got no answer), and its base's write gets no answer.
	c := d.claims[w.key]
	c.mu.Lock()
	delete(c.bases, "notes")
	c.mu.Unlock()
	w.st.loseNth.Store(2)
	w.add() // the state whole is saved
	d.downUntil.Store(0)
	rec := w.record()
	if _, err := readPlugin(rec, "notes"); err != nil {
		t.Fatal(err)
	}
	budget.mu.Lock()
	counted := budget.fields["b/notes"]
	budget.mu.Unlock()
	// The base written may have landed, or not: the larger of the two
	// is counted, never less than the store holds.
	if counted < len(rec["b/notes"]) {
		t.Fatalf("the budget counts %d bytes for b/notes, the store holds %d", counted, len(rec["b/notes"]))
	}
}
