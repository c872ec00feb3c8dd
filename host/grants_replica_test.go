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

// TestGrantAnswersSurviveTakeover: a person's "allow for this session"
// moves with the session's record: after its replica is gone, the replica
// that takes the session over serves the plugin's request without asking
// again; another session there is still asked.
func TestGrantAnswersSurviveTakeover(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("hello")) }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{target}, AllowPrivate: true})
	files := map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")}
	store := statestore.NewMemory()
	a := newReplicaOf(t, "a", store, pol, files)
	b := newReplicaOf(t, "b", store, pol, files)
	rt := &router{to: a}

	ans := &grantAnswerer{decisions: []string{"allow for this session"}}
	cs := connectHTTPEra(t, a.srv.URL, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: ans.handler}, rt)
	if got := firstText(call(t, cs, "fetch", map[string]any{"url": srv.URL})); !strings.Contains(got, "200 hello") {
		t.Fatalf("at a, allowed: %q", got)
	}
	a.gone()
	rt.point(b)
	if got := firstText(call(t, cs, "fetch", map[string]any{"url": srv.URL})); !strings.Contains(got, "200 hello") {
		t.Fatalf("at b, after the takeover: %q\nb's log:\n%s", got, b.log.String())
	}
	if n := ans.count(); n != 1 {
		t.Errorf("asked %d times, want once: the answer did not move with the session", n)
	}
	// Another session at b has answered nothing: it is asked.
	other := &grantAnswerer{decisions: []string{"deny"}}
	cs2 := connectHTTPEra(t, b.srv.URL, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: other.handler}, nil)
	if got := firstText(call(t, cs2, "fetch", map[string]any{"url": srv.URL})); strings.Contains(got, "200 hello") {
		t.Errorf("another session was granted what it never asked for: %q", got)
	}
	if other.count() != 1 {
		t.Errorf("another session was asked %d times, want once", other.count())
	}
}
