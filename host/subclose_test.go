package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCloseWithSubscribedSession: Host.Close closes the MCP sessions
// still open and returns once they are done, a session that only
// subscribed to a resource included. A review (stop 59) found Close
// waiting for such a session until its context ended ("sessions still
// open"): subscriptionsMiddleware's watcher (undoAtEnd), counted in h.wg,
// waited for ss.Wait(), and Close closed only the host's connections
// (h.conns), which nothing had made it one of. undoAtEnd now makes it one.
func TestCloseWithSubscribedSession(t *testing.T) {
	ctx := context.Background()
	f := quietNotes(t)
	cs := f.connect(t, "2025-11-25", nil)
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "notes://note/1"}); err != nil {
		t.Fatal(err)
	}
	// A bound, not a synchronisation: Close should not need it.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	if err := f.h.Close(cctx); err != nil {
		t.Errorf("Close with a session that only subscribed: %v after %v; want it closed and nil", err, time.Since(start).Round(time.Millisecond))
	}
	_ = cs.Close()
}
