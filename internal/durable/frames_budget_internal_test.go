package durable

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A base written again byte for byte (a write skipped as unchanged, after
// the state was written whole) is counted again against the byte budgets:
// the state's whole write reserved the base at 0. (It stayed at 0 while
// the store held it. Here a split write gets no answer, the claim forgets
// its base, and the next checkpoint of the same state writes it whole and
// the same base.)
func TestBudgetCountsSkippedBase(t *testing.T) {
	w := newNotesWorld(t)
	budget := w.budgeted(1 << 30)
	ses, d := w.aSes, w.a
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

// A base whose write gets no answer is counted as the larger of the old
// base and the new, either of which the store may hold. (Its reservation
// was undone to 0, while the store held the old base or the new one.)
func TestBudgetCountsLostBase(t *testing.T) {
	w := newNotesWorld(t)
	budget := w.budgeted(1 << 30)
	d := w.a
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

// A replica that takes a session over counts against the record's byte
// budget what the record holds, not only what it writes itself: each
// replica counts in its own memory (the host's storeBudget), and a field
// another replica wrote that this one does not write again (another
// plugin's state, a base) went uncounted, so that with N replicas taking
// a session in turn its record could hold N times its budget.
func TestTakeoverCountsStoredRecord(t *testing.T) {
	w := newNotesWorld(t)
	w.budgeted(1 << 30)
	for range 10 {
		w.add()
	}
	// The session uses a second plugin at a (the notes example again,
	// under another name), which b is not asked for.
	notes := w.p
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(w.ctx) })
	other, err := plugins.Load(w.ctx, rt, "memo.wasm", testplugins.Bytes(t, testplugins.Example(t, "notes")), plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(w.ctx) })
	w.p = other
	if _, why := w.call(w.aSes, w.a, "note_add", fmt.Sprintf(`{"text":%q}`, strings.Repeat("m", 4000))); why != "" {
		t.Fatalf("memo at a: not saved: %q", why)
	}
	w.p = notes
	b := &recordBudget{limit: 1 << 30, fields: map[string]int{}}
	ses, d := w.replicaWith(Options{Replica: "b", Reserve: b.reserve, Count: b.count})
	if _, why := w.call(ses, d, "note_list", `{}`); why != "" {
		t.Fatalf("b: not saved: %q", why)
	}
	rec := w.record()
	if len(rec["p/memo"]) == 0 {
		t.Fatalf("the record holds no memo state: %v", slices.Collect(maps.Keys(rec)))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for f, v := range rec {
		if b.fields[f] != len(v) {
			t.Errorf("b counts %d bytes of field %q; the record holds %d", b.fields[f], f, len(v))
		}
	}
}
