package host_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
)

// A 2025-11-25 session made while the store did not answer (no record, no
// claim: its calls served from memory), at a replica drained while the
// store is silent still, and answering again a few seconds into the drain
// (Redis stopped past the replicas' timeouts during a rolling restart:
// the fault suite's redis-frozen-rolling-restart), must be handed over:
// its record written once the store answers, within the drain's time,
// so that the replica the proxy sends it to next takes it over rather
// than answer it unknown (404, which ends it at the client). a's link to
// a real redis-server goes silent (nothing refused, nothing answered);
// b reaches Redis directly.
func TestDrainKeepsSessionMadeWhileStoreAwayWhenItAnswersAgain(t *testing.T) {
	r := startCutRedis(t)
	a, b := r.serve(t, "a", redisStore(t, r.link.Addr())), r.serve(t, "b", redisStore(t, r.addr))
	logsOnFailure(t, a, b)
	a.waitLog(t, "state key checked", 1)
	b.waitLog(t, "state key checked", 1)
	r.link.SetMode(proxytest.RelaySilent)
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	a.waitLog(t, "new session not kept", 1)
	if res := call(t, cs, "note_add", map[string]any{"text": "one"}); res.IsError || res.Meta[host.MetaNotSaved] == nil {
		t.Fatalf("a call with the store silent: %v %q; want served, marked not saved", res.Meta, text(res))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- a.h.Drain(ctx, host.DrainOptions{}) }()
	// The store answers again 3 s into the drain (or once the drain
	// ended, if sooner): a stall shorter than the drain's 30 s.
	var err error
	done := false
	select {
	case err = <-drained:
		done = true
	case <-time.After(3 * time.Second):
	}
	r.link.SetMode(proxytest.RelayPass)
	if !done {
		err = <-drained
	}
	if err != nil {
		t.Logf("drain: %v", err)
	}
	rt.point(b)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "note_list"})
	if err != nil || res.IsError {
		t.Fatalf("at b, the session a drained (Redis answering again 3 s into the drain): %s", outcome(res, err))
	}
	if !strings.Contains(text(res), "one") {
		t.Fatalf("at b, the session a drained: %v %q; want note one", res.Meta, text(res))
	}
}
