package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// handler returns the MCP handler of tool t. It holds t, and so its plugin
// version: a call that started before a reload finishes on that version.
func (h *Host) handler(t *plugins.Tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		start := time.Now()
		res, err := h.call(ctx, t, req)
		name := t.Plugin().Name()
		d := time.Since(start)
		switch {
		case err != nil:
			h.metrics.call(name, "refused", d)
			h.log.Warn("call refused", "tool", t.Name, "plugin", name, "error", err)
			return nil, err
		case res.IsError:
			h.metrics.call(name, "tool_error", d)
		default:
			h.metrics.call(name, "ok", d)
		}
		h.log.Debug("call", "tool", t.Name, "plugin", name, "duration", d, "isError", res.IsError)
		return res, nil
	}
}

// keyOf says whose instances a request uses: its transport session, or
// for a sessionless HTTP request, the authenticated subject or the
// operator's client header when present. A sessionless request with
// neither gets a key of its own session, which ends with the request.
func (h *Host) keyOf(req *mcp.CallToolRequest) sessionKey {
	ss := req.Session
	if ss.ID() != "" || req.Extra == nil || req.Extra.Header == nil {
		return sessionKey{ss: ss} // stdio, in-memory, stateful HTTP
	}
	if ti := req.Extra.TokenInfo; ti != nil && ti.UserID != "" {
		return sessionKey{client: "sub:" + ti.UserID}
	}
	if name := h.opts.ClientKeyHeader; name != "" {
		if v := req.Extra.Header.Get(name); v != "" {
			return sessionKey{client: "header:" + v}
		}
	}
	return sessionKey{ss: ss}
}

func (h *Host) call(ctx context.Context, t *plugins.Tool, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if req.Params.RequestState != "" {
		return h.resume(ctx, t, req)
	}
	args := req.Params.Arguments
	if err := t.ValidateArguments(args); err != nil {
		return errorResult(err.Error()), nil
	}
	var meta json.RawMessage
	if len(req.Params.Meta) > 0 {
		meta, _ = json.Marshal(req.Params.Meta)
	}
	key := h.keyOf(req)
	env := h.newCallEnv(ctx, t, req, h.sessionLabel(key))
	c := plugins.Call{
		Tool: t, Arguments: args, Meta: meta, Host: env.hostFunc,
		Context: abi.CallContext{SessionID: req.Session.ID(), ProtocolVersion: protocolOf(req), Meta: meta},
	}
	start := time.Now()
	if !t.Plugin().ImportsHost(abi.FuncCreateElicitation) {
		res, err := h.callTool(ctx, key, c, env.afterCall)
		env.finish(res)
		h.audit(env, res, start)
		return res, err
	}
	// A guest that may ask questions runs on its own goroutine, so that
	// the call can be parked between a 2026-07-28 client's requests.
	env.questions = make(chan *question)
	return h.serveRounds(ctx, req, h.startRun(ctx, key, c, env))
}

// sessionLabel names a session key in logs and the record log.
func (h *Host) sessionLabel(k sessionKey) string {
	switch {
	case k.client != "":
		return "client:" + k.client
	case k.ss != nil && k.ss.ID() != "":
		return k.ss.ID()
	default:
		return "local"
	}
}

// callTool runs a validated call on key's instance and shapes its result:
// everything a call costs the host but the MCP transport.
func (h *Host) callTool(ctx context.Context, key sessionKey, c plugins.Call, after func(context.Context, *plugins.Instance)) (*mcp.CallToolResult, error) {
	t := c.Tool
	o, err := h.runCall(ctx, key, t, c, after)
	if err != nil {
		if errors.Is(err, ErrBusy) {
			return nil, fmt.Errorf("tool %q: %w (limit %d): wait for earlier calls to finish", t.Name, err, h.queueLimit())
		}
		return nil, fmt.Errorf("tool %q: %w", t.Name, err)
	}
	var res *mcp.CallToolResult
	if o.err != nil {
		res = failureResult(t, o.err)
	} else if res, err = toMCP(o.result); err != nil {
		res = errorResult(fmt.Sprintf("tool %q: plugin %q returned a result that is not valid MCP: %v", t.Name, t.Plugin().Name(), err))
	}
	if o.reset != nil || o.upgraded != nil {
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		if o.reset != nil {
			res.Meta[MetaStateReset] = o.reset
		}
		if o.upgraded != nil {
			res.Meta[MetaUpgraded] = o.upgraded
		}
	}
	capResult(res, h.maxRunes())
	return res, nil
}

// failureResult turns a failed call into an isError result for the model.
func failureResult(t *plugins.Tool, err error) *mcp.CallToolResult {
	name := t.Plugin().Name()
	var ge *sandbox.GuestError
	var te *sandbox.TrapError
	switch {
	case errors.As(err, &ge):
		return errorResult(fmt.Sprintf("tool %q failed: %s", t.Name, ge.Message))
	case errors.Is(err, context.DeadlineExceeded):
		return errorResult(fmt.Sprintf("tool %q timed out and was stopped; plugin %q's state for this session was reset", t.Name, name))
	case errors.Is(err, context.Canceled):
		return errorResult(fmt.Sprintf("tool %q was cancelled; plugin %q's state for this session was reset", t.Name, name))
	case errors.As(err, &te):
		return errorResult(fmt.Sprintf("tool %q crashed (%s); plugin %q's state for this session was reset", t.Name, firstLine(te.Err.Error()), name))
	default:
		return errorResult(fmt.Sprintf("tool %q failed: %v", t.Name, err))
	}
}

func firstLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}

func errorResult(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}}, IsError: true}
}

// toMCP converts the guest's result to the SDK's types. Plain text blocks,
// nearly every block a tool returns, are converted directly; a result with
// any other block goes through the SDK's decoder, which knows every content
// type but costs a 32 KiB buffer per call.
func toMCP(r *abi.CallToolResult) (*mcp.CallToolResult, error) {
	res := &mcp.CallToolResult{IsError: r.IsError, Content: make([]mcp.Content, 0, len(r.Content))}
	for _, raw := range r.Content {
		var block struct {
			Type        string          `json:"type"`
			Text        string          `json:"text"`
			Annotations json.RawMessage `json:"annotations"`
			Meta        json.RawMessage `json:"_meta"`
		}
		if err := json.Unmarshal(raw, &block); err != nil {
			return nil, fmt.Errorf("content block: %w", err)
		}
		if block.Type != "text" || block.Annotations != nil || block.Meta != nil {
			return toMCPSlow(r)
		}
		res.Content = append(res.Content, &mcp.TextContent{Text: block.Text})
	}
	if len(r.StructuredContent) > 0 {
		res.StructuredContent = r.StructuredContent
	}
	if len(r.Meta) > 0 {
		if err := json.Unmarshal(r.Meta, &res.Meta); err != nil {
			return nil, fmt.Errorf("_meta: %w", err)
		}
	}
	dropHostMeta(res)
	return res, nil
}

// dropHostMeta removes the _meta keys of the host's namespace from a
// guest's result: only the host says that state was reset or records were
// written, so a client can trust them.
func dropHostMeta(res *mcp.CallToolResult) {
	for k := range res.Meta {
		if strings.HasPrefix(k, MetaPrefix) {
			delete(res.Meta, k)
		}
	}
}

func toMCPSlow(r *abi.CallToolResult) (*mcp.CallToolResult, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	dropHostMeta(&res)
	return &res, nil
}

func (h *Host) maxRunes() int {
	switch n := h.opts.MaxResultRunes; {
	case n == 0:
		return DefaultMaxResultRunes
	case n < 0:
		return -1
	default:
		return n
	}
}

// capResult keeps res within limit runes, counted across its content
// blocks (a non-text block counts the runes of its JSON) and its structured
// content. A text block is cut to fit; any other block, and structured
// content, that does not fit is dropped whole. A note at the end says what
// was left out.
func capResult(res *mcp.CallToolResult, limit int) {
	if limit < 0 {
		return
	}
	left := limit
	var kept []mcp.Content
	cut, dropped := 0, 0
	for _, c := range res.Content {
		if left <= 0 {
			dropped++
			continue
		}
		if tc, ok := c.(*mcp.TextContent); ok {
			n := utf8.RuneCountInString(tc.Text)
			if n > left {
				runes := []rune(tc.Text)
				cut += n - left
				tc.Text = string(runes[:left])
				n = left
			}
			left -= n
			kept = append(kept, tc)
			continue
		}
		b, _ := json.Marshal(c)
		n := utf8.RuneCount(b)
		if n > left {
			dropped++
			continue
		}
		left -= n
		kept = append(kept, c)
	}
	structured := false
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if n := utf8.RuneCount(b); n > left {
			res.StructuredContent = nil
			structured = true
		} else {
			left -= n
		}
	}
	if cut == 0 && dropped == 0 && !structured {
		return
	}
	note := fmt.Sprintf("[wasmtools: the result was over the %d-character limit:", limit)
	if cut > 0 {
		note += fmt.Sprintf(" %d characters of text cut;", cut)
	}
	if dropped > 0 {
		note += fmt.Sprintf(" %d content blocks dropped;", dropped)
	}
	if structured {
		note += " structured content dropped;"
	}
	note = note[:len(note)-1] + "]"
	res.Content = append(kept, &mcp.TextContent{Text: note})
}
