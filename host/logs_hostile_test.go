package host_test

// Red-team tests of what operators watch: logs (stop 64; each failed
// before its fix).

import (
	"context"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestTaskIDNotLogged: a task's ID is the only thing guarding an
// anonymous client's task (SECURITY.md: "their tasks guarded only by their
// unguessable, signed IDs"): whoever has it reads the task's result or
// cancels it. Handles, the other such capability, reach logs only as a
// digest; "task created" logs the ID itself at Info.
func TestTaskIDNotLogged(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	id := startTask(t, url, "slow_compute", map[string]any{"seconds": 0.01, "label": "x"})
	if strings.Contains(f.log.String(), id) {
		for _, l := range strings.Split(f.log.String(), "\n") {
			if strings.Contains(l, id) {
				t.Errorf("the log holds an anonymous task's ID (a bearer capability): %s", l)
				break
			}
		}
	}
}

// TestAccessTokenLogBounded: a guest's log output is capped per message
// (4 KiB for log_*, 16 KiB for notify_logging_message) and rate-limited;
// get_access_token's failure log line carries the guest's client_id
// (host-function input, up to 1 MiB) and the token endpoint's error
// (up to 1 MiB of its body), with no cap and no rate limit.
func TestAccessTokenLogBounded(t *testing.T) {
	ts := newTokenServer(t)
	f := hyperFixture(t, ts.URL, false)
	cs := f.connect(t, "", nil)
	id := strings.Repeat("A", 512<<10)
	callText(t, cs, "token", map[string]any{"credentials": map[string]any{"client_id": id, "client_secret": "x", "token_endpoint_url": ts.URL + "/token"}})
	for _, l := range strings.Split(f.log.String(), "\n") {
		if len(l) > 64<<10 {
			t.Errorf("a log line of %d bytes: %.120s…", len(l), l)
		}
	}
}

// TestGuestNotToldSessionID: a 2026-07-28 client's guest is told only a
// digest of its handle, "since a handle opens the client's instances of
// every plugin, not only the one called" (SECURITY.md); traces record only
// a digest of the Mcp-Session-Id, "IDs and handles are bearer
// capabilities" (trace.go). A 2025-11-25 HTTP client's guest is told the
// Mcp-Session-Id itself in context.session_id: a hostile plugin hands it
// out, and with the shared token (or none) whoever presents it is that
// session, its instances of every plugin included.
func TestGuestNotToldSessionID(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "2025-11-25", nil)
	if res := call(t, cs, "test_trigger_tool_change", map[string]any{}); res.IsError {
		t.Fatal(text(res))
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range tools.Tools {
		if cs.ID() != "" && strings.Contains(tl.Description, cs.ID()) {
			t.Errorf("the guest was told the Mcp-Session-Id %q itself (tool %s: %q); want a digest, as for handles", cs.ID(), tl.Name, tl.Description)
		}
	}
}
