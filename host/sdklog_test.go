package host_test

import (
	"context"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestSessionIDNotLogged: a stateful HTTP session's ID is a credential
// (whoever presents it is that session, with the shared token or none):
// no log line gives it, the go-sdk's own included ("server session
// connected", "resource subscribed"); they name it by its label.
func TestSessionIDNotLogged(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"counter.wasm": testplugins.Example(t, "counter"), "everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := connectHTTP(t, url, "2025-11-25", nil)
	call(t, cs, "count", nil)
	if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "test://watched-resource"}); err != nil {
		t.Logf("subscribe: %v", err)
	}
	id := cs.ID()
	cs.Close()
	f.waitLog(t, "server session disconnected", 1)
	if logs := f.log.String(); strings.Contains(logs, id) {
		t.Errorf("the session's ID %s is in the log:\n%s", id, logs)
	} else if !strings.Contains(logs, "session-") {
		t.Errorf("no session label in the log:\n%s", logs)
	}
}
