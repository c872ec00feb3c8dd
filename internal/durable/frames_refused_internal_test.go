package durable

import (
	"fmt"
	"strings"
	"testing"
)

// A split write refused by the byte budgets is written whole, though an
// earlier write of another field got no answer (the claim is dirty): the
// refusal left the store as it was. (The retry asked for a claim that was
// not dirty, and the call was not saved though its state fit whole.)
func TestRefusedSplitRetriedWholeWhileDirty(t *testing.T) {
	w, budget, d, _ := budgetWorld(t)
	rec := w.record()
	pr, err := readPlugin(rec, "notes")
	if err != nil {
		t.Fatal(err)
	}
	others := otherFields(rec)
	// A write of another field (the session's grant answers) gets no
	// answer: the claim is dirty until its next write that is sent.
	c := d.claims[w.key]
	c.mu.Lock()
	w.st.losePut.Store(true)
	gerr := d.putLocked(w.ctx, c, "grants", []byte(`{"x":1}`))
	c.mu.Unlock()
	d.downUntil.Store(0)
	if gerr == nil {
		t.Fatal("the grants write was not lost")
	}
	budget.mu.Lock()
	// Room for the state whole, and 4 KiB more for it to grow by (a
	// split state is refused: its own frames beside the whole base).
	budget.limit = others + len(pr.Data) + 4<<10
	limit := budget.limit
	budget.mu.Unlock()
	var failed []string
	for k := range 3 {
		why := w.addLong()
		r := w.record()
		t.Logf("call %d: why %q p/notes v%d %d bytes, b/notes %d", k+1, why, r["p/notes"][4], len(r["p/notes"]), len(r["b/notes"]))
		if why == "" {
			continue
		}
		whole := w.wholeBytes()
		if others+whole > limit {
			t.Skipf("call %d: the state grew past the budget (%d bytes whole)", k+1, whole)
		}
		c.mu.Lock()
		dirty := c.dirty
		c.mu.Unlock()
		failed = append(failed, fmt.Sprintf("call %d: not saved (%q), though the state whole (%d bytes) and the other fields (%d) fit the budget of %d (claim dirty: %v)",
			k+1, why, whole, others, limit, dirty))
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 3 calls not saved:\n%s", len(failed), strings.Join(failed, "\n"))
	}
}

// When the new base does not fit beside the state written whole and the
// empty base written instead gets no answer, the budgets count what the
// store may hold, the old base. (They counted nothing: the old base was
// reserved at 0 while the state was written whole.)
func TestBudgetCountsBaseAfterLostFallback(t *testing.T) {
	w, budget, d, _ := budgetWorld(t)
	base := w.wholeNext(budget)
	// Puts: 1 the state whole (answered); the new base is refused by the
	// budget before it is sent; 2 the empty base gets no answer.
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
	if counted < len(rec["b/notes"]) {
		t.Fatalf("the budget counts %d bytes for b/notes, the store holds %d (the old base was %d)", counted, len(rec["b/notes"]), base)
	}
}
