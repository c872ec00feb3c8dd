package sessions_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestHandleOpenCostIndependentOfClients: OpenIn, which the host calls
// to mint every session handle (each sessionless call of a stateful
// plugin that names none, refused calls included: the handle is minted
// before the call is admitted), costs the same however many clients other
// tenants have. A review found it walking every client of every tenant up
// to three times under the manager's one lock: to count the group's
// handles, to look for a victim, and in reclaimUnreturnedLocked; and
// clients are not bounded per tenant: a stateful HTTP session, or each
// value of the operator's client header, is one, kept until it ends or
// idles out, even when its every call was refused at capacity (as here).
// The handle indexes (handleindex.go) answer all three now.
//
// Bob makes 8 000 clients (each asked for an instance while the server
// was at capacity, refused, and left idle); alice then mints handles.
// Baseline: the same with bob's 50 clients. Each of alice's mints (and
// each of bob's, which he can send as fast as the server takes requests)
// held the lock for a time that grew with bob's clients: 3 µs a mint with
// his 50 clients, 0.5 to 0.6 ms with 20 000 (5.6 ms with 50 000); now
// under 1 µs with either.
func TestHandleOpenCostIndependentOfClients(t *testing.T) {
	const mints = 1000
	measure := func(bobClients int) time.Duration {
		w := newWorld(t, sessions.Options{MaxInstances: 1, MaxHandles: 100000, Tenant: tenantOf})
		defer w.finish()
		counter := w.plugin("counter")
		busy, err := w.m.Acquire(w.as("carol"), sessions.Client("carol"), counter)
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Done(nil)
		bob := w.as("bob")
		for i := range bobClients {
			if _, err := w.m.Acquire(bob, sessions.Client(fmt.Sprint("header:bob:", i)), counter); !errors.Is(err, sessions.ErrAtCapacity) {
				t.Fatalf("bob's client %d: %v; want refused at capacity", i, err)
			}
		}
		if got := w.m.Stats().Clients; got < bobClients {
			t.Fatalf("%d clients; want bob's %d kept", got, bobClients)
		}
		return timePer(t, mints, func(i int) error {
			return w.m.OpenIn(sessions.Handle(fmt.Sprint("alice-", i), "h"), "alice", 2*mints) // within her share: no eviction to time
		})
	}
	few, many := bestOfTwo(measure, 50, 8000)
	t.Logf("a handle mint: %v with 50 clients of bob's, %v with 8 000", few, many)
	if many > 20*few {
		t.Errorf("alice's handle mint took %.0f times as long (%v against %v) once bob had 8 000 idle clients: OpenIn walks every client under the manager's lock; want it independent of other tenants' clients", float64(many)/float64(few), many, few)
	}
}
