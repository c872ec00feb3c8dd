package host

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The per-call path's pieces that every tools/call goes through allocate
// no more than they must (issue 27, item 2): allocations are what the
// path's CPU time follows, and unlike time they can be pinned.

// TestProgressSenderIdleAllocates: a call that sends no progress (most
// calls) pays nothing for its sender, which makes its channels and
// goroutine with the first update.
func TestProgressSenderIdleAllocates(t *testing.T) {
	ctx := context.Background()
	req := &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{}}
	e := &callEnv{}
	if allocs := testing.AllocsPerRun(100, func() {
		e.progress = progressSender{}
		e.progress.init(ctx, req)
		e.progress.close()
	}); allocs > 0 {
		t.Errorf("a call's progress sender with no update: %v allocations; want none", allocs)
	}
}
