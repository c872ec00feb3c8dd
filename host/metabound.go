package host

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxMetaCost bounds what a request that runs a guest (a tool call,
// prompt get, resource read or completion) may carry in its _meta, at
// what it costs kept decoded (its strings' bytes and 128 for each value,
// as [keptCost] counts it). Such a request keeps its _meta while it runs,
// while it is parked for a person's answer (an hour at most) or runs as
// a task, and hands it to the guest; only the body's 4 MiB bounded it,
// and 16 calls parked with 1.6 MB of client capabilities each kept
// 1.1 GiB. A client's own _meta (its capabilities, a progress token, a
// trace context) costs a few KiB.
const MaxMetaCost = 256 << 10

// metaBound refuses a request that runs a guest whose _meta costs more
// than [MaxMetaCost] kept, before anything of it runs or is kept.
func metaBound(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/call", "prompts/get", "resources/read", "completion/complete":
			if p, ok := req.GetParams().(interface{ GetMeta() map[string]any }); ok {
				if meta := p.GetMeta(); len(meta) > 0 && metaCost(meta, MaxMetaCost) > MaxMetaCost {
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("the request's _meta is over %d bytes kept (its strings' bytes and 128 for each value): send less", MaxMetaCost)}
				}
			}
		}
		return next(ctx, method, req)
	}
}

// metaCost is what a _meta costs kept decoded, as keptCost counts it, or
// more than limit once past it: walked rather than marshalled, since
// every call pays it.
func metaCost(meta map[string]any, limit int) int {
	cost := 0
	var walk func(v any) bool
	walk = func(v any) bool {
		cost += 128
		switch v := v.(type) {
		case string:
			cost += len(v)
		case map[string]any:
			for k, e := range v {
				cost += len(k)
				if !walk(e) {
					return false
				}
			}
		case []any:
			for _, e := range v {
				if !walk(e) {
					return false
				}
			}
		default:
			cost += 8
		}
		return cost <= limit
	}
	walk(meta)
	return cost
}
