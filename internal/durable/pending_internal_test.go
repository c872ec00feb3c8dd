package durable

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// silentStore claims nothing: a store that does not answer.
type silentStore struct{ statestore.Store }

func (silentStore) Claim(context.Context, string, statestore.Owner, time.Duration, bool) (statestore.Claim, error) {
	return statestore.Claim{}, errors.New("no answer (test)")
}

// New sessions made while the store does not answer are kept for their
// next claim (Keeper.pending), within a count and a byte bound that
// clients, who choose their initialize parameters, cannot pass; a session
// that ends is forgotten.
func TestPendingSessionsBounded(t *testing.T) {
	ctx := context.Background()
	ses := sessions.New(&sessions.Options{})
	defer ses.Close(ctx)
	d := New(Options{Store: silentStore{statestore.NewMemory()}, Sessions: ses, Replica: "a"})
	big := bytes.Repeat([]byte("x"), 1<<20)
	var keys []sessions.Key
	for i := range 40 {
		key := sessions.Client(string(rune('A' + i)))
		keys = append(keys, key)
		if _, err := d.Ensure(ctx, key, &NewSession{Initialize: big}); err == nil {
			t.Fatal("a claim with the store silent succeeded")
		}
	}
	d.mu.Lock()
	n, b := len(d.pending), d.pendingBytes
	d.mu.Unlock()
	if n != maxPendingBytes/len(big) || b > maxPendingBytes {
		t.Fatalf("%d sessions of 1 MiB kept, %d bytes; want %d, at most %d bytes", n, b, maxPendingBytes/len(big), maxPendingBytes)
	}
	for _, key := range keys {
		d.Ended(key)
	}
	d.mu.Lock()
	n, b = len(d.pending), d.pendingBytes
	d.mu.Unlock()
	if n != 0 || b != 0 {
		t.Fatalf("after the sessions ended: %d kept, %d bytes", n, b)
	}
}

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
