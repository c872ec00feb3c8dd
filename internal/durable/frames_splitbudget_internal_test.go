package durable

import (
	"fmt"
	"strings"
	"testing"
)

// A state that fits its record's byte budget whole is saved when the claim
// knows a base and its split form, its own frames beside the base, does
// not fit: a split the budgets refuse is written whole instead. (It was
// refused at every checkpoint until its own frames passed half the base.)
func TestSplitStateFitsItsBudgetSplit(t *testing.T) {
	w, budget, _, _ := budgetWorld(t)
	rec := w.record()
	pr, err := readPlugin(rec, "notes")
	if err != nil {
		t.Fatal(err)
	}
	others := otherFields(rec)
	// Room for the state whole, and 16 KiB more for it to grow by.
	budget.mu.Lock()
	budget.limit = others + len(pr.Data) + 16<<10
	limit := budget.limit
	budget.mu.Unlock()
	var failed []string
	for k := range 10 {
		why := w.addLong()
		if why == "" {
			continue
		}
		whole := w.wholeBytes()
		if others+whole > limit {
			t.Skipf("call %d: the state grew past the budget (%d bytes whole)", k+1, whole)
		}
		rec := w.record()
		failed = append(failed, fmt.Sprintf("call %d: not saved (%q), though the state whole (%d bytes) and the record's other fields (%d) fit the budget of %d; the store holds a base of %d bytes and a p/notes of %d",
			k+1, why, whole, others, limit, len(rec["b/notes"]), len(rec["p/notes"])))
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 10 calls not saved:\n%s", len(failed), strings.Join(failed, "\n"))
	}
}
