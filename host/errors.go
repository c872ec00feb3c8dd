package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// JSON-RPC error codes of the refusals MCP defines no code for. JSON-RPC
// leaves -32000 to -32099 to implementations; MCP takes its own codes from
// that range too (-32001, -32002, -32020 to -32022, -32042), so these sit
// apart from them. Each such error's data carries "reason" (the same word
// as the code's name) and "retry" (whether the same request may succeed
// later), so that a client can branch without parsing the message.
const (
	// CodeBusy: the client already has as many calls waiting for the
	// plugin as [Options.QueueLimit] allows. Retry once one has ended.
	CodeBusy = -32050
	// CodeAtCapacity: the instance or memory limits are reached and no
	// instance can be evicted. Retry later.
	CodeAtCapacity = -32051
	// CodeShuttingDown: the server is closing, or the client's session
	// ended while the call waited. Retry against another server, or
	// after reconnecting.
	CodeShuttingDown = -32052
	// CodeStateUnavailable: the session's state could not be read or
	// verified in the state store now (it did not answer, or is failing
	// fast). Nothing ran. Retry: the same request succeeds once the store
	// answers.
	CodeStateUnavailable = -32053
)

// ErrStateUnavailable is matched by the refusal of a request whose
// session state could not be read or verified in the state store.
var ErrStateUnavailable = durable.ErrStateUnavailable

// errUnknownTool is matched by the error for a call of a tool that is not
// served (any more): the go-sdk answers a name never registered with
// -32602 (Invalid params), and a call that outlived its tool gets the same.
var errUnknownTool = errors.New("unknown tool")

// protocolError turns a refusal into the JSON-RPC error a client gets, with
// the code MCP gives it or one of ours; it keeps err's message. An error
// that is already a JSON-RPC error passes unchanged (its code and data are
// the contract, and the go-sdk keeps data only on an unwrapped error).
func protocolError(err error) error {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return err
	}
	code, reason, retry := int64(0), "", false
	switch {
	case errors.Is(err, errUnknownTool), errors.Is(err, ErrRequestState):
		code = jsonrpc.CodeInvalidParams
	case errors.Is(err, sessions.ErrBusy):
		code, reason, retry = CodeBusy, "busy", true
	case errors.Is(err, sessions.ErrAtCapacity):
		code, reason, retry = CodeAtCapacity, "at_capacity", true
	case errors.Is(err, ErrStateUnavailable), errors.Is(err, sessions.ErrMoved):
		// ErrMoved: a request that was claimed before its session moved;
		// nothing ran, and the retry claims it again from the store.
		code, reason, retry = CodeStateUnavailable, "state_unavailable", true
	case errors.Is(err, sessions.ErrClosed), errors.Is(err, sessions.ErrSessionEnded):
		code, reason, retry = CodeShuttingDown, "shutting_down", true
	default:
		return err
	}
	out := &jsonrpc.Error{Code: code, Message: err.Error()}
	if reason != "" {
		out.Data, _ = json.Marshal(map[string]any{"reason": reason, "retry": retry})
	}
	return out
}

// missingCapabilities returns what of the capabilities t requires (see
// [abi.Tool.RequiredClientCapabilities]) the client did not declare, or
// nil. A required capability is declared when the client's capabilities
// have the same key; when the required value is an object with keys of
// its own (a mode of elicitation, an extension), each of those too.
//
// The client's capabilities are read from req only when t requires some:
// the go-sdk decodes them from the request's _meta on each read (a JSON
// encoding and decoding, 32 KiB of buffers), and most tools require none.
func missingCapabilities(t *plugins.Tool, req *mcp.CallToolRequest) map[string]any {
	var want map[string]any
	if req := t.Def.RequiredClientCapabilities; len(req) > 0 {
		want = decodeCapabilities(req)
	}
	if e := t.Def.Execution; e != nil && e.TaskSupport == abi.TaskRequired {
		if want == nil {
			want = map[string]any{}
		}
		ext, _ := want["extensions"].(map[string]any)
		if ext == nil {
			ext = map[string]any{}
		}
		ext[TasksExtension] = map[string]any{}
		want["extensions"] = ext
	}
	if len(want) == 0 {
		return nil
	}
	var got map[string]any
	if have := req.ClientCapabilities(); have != nil {
		b, _ := json.Marshal(have)
		json.Unmarshal(b, &got)
	}
	return missingOf(want, got)
}

// decodeCapabilities decodes a tool's required capabilities (checked at
// load). A function of its own, so that missingCapabilities' want does
// not escape: a tool that requires none allocates nothing.
func decodeCapabilities(b json.RawMessage) map[string]any {
	var m map[string]any
	json.Unmarshal(b, &m)
	return m
}

func missingOf(want, got map[string]any) map[string]any {
	var missing map[string]any
	for k, w := range want {
		g, ok := got[k]
		if !ok || g == nil {
			if missing == nil {
				missing = map[string]any{}
			}
			missing[k] = w
			continue
		}
		wm, wok := w.(map[string]any)
		gm, gok := g.(map[string]any)
		if !wok || len(wm) == 0 {
			continue
		}
		if !gok {
			gm = nil
		}
		if sub := missingOf(wm, gm); sub != nil {
			if missing == nil {
				missing = map[string]any{}
			}
			missing[k] = sub
		}
	}
	return missing
}

// missingCapabilityError is MCP's MissingRequiredClientCapability error
// (-32021), whose data names what is missing as a ClientCapabilities
// object. The go-sdk answers it with HTTP 400 on a 2026-07-28 request;
// in a session (before 2026-07-28) it is an ordinary JSON-RPC error.
func missingCapabilityError(tool string, missing map[string]any) error {
	names := make([]string, 0, len(missing))
	for k := range missing {
		names = append(names, k)
	}
	slices.Sort(names)
	data, _ := json.Marshal(map[string]any{"requiredCapabilities": missing})
	return &jsonrpc.Error{
		Code:    mcp.CodeMissingRequiredClientCapabilities,
		Message: fmt.Sprintf("tool %q needs client capabilities the client did not declare: %s", tool, strings.Join(names, ", ")),
		Data:    data,
	}
}
