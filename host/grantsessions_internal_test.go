package host

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// Options.MaxGrantSessions < 0 is not "no bound" nor the default (cmp.Or
// keeps a negative value): tenantFIFO.add's `for len(f.tenant) >=
// f.total` pops from an empty table, and the first grant question
// panics (index out of range), where the other bounds treat <= 0 as
// their default (PoolSize, MaxHandles).
func TestReviewNegativeMaxGrantSessions(t *testing.T) {
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
