// Package abi is the contract between wasmtools and the plugins it hosts: the
// names of the Wasm imports the host provides and the exports it calls, and
// the JSON messages that cross them.
//
// Plugins speak the Extism ABI (https://extism.org/docs/concepts/pdk), so a
// plugin written with any Extism PDK runs here unmodified. The kernel
// functions of module [EnvModule] move bytes between the guest and the host;
// the tool interface is one of two JSON conventions, detected from the
// plugin's exports:
//
//   - [InterfaceServlet] (mcp.run servlets, hyper-mcp's first plugins):
//     exports [ExportDescribe] and [ExportCall].
//   - [InterfaceV2] (hyper-mcp's plugin schema v2): exports [ExportListTools]
//     and [ExportCallTool], and optionally the prompt and resource exports.
//
// docs/ABI.md specifies the same contract byte by byte for guests in other
// languages. This package imports nothing but the standard library, so both
// the host and guests may depend on it.
package abi

import "encoding/json"

// Module names of the host functions a guest may import.
const (
	// EnvModule holds the Extism kernel: memory blocks, input, output,
	// errors, config, vars, logging and HTTP.
	EnvModule = "extism:host/env"
	// UserModule holds the host functions of MCP features (progress,
	// logging, elicitation, records). Extism calls these "user" functions.
	UserModule = "extism:host/user"
	// WASIModule is WASI preview 1. A guest gets it with nothing granted:
	// no files, no environment, no arguments, and stdout/stderr go to the
	// host's log.
	WASIModule = "wasi_snapshot_preview1"
)

// Kernel function names in [EnvModule]. Offsets are i64 handles to blocks of
// host-side memory, never addresses in the guest's own linear memory.
const (
	FuncAlloc        = "alloc"          // (len i64) -> offset i64
	FuncFree         = "free"           // (offset i64)
	FuncLength       = "length"         // (offset i64) -> len i64; 0 for a bad offset
	FuncLengthUnsafe = "length_unsafe"  // (offset i64) -> len i64
	FuncLoadU8       = "load_u8"        // (offset i64) -> i32
	FuncLoadU64      = "load_u64"       // (offset i64) -> i64
	FuncStoreU8      = "store_u8"       // (offset i64, v i32)
	FuncStoreU64     = "store_u64"      // (offset i64, v i64)
	FuncInputLength  = "input_length"   // () -> len i64
	FuncInputOffset  = "input_offset"   // () -> offset i64
	FuncInputLoadU8  = "input_load_u8"  // (index i64) -> i32
	FuncInputLoadU64 = "input_load_u64" // (index i64) -> i64
	FuncInputSet     = "input_set"      // (offset i64, len i64)
	FuncOutputSet    = "output_set"     // (offset i64, len i64)
	FuncOutputLength = "output_length"  // () -> len i64
	FuncOutputOffset = "output_offset"  // () -> offset i64
	FuncErrorSet     = "error_set"      // (offset i64)
	FuncErrorGet     = "error_get"      // () -> offset i64
	FuncReset        = "reset"          // ()
	FuncMemoryBytes  = "memory_bytes"   // () -> i64
	FuncConfigGet    = "config_get"     // (key offset i64) -> value offset i64, 0 if unset
	FuncVarGet       = "var_get"        // (key offset i64) -> value offset i64, 0 if unset
	FuncVarSet       = "var_set"        // (key offset i64, value offset i64); value 0 deletes
	FuncHTTPRequest  = "http_request"   // (request offset i64, body offset i64) -> body offset i64
	FuncHTTPStatus   = "http_status_code"
	FuncHTTPHeaders  = "http_headers"
	FuncGetLogLevel  = "get_log_level" // () -> i32
	FuncLogTrace     = "log_trace"     // (message offset i64)
	FuncLogDebug     = "log_debug"
	FuncLogInfo      = "log_info"
	FuncLogWarn      = "log_warn"
	FuncLogError     = "log_error"
)

// Exports the host calls. Each takes its input through the kernel's input
// functions, writes its output with output_set, and returns an i32 that is 0
// on success; on failure it sets an error message with error_set.
const (
	ExportDescribe = "describe" // servlet: () -> ServletDescribeResult
	ExportCall     = "call"     // servlet: ServletCallInput -> CallToolResult

	ExportListTools = "list_tools" // v2: ListInput -> ListToolsResult
	ExportCallTool  = "call_tool"  // v2: CallToolInput -> CallToolResult

	// Optional v2 exports for prompts, resources and completion.
	ExportListPrompts           = "list_prompts"
	ExportGetPrompt             = "get_prompt"
	ExportListResources         = "list_resources"
	ExportListResourceTemplates = "list_resource_templates"
	ExportReadResource          = "read_resource"
	ExportComplete              = "complete"

	// ExportOnRootsListChanged (optional, v2) is called with a
	// [NotificationInput] when a client that serves the plugin's calls
	// says its roots changed. Its output is ignored.
	ExportOnRootsListChanged = "on_roots_list_changed"
)

// State handoff exports. When both the old and the new version of a plugin
// export both, a hot swap moves each session's state: the host calls the
// old instance's snapshot, whose output is a [Snapshot], and passes it as
// the input of a new instance's restore, which returns 0 once it has taken
// the state. A restore that fails leaves the session with a fresh instance,
// told so in _meta. Snapshots are at most 16 MiB.
const (
	ExportSnapshot = "wasmtools_snapshot"
	ExportRestore  = "wasmtools_restore"
)

// Snapshot is the state a plugin hands to its next version. Format names
// the shape of State, so that a version can refuse (or convert) a state it
// does not know.
type Snapshot struct {
	Format string          `json:"format"`
	State  json.RawMessage `json:"state"`
}

// Initialisation exports, called once per instance before any other export,
// in this order of preference: a WASI reactor's _initialize (what Go's
// -buildmode=c-shared produces), else a C command's __wasm_call_ctors.
const (
	ExportInitialize = "_initialize"
	ExportCallCtors  = "__wasm_call_ctors"
)

// ExportPreInitialize, () -> (), is Wizer's pre-initialisation export
// (github.com/bytecodealliance/wizer): when a plugin exports it, the host
// calls it once after the initialisation export, before the instance's
// state becomes the plugin's pre-initialised image, so that the work it
// does (caches filled, tables built, stacks grown) is in every instance
// that starts from the image instead of being done again on each
// session's first call. Without images it runs in every new instance, so
// that each starts in the same state. Its state is shared by every
// session, as the image's is: it must hold nothing secret or per-client
// (docs/SECURITY.md).
const ExportPreInitialize = "wizer.initialize"

// Interface names a tool convention a plugin speaks.
type Interface string

const (
	InterfaceServlet Interface = "servlet"
	InterfaceV2      Interface = "v2"
)

// Tool describes one tool, as the guest lists it. The host passes the
// schemas and annotations through to MCP clients.
type Tool struct {
	Name         string          `json:"name"`
	Title        string          `json:"title,omitempty"`
	Description  string          `json:"description,omitempty"`
	InputSchema  json.RawMessage `json:"inputSchema,omitempty"`
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
	Annotations  json.RawMessage `json:"annotations,omitempty"`
	// RequiredClientCapabilities is an MCP ClientCapabilities object
	// naming what a call of the tool cannot do without (for example
	// {"sampling": {}}). The host refuses a call from a client that did
	// not declare each of them, before the guest runs, with the JSON-RPC
	// error MissingRequiredClientCapability (-32021). It is not served
	// to clients.
	RequiredClientCapabilities json.RawMessage `json:"requiredClientCapabilities,omitempty"`
	// Execution says how a call of the tool may run (MCP's
	// Tool.execution).
	Execution *ToolExecution `json:"execution,omitempty"`
}

// ToolExecution is MCP's Tool.execution: whether a call may run as a task
// (the Tasks extension, SEP-2663).
type ToolExecution struct {
	// TaskSupport is [TaskForbidden] (the default), [TaskOptional] or
	// [TaskRequired]. A call of an optional or required tool from a
	// client that declared the extension is answered with a task the
	// client polls; a required tool is refused (-32021) to a client that
	// did not declare it.
	TaskSupport string `json:"taskSupport,omitempty"`
	// TaskAfterInput (wasmtools' own) makes such a call a task only on
	// its final round: its first request runs as a plain call, and if the
	// guest asks a question (an input-required result), the client's
	// retry that answers it becomes the task (SEP-2322 before SEP-2663).
	// A call that asks nothing runs as a plain call to the end.
	TaskAfterInput bool `json:"wasmtools_taskAfterInput,omitempty"`
}

// Values of [ToolExecution.TaskSupport].
const (
	TaskForbidden = "forbidden"
	TaskOptional  = "optional"
	TaskRequired  = "required"
)

// SessionArgument is the tool argument the host adds to the input schema
// of every tool of a plugin that keeps state, when it serves a client of
// protocol 2026-07-28 (which has no sessions): it carries the session
// handle that keys the client's instances. The host removes it from the
// arguments before the guest sees them, so a tool may not declare an
// input property of this name, nor an x-mcp-header of [SessionHeader].
const (
	SessionArgument = "wasmtools_session"
	SessionHeader   = "Wasmtools-Session"
)

// ServletDescribeResult is the output of the servlet export [ExportDescribe].
type ServletDescribeResult struct {
	Tools []Tool `json:"tools"`
}

// ServletCallInput is the input of the servlet export [ExportCall].
type ServletCallInput struct {
	Params CallParams `json:"params"`
}

// CallParams names the tool to call and carries its arguments.
type CallParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	Meta      json.RawMessage `json:"_meta,omitempty"`
}

// ListInput is the input of the v2 list exports ([ExportListTools],
// [ExportListPrompts], [ExportListResources],
// [ExportListResourceTemplates]): {"context": C}, as hyper-mcp sends it.
// wasmtools lists a plugin's tools once when it loads it, not per client
// request, so Context.ID is 0 and Context.Meta is {}; Context.Cursor asks
// for the page after a NextCursor the export returned.
type ListInput struct {
	Context CallContext `json:"context"`
}

// ListToolsResult is the output of the v2 export [ExportListTools].
type ListToolsResult struct {
	Tools      []Tool `json:"tools"`
	NextCursor string `json:"nextCursor,omitempty"`
}

// CallToolInput is the input of the v2 export [ExportCallTool]:
// {"request": <the MCP CallToolRequest params>, "context": C}.
type CallToolInput struct {
	Request CallParams  `json:"request"`
	Context CallContext `json:"context"`
}

// CallContext is hyper-mcp's request context, C in its v2 messages: the
// request's id and _meta, which hyper-mcp's plugins read. The fields after
// those are wasmtools' own, which hyper-mcp's plugins ignore. It is
// information, not a credential: a guest cannot act as another session
// with it.
type CallContext struct {
	// ID identifies the request, a number or a string as in JSON-RPC. The
	// host numbers requests itself: the go-sdk does not hand a request's
	// JSON-RPC id to its handlers (see docs/ABI.md).
	ID any `json:"id"`
	// Meta is the request's _meta object ({} when it has none), where
	// hyper-mcp's plugins look for the progress token.
	Meta json.RawMessage `json:"_meta"`

	// SessionID names the client's session: a digest label of the MCP
	// session's ID ("session-…"), of a 2026-07-28 client's handle
	// ("handle-…") or its client header; "" over stdio. Never the ID or
	// the handle, which are capabilities.
	SessionID string `json:"session_id,omitempty"`
	// ProtocolVersion is the MCP revision the client negotiated.
	ProtocolVersion string `json:"protocol_version,omitempty"`
	// Cursor, in a list export's input, asks for the page after it.
	Cursor string `json:"cursor,omitempty"`
}

// NotificationInput is the input of the v2 notification export
// [ExportOnRootsListChanged]: {"context": {"_meta": {...}}}.
type NotificationInput struct {
	Context NotificationContext `json:"context"`
}

// NotificationContext is the context of a notification export.
type NotificationContext struct {
	Meta json.RawMessage `json:"_meta"`
}

// CallToolResult is an MCP CallToolResult as the guest returns it. Content
// blocks are kept as raw JSON: the host decodes them with the MCP SDK.
type CallToolResult struct {
	Content           []json.RawMessage `json:"content"`
	StructuredContent json.RawMessage   `json:"structuredContent,omitempty"`
	IsError           bool              `json:"isError,omitempty"`
	Meta              json.RawMessage   `json:"_meta,omitempty"`
}

// TextContent is an MCP text content block, for guests building results.
type TextContent struct {
	Type string `json:"type"` // always "text"
	Text string `json:"text"`
}

// ListPromptsResult is the output of the v2 export [ExportListPrompts]
// (input: [ListInput]). Each prompt is an MCP Prompt object.
type ListPromptsResult struct {
	Prompts    []json.RawMessage `json:"prompts"`
	NextCursor string            `json:"nextCursor,omitempty"`
}

// ListResourcesResult is the output of the v2 export
// [ExportListResources]. Each resource is an MCP Resource object.
type ListResourcesResult struct {
	Resources  []json.RawMessage `json:"resources"`
	NextCursor string            `json:"nextCursor,omitempty"`
}

// ListResourceTemplatesResult is the output of the v2 export
// [ExportListResourceTemplates]. Each is an MCP ResourceTemplate object.
type ListResourceTemplatesResult struct {
	ResourceTemplates []json.RawMessage `json:"resourceTemplates"`
	NextCursor        string            `json:"nextCursor,omitempty"`
}

// RequestInput is the input of the v2 exports [ExportGetPrompt] (request:
// MCP GetPromptParams), [ExportReadResource] (ReadResourceParams) and
// [ExportComplete] (CompleteParams, whose ref.type is sent without its
// "ref/" prefix, "prompt" or "resource", as hyper-mcp does). Their outputs are the MCP results:
// GetPromptResult, ReadResourceResult and CompleteResult.
type RequestInput struct {
	Request json.RawMessage `json:"request"`
	Context CallContext     `json:"context"`
}
