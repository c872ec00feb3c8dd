package host

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// Options.MaxGrantSessions <= 0 is the default, as for the other bounds
// (PoolSize, MaxHandles). A review found a negative one kept (cmp.Or):
// tenantFIFO.add's `for len(f.tenant) >= f.total` then popped from an
// empty table, and the first grant answers panicked.
func TestNegativeMaxGrantSessions(t *testing.T) {
	b := grantBook{max: -1}
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("a negative MaxGrantSessions panics at the first session's answers: %v", r)
		}
	}()
	b.mu.Lock()
	b.session(sessions.Client("alice"), "tenant:a")
	b.mu.Unlock()
}

// A review found an ended client's entry dropped when the key's later
// client asked its first question while a call of the ended one still
// ran: that call then got an empty entry, lost its "deny for this
// session" and its question count, and its person was asked again.
func TestOldClientsCallKeepsItsAnswersOnceTheKeyCameBack(t *testing.T) {
	live := uint64(1)
	b, key, gk := numberedBook(&live)
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessionOf(key, "", 1)
	s.answers[gk] = false
	s.Asked++
	live = 2
	b.session(key, "") // client 2's first question
	o := b.sessionOf(key, "", 1)
	if allowed, ok := o.answers[gk]; !ok || allowed || o.Asked != 1 {
		t.Fatalf("client 1's late call: answer %v (known %v), asked %d; want its denial and 1 question kept", allowed, ok, o.Asked)
	}
	if n := b.session(key, ""); len(n.answers) != 0 || n.Asked != 0 {
		t.Fatalf("client 2 has client 1's answers %v, asked %d", n.answers, n.Asked)
	}
}

// A review found an entry kept while the key had no client given to an
// ended client's late call once the key's next client was live: that
// call took the session's answers, and the live client's next question
// then forgot them.
func TestClientlessAnswersGoToLiveClientNotOldOnesCall(t *testing.T) {
	live := uint64(0)
	b, key, gk := numberedBook(&live)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.session(key, "").answers[gk] = true
	live = 2
	if o := b.sessionOf(key, "", 1); len(o.answers) != 0 {
		t.Fatalf("client 1's late call took the clientless answers %v", o.answers)
	}
	if n := b.session(key, ""); !n.answers[gk] {
		t.Fatalf("client 2 lost the clientless answers: %v", n.answers)
	}
}

// numberedBook is a grant book whose key's live client is numbered *live,
// the key, and a grant's key.
func numberedBook(live *uint64) (*grantBook, sessions.Key, grantKey) {
	b := &grantBook{clientOf: func(sessions.Key) uint64 { return *live }}
	return b, sessions.Client("alice"), grantKey{plugin: "p", kind: "net", target: "example.com:443"}
}
