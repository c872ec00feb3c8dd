package host_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A review of stop 64's fixes: a stateless plugin that asks gets a
// handle for 2026-07-28 clients, so that the person's "deny" is the
// session's. But a stateless plugin's call took no durable claim
// (claimAndLease), and GrantsChanged writes the answers only into an
// existing claim's record: with replicas, the deny never reached the
// store, and the next replica to serve the handle asked the person again.
// Such a call claims its handle's session now (claims).
func TestStatelessAskerDenySurvivesTakeover(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello")) }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	files := map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")}
	store := statestore.NewMemory()
	mk := func(name string) *replica {
		f := newFixtureWith(t, &host.Options{Replica: name, Store: store, StateKey: replicaKey}, func(string) plugins.Options {
			pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{target}, AllowPrivate: true})
			return plugins.Options{Policy: &pol, Stateless: true}
		}, files)
		mux := http.NewServeMux()
		mux.Handle("/mcp", f.h.HTTPHandler())
		s := httptest.NewServer(mux)
		t.Cleanup(s.Close)
		return &replica{fixture: f, srv: s}
	}
	a, b := mk("a"), mk("b")
	rt := &router{to: a}
	ans := &grantAnswerer{decisions: []string{"deny", "deny"}}
	cs := connectHTTPEra(t, a.srv.URL, "", &mcp.ClientOptions{ElicitationHandler: ans.handler}, rt)
	if _, err := cs.ListTools(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	s := &grantSession{cs: cs}
	first := s.call(t, "fetch", map[string]any{"url": srv.URL})
	if s.handle == "" {
		t.Fatalf("no handle minted for the stateless asker (first %q)", first)
	}
	a.gone()
	rt.point(b)
	second := s.call(t, "fetch", map[string]any{"url": srv.URL})
	if n := ans.count(); n != 1 {
		t.Errorf("the person denied at replica a and was asked again at b (%d questions; first %q, second %q): the stateless asker's handle has no durable record, so its deny is not kept across replicas", n, first, second)
	}
}
