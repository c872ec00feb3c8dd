package durable

import (
	"fmt"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// budgetWorld is a notes session of 30 notes at replica a, under a byte
// budget for its record that holds anything until the test lowers it.
func budgetWorld(t *testing.T) (*notesWorld, *recordBudget, *Keeper, *sessions.Manager) {
	w := newNotesWorld(t)
	budget := w.budgeted(1 << 30)
	for range 30 {
		w.add()
	}
	return w, budget, w.a, w.aSes
}

// A split write refused by the byte budgets is written whole, though an
// earlier write of another field got no answer (the claim is dirty): the
// refusal left the store as it was. (The retry asked for a claim that was
// not dirty, and the call was not saved though its state fit whole.)
func TestRefusedSplitRetriedWholeWhileDirty(t *testing.T) {
	w, budget, d, ses := budgetWorld(t)
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
		w.notes++
		text := fmt.Sprintf("note %d %s", w.notes, strings.Repeat("x", 200+w.notes*37%900))
		_, why := w.call(ses, d, "note_add", fmt.Sprintf(`{"text":%q}`, text))
		d.downUntil.Store(0)
		if r := w.record(); true {
			t.Logf("call %d: why %q p/notes v%d %d bytes, b/notes %d", k+1, why, r["p/notes"][4], len(r["p/notes"]), len(r["b/notes"]))
		}
		if why == "" {
			continue
		}
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
		c.mu.Lock()
		dirty := c.dirty
		c.mu.Unlock()
		failed = append(failed, fmt.Sprintf("call %d: not saved (%q), though the state whole (%d bytes) and the other fields (%d) fit the budget of %d (claim dirty: %v)",
			k+1, why, len(whole), others, limit, dirty))
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
	rec := w.record()
	pr, err := readPlugin(rec, "notes")
	if err != nil {
		t.Fatal(err)
	}
	base := len(rec["b/notes"])
	if base < 16<<10 {
		t.Fatalf("a base of %d bytes", base)
	}
	// The next checkpoint writes the state whole (its claim knows no
	// base, as after any write that got no answer), under a budget that
	// holds the state but not a new base beside it.
	c := d.claims[w.key]
	c.mu.Lock()
	delete(c.bases, "notes")
	c.mu.Unlock()
	budget.mu.Lock()
	budget.limit = len(pr.Data) + 8<<10 + base/2
	budget.mu.Unlock()
	// Puts: 1 the state whole (answered); the new base is refused by the
	// budget before it is sent; 2 the empty base gets no answer.
	w.st.loseNth.Store(2)
	w.add() // the state whole is saved
	d.downUntil.Store(0)
	rec = w.record()
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
