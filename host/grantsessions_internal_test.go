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
