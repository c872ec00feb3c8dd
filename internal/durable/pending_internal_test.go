package durable

import (
	"context"
	"fmt"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestPendingShares: with shares, the new sessions a keeper holds for a
// store that did not answer are bounded per subject: bob's 256 KiB
// initializes fill his quarter of maxPendingBytes (16 of them), and
// alice's session is still kept; forgetting one of bob's gives him room
// again. Without shares, bob's fill the whole bound (64) and alice's is
// not kept: no other replica could take her session over.
func TestPendingShares(t *testing.T) {
	for _, shares := range []bool{true, false} {
		ses := sessions.New(&sessions.Options{})
		defer ses.Close(context.Background())
		d := New(Options{Store: statestore.NewMemory(), Sessions: ses, Replica: "a", Shares: shares})
		big := make([]byte, 256<<10)
		d.mu.Lock()
		for i := range 100 {
			d.keepPending(sessions.Client(fmt.Sprint("bob-", i)), &NewSession{Initialize: big, Subject: "bob"})
		}
		bobs := len(d.pending)
		d.keepPending(sessions.Client("alice"), &NewSession{Initialize: []byte(`{}`), Subject: "alice"})
		_, aliceKept := d.pending[sessions.Client("alice")]
		d.dropPending(sessions.Client("bob-0"))
		d.keepPending(sessions.Client("bob-again"), &NewSession{Initialize: big, Subject: "bob"})
		_, againKept := d.pending[sessions.Client("bob-again")]
		d.mu.Unlock()
		want := maxPendingBytes / len(big)
		if shares {
			want /= 4
		}
		if bobs != want {
			t.Errorf("shares=%v: %d of bob's sessions kept, want %d", shares, bobs, want)
		}
		if aliceKept != shares {
			t.Errorf("shares=%v: alice's session kept: %v", shares, aliceKept)
		}
		if !againKept {
			t.Errorf("shares=%v: bob's session after one of his was forgotten: not kept", shares)
		}
	}
}
