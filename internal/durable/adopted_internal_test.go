package durable

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// A stateful session taken over from the store is never served afresh
// from memory while the store does not answer, however many sessions
// this replica adopted since: before, past 4,096 adoptions one note was
// forgotten for each new one, any live session's, which a store outage
// then served with fresh instances over the state the store held (a
// silent reset). A session made here is still served from memory; an
// adopted session's note goes when it ends here.
func TestAdoptedNotForgotten(t *testing.T) {
	ctx := context.Background()
	ses := sessions.New(&sessions.Options{})
	defer ses.Close(ctx)
	d := New(Options{Store: silentStore{statestore.NewMemory()}, Sessions: ses, Replica: "a"})
	conn := func(id string) sessions.Key { return sessions.Conn(new(int), id, id) }
	served := func(key sessions.Key) bool {
		_, err := d.BeforeCall(ctx, key)
		if err != nil && !errors.Is(err, ErrServedFromMemory) && !errors.Is(err, ErrStateUnavailable) {
			t.Fatalf("%s: %v", key, err)
		}
		return errors.Is(err, ErrServedFromMemory)
	}
	first := conn("adopted-first")
	d.AdoptedHere(first.ID())
	if served(first) {
		t.Fatal("an adopted session was served from memory with the store silent")
	}
	if !served(conn("made-here")) {
		t.Fatal("a session made here was not served from memory with the store silent")
	}
	// Its note goes with the session.
	d.Ended(first)
	d.mu.Lock()
	n := len(d.adopted)
	d.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d notes kept after the adopted session ended", n)
	}
	d.AdoptedHere(first.ID())
	for i := range maxAdoptedNotes + 16 {
		d.AdoptedHere("adopted-" + strconv.Itoa(i))
	}
	if served(first) {
		t.Fatal("an adopted session was served from memory after more adoptions than the notes' bound")
	}
	for i := range maxAdoptedNotes + 16 {
		if key := conn("adopted-" + strconv.Itoa(i)); served(key) {
			t.Fatalf("adopted session %s was served from memory", key)
		}
	}
}
