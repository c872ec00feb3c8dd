package durable

import (
	"bytes"
	"context"
	"errors"
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
