package host_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Red team: the takeover test covers a 2025-11-25 session's "allow for
// this session" only. Here: both eras (a 2026-07-28 client's answers are
// its handle's) and "deny" too.
func TestGrantAnswersSurviveTakeoverBothEras(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello")) }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{target}, AllowPrivate: true})
	files := map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")}
	for _, proto := range protocols {
		for _, decision := range []string{"allow for this session", "deny"} {
			t.Run(proto+"/"+decision, func(t *testing.T) {
				store := statestore.NewMemory()
				a := newReplicaOf(t, "a", store, pol, files)
				b := newReplicaOf(t, "b", store, pol, files)
				rt := &router{to: a}
				ans := &grantAnswerer{decisions: []string{decision, decision}}
				cs := connectHTTPEra(t, a.srv.URL, proto, &mcp.ClientOptions{ElicitationHandler: ans.handler}, rt)
				if _, err := cs.ListTools(t.Context(), nil); err != nil {
					t.Fatal(err)
				}
				s := &grantSession{cs: cs}
				first := s.call(t, "fetch", map[string]any{"url": srv.URL})
				a.gone()
				rt.point(b)
				second := s.call(t, "fetch", map[string]any{"url": srv.URL})
				if strings.Contains(first, "200 hello") != strings.Contains(second, "200 hello") {
					t.Errorf("at a %q, at b %q", first, second)
				}
				if n := ans.count(); n != 1 {
					t.Errorf("asked %d times, want once: the %q answer did not move with the session (handle %q)\nb's log:\n%s", n, decision, s.handle, b.log.String())
				}
			})
		}
	}
}
