//go:build wasip1

// Package guest is the Go guest library for wasmtools plugins: register
// tools, and the package serves them over the v2 plugin interface
// ([abi.ExportListTools] and [abi.ExportCallTool]) through the Extism kernel.
//
// Build a plugin with the standard Go toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o tool.wasm .
//
// and register its tools from an init function:
//
//	func init() {
//		guest.Register(guest.Tool{
//			Name:        "greet",
//			InputSchema: `{"type":"object","properties":{"name":{"type":"string"}}}`,
//			Handler: func(c *guest.Call) (*guest.Result, error) {
//				var in struct{ Name string }
//				if err := c.Bind(&in); err != nil {
//					return nil, err
//				}
//				return guest.Text("hello " + in.Name), nil
//			},
//		})
//	}
//	func main() {}
//
// The package's variables belong to one plugin instance, and the host gives
// each MCP session its own instance, so a plugin may keep per-client state
// in ordinary Go variables. Calls into one instance never overlap.
package guest

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/abi"
)

// Tool is one tool the plugin serves.
type Tool struct {
	Name        string
	Title       string
	Description string
	// InputSchema is the JSON Schema of the arguments, as JSON text. Empty
	// means an object with any properties. The host validates arguments
	// against it before the handler runs.
	InputSchema string
	// Annotations is the MCP tool annotations object as JSON text, or empty.
	Annotations string
	// RequiredClientCapabilities is an MCP ClientCapabilities object as
	// JSON text, or empty: the host refuses a call from a client that
	// did not declare them (see [abi.Tool]), so the handler never runs
	// without them.
	RequiredClientCapabilities string
	// TaskSupport is "" (forbidden), [abi.TaskOptional] or
	// [abi.TaskRequired]: whether a call may be answered with a task the
	// client polls (see [abi.ToolExecution]).
	TaskSupport string
	// TaskAfterInput makes such a call a task only once the user has
	// answered its first questions (see [abi.ToolExecution]).
	TaskAfterInput bool
	Handler        Handler
}

// Handler runs one call. A returned error becomes a result with isError set
// and the error's text, which the calling model sees.
type Handler func(c *Call) (*Result, error)

// Result is the MCP CallToolResult a handler returns.
type Result = abi.CallToolResult

// Call is one tool call as the guest sees it.
type Call struct {
	Name      string
	Arguments json.RawMessage
	Meta      json.RawMessage
	Context   abi.CallContext
}

// Bind decodes the call's arguments into v.
func (c *Call) Bind(v any) error {
	if len(c.Arguments) == 0 {
		return nil
	}
	if err := json.Unmarshal(c.Arguments, v); err != nil {
		return fmt.Errorf("arguments: %w", err)
	}
	return nil
}

// Text returns a result of one text block.
func Text(s string) *Result {
	b, _ := json.Marshal(abi.TextContent{Type: "text", Text: s})
	return &Result{Content: []json.RawMessage{b}}
}

// JSON returns a result whose structured content is v and whose text block
// is v's JSON, as MCP asks of tools with structured output.
func JSON(v any) (*Result, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	r := Text(string(b))
	r.StructuredContent = b
	return r, nil
}

var tools = map[string]Tool{}

// Register adds tools to the plugin. Call it from init; a duplicate name
// panics, since it is a programming error the plugin's author must see.
func Register(ts ...Tool) {
	for _, t := range ts {
		if _, dup := tools[t.Name]; dup {
			panic("guest: tool " + t.Name + " registered twice")
		}
		tools[t.Name] = t
	}
}

//go:wasmexport list_tools
func listTools() int32 {
	res := abi.ListToolsResult{Tools: []abi.Tool{}}
	for _, t := range tools {
		schema := cmp.Or(t.InputSchema, `{"type":"object"}`)
		at := abi.Tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: json.RawMessage(schema)}
		if t.Annotations != "" {
			at.Annotations = json.RawMessage(t.Annotations)
		}
		if t.TaskSupport != "" {
			at.Execution = &abi.ToolExecution{TaskSupport: t.TaskSupport, TaskAfterInput: t.TaskAfterInput}
		}
		if t.RequiredClientCapabilities != "" {
			at.RequiredClientCapabilities = json.RawMessage(t.RequiredClientCapabilities)
		}
		res.Tools = append(res.Tools, at)
	}
	slices.SortFunc(res.Tools, func(a, b abi.Tool) int { return strings.Compare(a.Name, b.Name) })
	return writeJSON(res)
}

//go:wasmexport call_tool
func callTool() int32 {
	var in abi.CallToolInput
	if err := json.Unmarshal(Input(), &in); err != nil {
		return fail(fmt.Errorf("call_tool: decode input: %w", err))
	}
	t, ok := tools[in.Request.Name]
	if !ok {
		return fail(fmt.Errorf("unknown tool %q", in.Request.Name))
	}
	res, err := t.Handler(&Call{Name: in.Request.Name, Arguments: in.Request.Arguments, Meta: in.Request.Meta, Context: in.Context})
	if err != nil {
		res = Text(err.Error())
		res.IsError = true
	}
	if res == nil {
		return fail(errors.New("handler returned no result"))
	}
	if res.Content == nil {
		res.Content = []json.RawMessage{}
	}
	return writeJSON(res)
}

func writeJSON(v any) int32 {
	b, err := json.Marshal(v)
	if err != nil {
		return fail(err)
	}
	Output(b)
	return 0
}

func fail(err error) int32 {
	SetError(err.Error())
	return 1
}

var preInitializers []func()

// OnPreInitialize adds f to what the plugin does at pre-initialisation:
// once, before the host keeps the plugin's pre-initialised image, so that
// every session starts with it done (abi.ExportPreInitialize). Use it for
// work that holds nothing secret or per-client and that every session
// would otherwise do on its first call: building tables, parsing embedded
// data, calling a handler's JSON once. Call it from init.
func OnPreInitialize(f func()) { preInitializers = append(preInitializers, f) }

// preInitialize is Wizer's pre-initialisation export, which the host runs
// once before it keeps the pre-initialised image (with images off, in
// every instance). It runs the library's own JSON of a call and of a
// result (encoding/json builds a decoder and an encoder per type on first
// use, and a Go guest's stack grows to a call's depth), then what the
// plugin added with OnPreInitialize.
//
//go:wasmexport wizer.initialize
func preInitialize() {
	var in abi.CallToolInput
	if b, err := json.Marshal(in); err == nil {
		_ = json.Unmarshal(b, &in)
	}
	_, _ = json.Marshal(&Result{Content: []json.RawMessage{json.RawMessage(`{"type":"text","text":""}`)}})
	_, _ = json.Marshal(abi.ListToolsResult{Tools: []abi.Tool{{Name: "x"}}})
	for _, f := range preInitializers {
		f()
	}
}
