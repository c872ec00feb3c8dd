package host

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// DefaultLoadWait is how long a request that depends on the catalogue
// waits for the first load of the plugins (see [Options.Loaded]).
const DefaultLoadWait = 10 * time.Second

// waitForLoad is receiving middleware for a host that serves before its
// plugins have loaded: a request that reads the catalogue waits, up to
// LoadWait, for the first load to finish, so that a client's first list
// is whole when the plugins load quickly; a slow or hostile file never
// holds it longer (the list grows later, with list_changed). A call of a
// tool not served yet waits, within the same bound, until it is.
func (h *Host) waitForLoad(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/list", "prompts/list", "resources/list", "resources/templates/list", "tools/call", "prompts/get", "resources/read", "completion/complete":
		default:
			return next(ctx, method, req)
		}
		select {
		case <-h.opts.Loaded:
			return next(ctx, method, req)
		default:
		}
		wait := time.NewTimer(cmp.Or(h.opts.LoadWait, DefaultLoadWait))
		defer wait.Stop()
		var tool string
		if r, ok := req.(*mcp.CallToolRequest); ok && r.Params != nil {
			tool = r.Params.Name
		}
		settled := h.opts.Settled
		if tool != "" {
			settled = nil // a call waits for its tool
		}
		for {
			h.mu.Lock()
			changed := *h.catChanged.Load()
			cat := h.registered
			h.mu.Unlock()
			if tool != "" && cat != nil {
				if _, ok := cat.Tool(tool); ok {
					break
				}
			}
			select {
			case <-h.opts.Loaded:
			case <-settled:
			case <-wait.C:
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-changed:
				continue
			}
			break
		}
		if tool != "" && h.stillLoading(tool) {
			// The go-sdk's own answer would be a bare "unknown tool",
			// which reads as a wrong name while the tool may be
			// compiling still (a cold cache on a busy machine). Same
			// code, and nothing said of whether the tool exists.
			return nil, h.unknownTool(tool)
		}
		return next(ctx, method, req)
	}
}

// unknownTool is the refusal of a call of a tool that is not served, or
// that its subject may not use (accessChecked), which must read the same.
// During the first load it says the plugins are still loading.
func (h *Host) unknownTool(name string) error {
	msg := fmt.Sprintf("unknown tool %q", name)
	if h.loading() {
		msg += ": the plugins are still loading; try again shortly"
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg}
}

// loading reports whether the first load is not done.
func (h *Host) loading() bool {
	if h.opts.Loaded == nil {
		return false
	}
	select {
	case <-h.opts.Loaded:
		return false
	default:
		return true
	}
}

// stillLoading reports whether the first load is not done and tool is not
// served yet.
func (h *Host) stillLoading(tool string) bool {
	if !h.loading() {
		return false
	}
	h.mu.Lock()
	cat := h.registered
	h.mu.Unlock()
	if cat == nil {
		return true
	}
	_, ok := cat.Tool(tool)
	return !ok
}
