package host

// Tracing: a span per MCP request, after the OpenTelemetry semantic
// conventions for MCP (span "{mcp.method.name} {target}", kind server), its
// parent taken from the request's `_meta` (SEP-414, MCP 2026-07-28:
// traceparent, tracestate, baggage) or else the HTTP request's headers.
// Children are started where the time goes: the slot wait and the guest's
// run (call.go), questions to the client (elicit.go), checkpoints, and, in
// the sandbox, a guest's HTTP requests, which carry the trace on.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/plugins"
)

// traceMiddleware is the outermost receiving middleware: its span covers
// everything the request costs, the wait for the first load included.
//
// Its frame is under every call's, so the work of a traced request is in
// a function of its own (traced): a request's goroutine starts with a
// small stack, which it grows to 8 KiB for a tools/call while few frames
// are on it (growCallStack), and a call that fits in 8 KiB is not copied
// again on its way to the guest (docs/DESIGN.md, "The Go guest inside
// the server").
func (h *Host) traceMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "tools/call" {
			growCallStack(0)
		}
		if telemetry.On() {
			return h.traced(ctx, next, method, req)
		}
		res, err := next(ctx, method, req)
		if err != nil {
			h.countIfRefusal(err, req)
		}
		return res, err
	}
}

// countIfRefusal counts err if it is a refusal (a JSON-RPC error).
func (h *Host) countIfRefusal(err error, req mcp.Request) {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		h.countRefusal(je, req)
	}
}

// traced is traceMiddleware's handling of a request while telemetry is on.
func (h *Host) traced(ctx context.Context, next mcp.MethodHandler, method string, req mcp.Request) (mcp.Result, error) {
	meta := metaOf(req)
	parent := telemetry.FromMeta(ctx, meta)
	var header map[string][]string
	if extra := req.GetExtra(); extra != nil {
		header = extra.Header
	}
	if parent == ctx {
		parent = telemetry.FromHeader(ctx, header)
	}
	name, attrs := method, []attribute.KeyValue{attribute.String("mcp.method.name", method)}
	switch r := req.(type) {
	case *mcp.CallToolRequest:
		if r.Params != nil {
			tool := h.spanName(r.Params.Name, func(c *plugins.Catalogue, n string) bool { _, ok := c.Tool(n); return ok })
			name += " " + tool
			attrs = append(attrs, attribute.String("gen_ai.tool.name", tool), attribute.String("gen_ai.operation.name", "execute_tool"))
		}
	case *mcp.GetPromptRequest:
		if r.Params != nil {
			prompt := h.spanName(r.Params.Name, func(c *plugins.Catalogue, n string) bool { _, ok := c.Prompt(n); return ok })
			name += " " + prompt
			attrs = append(attrs, attribute.String("gen_ai.prompt.name", prompt))
		}
	}
	transport := "pipe"
	if header != nil {
		transport = "tcp"
	}
	attrs = append(attrs, attribute.String("network.transport", transport))
	if v := protocolOfRequest(req, header); v != "" {
		attrs = append(attrs, attribute.String("mcp.protocol.version", telemetry.Cut(v, 32)))
	}
	// IDs and handles are bearer capabilities: only a digest goes out.
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil && ss.ID() != "" {
		attrs = append(attrs, attribute.String("mcp.session.id", traceDigest(ss.ID())))
	}
	if handle, _, _ := metaHandle(meta); handle != "" {
		attrs = append(attrs, attribute.String("wasmtools.session.handle", traceDigest(handle)))
	}
	ctx, span := telemetry.StartServer(parent, name, attrs...)
	res, err := next(ctx, method, req)
	switch {
	case err != nil:
		var je *jsonrpc.Error
		if errors.As(err, &je) {
			span.SetAttributes(attribute.String("rpc.response.status_code", strconv.FormatInt(je.Code, 10)))
			telemetry.Fail(span, strconv.FormatInt(je.Code, 10), err.Error())
			h.countRefusal(je, req)
		} else {
			telemetry.Fail(span, "_OTHER", err.Error())
		}
	default:
		if r, ok := res.(*mcp.CallToolResult); ok && r != nil && r.IsError {
			telemetry.Fail(span, "tool_error", "the tool's result is an error")
		}
	}
	span.End()
	return res, err
}

// spanName is a tool's or prompt's name as a span names it: the name
// when the catalogue served now has it (served), else "_unknown". A name
// the client made up is neither kept in spans (one of 1 MiB made a span of
// 3 MiB, and the exporter holds 2,048 of them: a red team, stop 64) nor a
// span name of its own.
func (h *Host) spanName(n string, served func(*plugins.Catalogue, string) bool) string {
	if cat := h.Catalogue(); cat != nil && served(cat, n) {
		return n
	}
	return "_unknown"
}

// metaOf is a request's `_meta`, nil when it has no params.
func metaOf(req mcp.Request) map[string]any {
	if p := req.GetParams(); !isNil(p) {
		return p.GetMeta()
	}
	return nil
}

// isNil reports whether p is nil or a nil pointer: a request without
// params holds a typed nil (*ListToolsParams)(nil).
func isNil(p mcp.Params) bool {
	return p == nil || reflect.ValueOf(p).IsNil()
}

// protocolOfRequest is the request's protocol revision: its
// Mcp-Protocol-Version header (every request of a 2026-07-28 client and
// later HTTP requests), else what the session was initialized with.
func protocolOfRequest(req mcp.Request, header map[string][]string) string {
	if v := header["Mcp-Protocol-Version"]; len(v) > 0 {
		return v[0]
	}
	if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss != nil {
		return protocolOfSession(ss)
	}
	return ""
}

// traceDigest is what traces show of a session ID or handle: enough to
// group one session's spans, nothing that could be presented as it.
func traceDigest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// traceSending is a sending middleware: each request wasmtools makes of a
// client (a question, a sampling request, roots) is a client span, a child
// of the call that asks, whose context goes to the client in `_meta`.
// Notifications (progress, logs) are not spans: too many, too cheap.
func traceSending(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if !telemetry.On() || strings.HasPrefix(method, "notifications/") {
			return next(ctx, method, req)
		}
		ctx, span := telemetry.StartClient(ctx, method, attribute.String("mcp.method.name", method))
		if p := req.GetParams(); !isNil(p) && span.SpanContext().IsValid() {
			m := maps.Clone(p.GetMeta())
			if m == nil {
				m = map[string]any{}
			}
			telemetry.InjectMeta(ctx, m)
			p.SetMeta(m)
		}
		res, err := next(ctx, method, req)
		telemetry.End(span, err)
		return res, err
	}
}

// countRefusal counts a refusal with one of wasmtools' codes (their data
// carries a reason word) by reason and by tenant kind: "subject" for an
// authenticated client, "anonymous" otherwise. Subjects themselves are
// not labels: their number has no bound.
func (h *Host) countRefusal(je *jsonrpc.Error, req mcp.Request) {
	var data struct {
		Reason string `json:"reason"`
	}
	if len(je.Data) == 0 || json.Unmarshal(je.Data, &data) != nil || data.Reason == "" {
		return
	}
	tenant := "anonymous"
	if subjectOf(req.GetExtra()) != "" {
		tenant = "subject"
	}
	h.metrics.refusals.WithLabelValues(data.Reason, tenant).Inc()
}
