package host

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// count sets what a record's field is counted at whatever the budgets (a
// write that may be in the store: durable.Options.Count), and the next
// reserve is checked against it; release forgets it all.
func TestStoreBudgetCount(t *testing.T) {
	b := newStoreBudget(100, 150, 1000, true)
	if _, err := b.reserve("r1", "p/x", 80, time.Minute, "alice"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.reserve("r1", "b/x", 50, time.Minute, "alice"); !errors.Is(err, ErrStoreBudget) {
		t.Fatalf("130 bytes in a record of 100: %v", err)
	}
	b.count("r1", "b/x", 50, time.Minute, "alice") // over the budget, counted
	if b.held["alice"] != 130 || b.sum != 130 {
		t.Fatalf("held %d, sum %d, want 130", b.held["alice"], b.sum)
	}
	if _, err := b.reserve("r2", "p/x", 30, time.Minute, "alice"); !errors.Is(err, ErrStoreBudget) {
		t.Fatalf("alice at 160 of her 150: %v", err)
	}
	b.count("r1", "b/x", 0, time.Minute, "alice")
	if _, err := b.reserve("r1", "p/x", 90, time.Minute, "alice"); err != nil {
		t.Fatalf("90 bytes once the base counts 0: %v", err)
	}
	b.release("r1")
	if b.held["alice"] != 0 || b.sum != 0 {
		t.Fatalf("after release: held %d, sum %d", b.held["alice"], b.sum)
	}
}

// A record written before it was attributed counts as the anonymous
// tenant's only until its attribution, which moves its bytes to its
// tenant; a record attributed before is not moved again.
func TestStoreBudgetAttributeLate(t *testing.T) {
	b := newStoreBudget(100, 150, 1000, true)
	if _, err := b.reserve("r1", "p/x", 80, time.Minute, "anon"); err != nil {
		t.Fatal(err)
	}
	b.attribute("r1", "alice")
	if b.held["anon"] != 0 || b.held["alice"] != 80 || b.sum != 80 {
		t.Fatalf("after the late attribution: anon %d, alice %d, sum %d; want 0, 80, 80", b.held["anon"], b.held["alice"], b.sum)
	}
	b.attribute("r1", "bob")
	if _, err := b.reserve("r1", "p/x", 90, time.Minute, "anon"); err != nil || b.held["alice"] != 90 || b.held["bob"] != 0 {
		t.Fatalf("after a second attribution and a write: %v; alice %d, bob %d; want alice's 90", err, b.held["alice"], b.held["bob"])
	}
	b.release("r1")
	if b.sum != 0 || len(b.held) != 0 || len(b.assumed) != 0 {
		t.Fatalf("after release: sum %d, held %v, assumed %v", b.sum, b.held, b.assumed)
	}
}

// The plugin budgets kept are bounded: past maxBudgets the idle ones are
// forgotten, and while every one is in use a new tenant shares the
// overflow budget, never one of another tenant's own.
func TestPluginBudgetsBounded(t *testing.T) {
	h := &Host{}
	busy := func(b *pluginBudget) {
		b.mu.Lock()
		b.logs.tokens = 0
		b.mu.Unlock()
	}
	alice := h.budgetOf("p", "alice")
	busy(alice)
	for i := range maxBudgets - 1 {
		busy(h.budgetOf("p", fmt.Sprint("t", i)))
	}
	// Every kept budget is in use: bob's and carol's are their own, for
	// one call each, shared with no one (until stop 61 they shared one
	// overflow budget, which bob's calls could keep empty for carol).
	bob := h.budgetOf("p", "bob")
	busy(bob)
	carol := h.budgetOf("p", "carol")
	if bob == alice || carol == bob || carol == alice || carol.idle() == false {
		t.Fatal("a tenant past the bound shares a budget, or gets one in use")
	}
	if again := h.budgetOf("p", "bob"); again == bob || !again.idle() {
		t.Fatal("a budget past the bound was kept")
	}
	if h.budgetOf("p", "alice") != alice || len(h.budgets) != maxBudgets {
		t.Fatalf("%d budgets; want alice's kept and %d", len(h.budgets), maxBudgets)
	}
	h.budgetMu.Lock()
	for k, b := range h.budgets {
		if k.tenant != "alice" {
			b.logs.tokens = b.logs.burst // idle again
		}
	}
	h.budgetSwept = time.Time{} // a second later
	h.budgetMu.Unlock()
	if b := h.budgetOf("p", "bob"); b == alice || h.budgetOf("p", "bob") != b {
		t.Fatal("bob's budget is not kept once the others are idle")
	}
	if len(h.budgets) != 2 || h.budgetOf("p", "alice") != alice {
		t.Fatalf("%d budgets after the idle ones were forgotten; want alice's and bob's", len(h.budgets))
	}
}

// TestStoreBudgetForgetsUnwritten: the records whose tenant is remembered
// are bounded (maxAttributed), and those never written are forgotten at
// the bound. A review found them kept for good (a request admitted whose
// session wrote nothing: an ended handle, a call refused after its
// admission), so that one tenant's many such requests filled the map, and
// every later record went unattributed: charged to the anonymous pool.
func TestStoreBudgetForgetsUnwritten(t *testing.T) {
	b := newStoreBudget(100, 150, 1<<30, true)
	for i := range maxAttributed {
		b.attribute(fmt.Sprint("bob-", i), "bob") // never written
	}
	b.attribute("alice-1", "alice")
	if _, err := b.reserve("alice-1", "p/x", 80, time.Minute, "anon"); err != nil {
		t.Fatal(err)
	}
	if b.held["alice"] != 80 || b.held["anon"] != 0 {
		t.Fatalf("alice's record after bob's %d unwritten ones: alice holds %d, the anonymous pool %d; want alice's 80", maxAttributed, b.held["alice"], b.held["anon"])
	}
}

// TestHeldInstancesCountInstances: a tenant's share of a plugin's
// instances counts the instances its calls in flight hold, not the calls:
// calls of one client queue on its one instance (a review found a second
// call of the same client, or a roots delivery to it, refused by a share
// that counted calls). The memory share counts each instance's limit once
// too, and lets a first instance through whatever its size.
func TestHeldInstancesCountInstances(t *testing.T) {
	var s heldInstances
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.take("bob", "p", "client-1", 1, 10, 0))
	must(s.take("bob", "p", "client-1", 1, 10, 0)) // the same instance
	if err := s.take("bob", "p", "client-2", 1, 10, 0); err == nil {
		t.Fatal("a second instance past a share of 1: taken")
	}
	must(s.take("alice", "p", "client-3", 1, 10, 0)) // her own share
	must(s.take("bob", "q", "client-1", 1, 10, 0))   // another plugin's
	s.give("bob", "p", "client-1", 10)
	if err := s.take("bob", "p", "client-2", 1, 10, 0); err == nil {
		t.Fatal("client-1 still has a call in flight: client-2 taken")
	}
	s.give("bob", "p", "client-1", 10)
	must(s.take("bob", "p", "client-2", 1, 10, 0))
	// Memory: a first instance larger than the share, then none more.
	var m heldInstances
	must(m.take("carol", "big", "c-1", 0, 100, 50))
	if err := m.take("carol", "small", "c-2", 0, 10, 50); err == nil {
		t.Fatal("a second instance past the memory share: taken")
	}
	must(m.take("carol", "big", "c-1", 0, 100, 50)) // the same instance again
}

// TestByteSharesBound: the parked bytes are bounded in all and by each
// tenant's share, refused as too many calls waiting, and given back.
func TestByteSharesBound(t *testing.T) {
	var b byteShares
	steps := []struct {
		name    string
		tenant  string
		n       int
		give    bool
		refused bool
	}{
		{"alice within her share", "alice", 40, false, false},
		{"alice past her share", "alice", 11, false, true},
		{"bob within his", "bob", 50, false, false},
		{"carol past the total", "carol", 11, false, true},
		{"alice gives hers back", "alice", 40, true, false},
		{"carol within the total again", "carol", 11, false, false},
	}
	for _, s := range steps {
		if s.give {
			b.give(s.tenant, s.n)
			continue
		}
		err := b.take(s.tenant, s.n, 100, 50)
		if s.refused != errors.Is(err, sessions.ErrParkLimit) || !s.refused && err != nil {
			t.Errorf("%s: %v, want refused %v", s.name, err, s.refused)
		}
	}
	b.give("bob", 50)
	b.give("carol", 11)
	if b.total != 0 || len(b.held) != 0 {
		t.Errorf("after everything was given back: total %d, held %v; want none", b.total, b.held)
	}
}
