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
	w := newNotesWorld(t)
	budget := w.budgeted(1 << 30)
	ses, d := w.aSes, w.a
	for range 30 {
		w.add()
	}
	rec := w.record()
	pr, err := readPlugin(rec, "notes")
	if err != nil {
		t.Fatal(err)
	}
	others := 0
	for f, v := range rec {
		if f != "p/notes" && f != "b/notes" {
			others += len(v)
		}
	}
	// Room for the state whole, and 16 KiB more for it to grow by.
	budget.mu.Lock()
	budget.limit = others + len(pr.Data) + 16<<10
	limit := budget.limit
	budget.mu.Unlock()
	var failed []string
	for k := range 10 {
		w.notes++
		text := fmt.Sprintf("note %d %s", w.notes, strings.Repeat("x", 200+w.notes*37%900))
		_, why := w.call(ses, d, "note_add", fmt.Sprintf(`{"text":%q}`, text))
		d.downUntil.Store(0)
		if why == "" {
			continue
		}
		// What the state whole would take now.
		l, err := ses.Acquire(w.ctx, w.key, w.p)
		if err != nil {
			t.Fatal(err)
		}
		st, err := l.Instance().SaveState(w.ctx)
		l.Done(nil)
		if err != nil {
			t.Fatal(err)
		}
		whole, _ := marshalRecord(pluginRecord{Host: st.Host, SHA256: st.SHA256, Data: st.Data})
		if others+len(whole) > limit {
			t.Skipf("call %d: the state grew past the budget (%d bytes whole)", k+1, len(whole))
		}
		rec := w.record()
		failed = append(failed, fmt.Sprintf("call %d: not saved (%q), though the state whole (%d bytes) and the record's other fields (%d) fit the budget of %d; the store holds a base of %d bytes and a p/notes of %d",
			k+1, why, len(whole), others, limit, len(rec["b/notes"]), len(rec["p/notes"])))
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 10 calls not saved:\n%s", len(failed), strings.Join(failed, "\n"))
	}
}
