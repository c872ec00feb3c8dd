package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A 2025-11-25 session made while Redis refused a's connections, its
// first note served from memory (marked notSaved, no claim), keeps that
// note at its first claim once Redis answers: no other replica can have
// served a session that was in no record, so what a holds is its newest
// state, which the claim's checkpoint then writes (b, taking the session
// over, has it). The first claim used to drop the instance as stale (it
// was started under no claim) without a word: the next result said no
// stateReset, and the note was gone.
func TestSessionMadeWhileStoreDownKeepsItsCalls(t *testing.T) {
	addr := proxytest.FreeAddr(t)
	proxytest.StartRedisAt(t, addr)
	atA := &cutStore{Store: redisStore(t, addr)}
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes")}
	a := replicaWith(t, host.Options{Replica: "a", Store: atA}, sandbox.NewPolicy(), files)
	b := replicaWith(t, host.Options{Replica: "b", Store: redisStore(t, addr)}, sandbox.NewPolicy(), files)
	logsOnFailure(t, a, b)
	a.waitLog(t, "state key checked", 1)
	atA.refuse.Store(true)
	atA.cut.Store(true)
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	a.waitLog(t, "new session not kept", 1)
	if res := call(t, cs, "note_add", map[string]any{"text": "one"}); res.IsError || res.Meta[host.MetaNotSaved] == nil {
		t.Fatalf("a call with the store away: %v %s; want served from memory, notSaved", res.Meta, text(res))
	}
	atA.cut.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.h.WaitStore(ctx); err != nil {
		t.Fatal(err)
	}
	// The session's first claim.
	res := call(t, cs, "note_add", map[string]any{"text": "two"})
	if res.IsError || res.Meta[host.MetaNotSaved] != nil || res.Meta[host.MetaStateReset] != nil {
		t.Fatalf("the first call with the store back: %v %s", res.Meta, text(res))
	}
	if got := text(notes(t, cs, nil)); got != "1. one\n2. two\n" {
		t.Fatalf("at a, the session's notes: %q; want one and two (one was served from memory)", got)
	}
	a.gone()
	rt.point(b)
	got, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "note_list"})
	if err != nil {
		t.Fatalf("at b, a's session: %v", err)
	}
	if text(got) != "1. one\n2. two\n" || got.Meta[host.MetaStateReset] != nil {
		t.Fatalf("at b, a's session: %v %q; want one and two", got.Meta, text(got))
	}
}
