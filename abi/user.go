package abi

import "encoding/json"

// Host functions of module [UserModule]: the MCP features a tool reaches
// while it runs. The names and JSON shapes are hyper-mcp's, so its plugins
// run unmodified; write_record is wasmtools' own. Offsets are kernel
// blocks holding UTF-8 JSON. docs/ABI.md gives each one's errors.
const (
	// FuncNotifyProgress (offset i64): a ProgressParams. Sent to the
	// client when the call carried a progress token; rate-limited.
	FuncNotifyProgress = "notify_progress"
	// FuncNotifyLoggingMessage (offset i64): a LogMessage. Always logged
	// by the host; sent to the client when it asked for that level.
	FuncNotifyLoggingMessage = "notify_logging_message"
	// FuncCreateElicitation (offset i64) -> offset i64: an ElicitRequest
	// in, an ElicitResult out. Blocks until the user answers.
	FuncCreateElicitation = "create_elicitation"
	// FuncNotifyToolListChanged (): the plugin's tool list changed; the
	// host lists its tools again.
	FuncNotifyToolListChanged = "notify_tool_list_changed"
	// FuncNotifyPromptListChanged, FuncNotifyResourceListChanged (): as
	// above for prompts and resources.
	FuncNotifyPromptListChanged   = "notify_prompt_list_changed"
	FuncNotifyResourceListChanged = "notify_resource_list_changed"
	// FuncNotifyResourceUpdated (offset i64): {"uri": "..."}.
	FuncNotifyResourceUpdated = "notify_resource_updated"
	// FuncWriteRecord (offset i64) -> i64: a Record in; 0 when kept, else
	// the offset of a block holding the error message.
	FuncWriteRecord = "write_record"
	// FuncCreateMessage (offset i64) -> offset i64: MCP CreateMessageParams
	// in (sampling), a CreateMessageResult out. Blocks until the client's
	// model answers.
	FuncCreateMessage = "create_message"
	// FuncListRoots () -> offset i64: the client's MCP ListRootsResult
	// ({"roots": []} when the client offers no roots). Blocks until the
	// client answers.
	FuncListRoots = "list_roots"
	// FuncGetKeyringSecret (offset i64) -> offset i64: a KeyringEntry in,
	// the secret's raw bytes out. Only secrets the operator granted the
	// plugin are served; any other traps, naming the grant.
	FuncGetKeyringSecret = "get_keyring_secret"
	// FuncGetAccessToken (offset i64) -> offset i64: OAuthCredentials in,
	// an AccessTokenResult out.
	FuncGetAccessToken = "get_access_token"
	// FuncNotifyURLElicitationCompleted (offset i64): MCP
	// ElicitationCompleteParams, {"elicitationId": "..."}: a URL
	// elicitation the plugin started has completed.
	FuncNotifyURLElicitationCompleted = "notify_url_elicitation_completed"
	// FuncRequestInputs (offset i64) -> offset i64: InputRequests in,
	// InputResults out: several questions (elicitations, sampling
	// requests, the client's roots) asked at once. wasmtools' own. A
	// 2026-07-28 client gets them in one input-required result; an older
	// client is asked them in turn, in key order. Blocks until answered.
	FuncRequestInputs = "request_inputs"
	// FuncCloseStream (offset i64): a CloseStreamParams. Frees the
	// client's connection during a long call (SEP-1699 polling); see
	// docs/ABI.md.
	FuncCloseStream = "close_stream"
	// FuncGrantReason (offset i64): a GrantReason. Says why the plugin
	// needs the grants it asks for next in this call (run-time grants,
	// see docs/ABI.md): the host shows it, quoted as the plugin's words,
	// in the question it writes. wasmtools' own; optional.
	FuncGrantReason = "grant_reason"
)

// GrantReason is the input of [FuncGrantReason]. The host keeps at most
// [MaxGrantReason] characters of Reason, control characters removed; ""
// clears it.
type GrantReason struct {
	Reason string `json:"reason"`
}

// MaxGrantReason bounds the reason a plugin gives for a grant, in
// characters.
const MaxGrantReason = 200

// CloseStreamParams is the input of [FuncCloseStream]: the delay, in
// milliseconds, after which the client should reconnect (1 to 60 000; 0
// means 1 000).
type CloseStreamParams struct {
	RetryAfterMs int64 `json:"retryAfterMs,omitempty"`
}

// ProgressParams is the input of [FuncNotifyProgress]. ProgressToken is
// accepted for hyper-mcp compatibility and ignored: the host always uses
// the token of the call the guest is serving.
type ProgressParams struct {
	ProgressToken any      `json:"progressToken,omitempty"`
	Progress      float64  `json:"progress"`
	Total         *float64 `json:"total,omitempty"`
	Message       string   `json:"message,omitempty"`
}

// LogMessage is the input of [FuncNotifyLoggingMessage]. Level is an MCP
// logging level: debug, info, notice, warning, error, critical, alert or
// emergency.
type LogMessage struct {
	Level  string `json:"level"`
	Logger string `json:"logger,omitempty"`
	Data   any    `json:"data"`
}

// ElicitRequest is the input of [FuncCreateElicitation]: MCP elicitation
// params, flattened as hyper-mcp does. Mode "form" (the default) asks for
// RequestedSchema, a flat object schema of primitive properties; mode
// "url" sends the user to URL. Timeout (milliseconds) is accepted and
// ignored: the host bounds the wait itself.
type ElicitRequest struct {
	Mode            string          `json:"mode,omitempty"`
	Message         string          `json:"message"`
	RequestedSchema json.RawMessage `json:"requestedSchema,omitempty"`
	URL             string          `json:"url,omitempty"`
	ElicitationID   string          `json:"elicitationId,omitempty"`
	Timeout         *int64          `json:"timeout,omitempty"`
}

// Elicitation actions.
const (
	ActionAccept  = "accept"
	ActionDecline = "decline"
	ActionCancel  = "cancel"
)

// ElicitResult is the output of [FuncCreateElicitation]. Content is set
// when Action is "accept" in form mode, and has been validated against the
// requested schema. Error is set, with Action "cancel", when the host could
// not ask at all (the client offers no elicitation, the call has asked as
// many questions as the client will answer, the request was invalid).
type ElicitResult struct {
	Action  string         `json:"action"`
	Content map[string]any `json:"content,omitempty"`
	Error   string         `json:"error,omitempty"`
}

// CreateMessageResult is the output of [FuncCreateMessage]: the MCP
// CreateMessageResult, or, with only Error set, why the host could not
// ask (the client offers no sampling, it speaks 2026-07-28, the request
// was invalid, the client refused).
type CreateMessageResult struct {
	Role       string          `json:"role,omitempty"`
	Content    json.RawMessage `json:"content,omitempty"`
	Model      string          `json:"model,omitempty"`
	StopReason string          `json:"stopReason,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// InputRequests is the input of [FuncRequestInputs]: MCP input requests
// by key, as in an input-required result. Each is {"method":
// "elicitation/create", "params": <as create_elicitation>}, {"method":
// "sampling/createMessage", "params": <as create_message>} or {"method":
// "roots/list"}. At most 8; keys are 1 to 64 letters, digits, "_" or "-".
type InputRequests struct {
	InputRequests map[string]InputRequest `json:"inputRequests"`
}

// InputRequest is one request of [InputRequests].
type InputRequest struct {
	Method string `json:"method"`
	Params any    `json:"params,omitempty"`
}

// InputResults is the output of [FuncRequestInputs]: the client's answer
// to each request by key (an ElicitResult, a CreateMessageResult or a
// ListRootsResult), and for a request that got none, why, in Errors.
// Error alone is set when the batch could not be asked at all.
type InputResults struct {
	InputResponses map[string]json.RawMessage `json:"inputResponses,omitempty"`
	Errors         map[string]string          `json:"errors,omitempty"`
	Error          string                     `json:"error,omitempty"`
}

// KeyringEntry is the input of [FuncGetKeyringSecret]. The operator
// grants secrets as "service/user" keys.
type KeyringEntry struct {
	Service string `json:"service"`
	User    string `json:"user"`
}

// OAuthCredentials is the input of [FuncGetAccessToken], hyper-mcp's
// OauthCredentials. The host answers from a token the operator configured
// for ClientID, or runs an OAuth 2.0 client-credentials grant against
// TokenEndpointURL, whose host must be in the plugin's network grant.
type OAuthCredentials struct {
	AuthType               string            `json:"auth_type,omitempty"` // "RequestBody" or "BasicAuth"
	ClientID               string            `json:"client_id"`
	ClientSecret           string            `json:"client_secret,omitempty"`
	DeviceAuthorizationURL string            `json:"device_authorization_url,omitempty"`
	ExtraParams            map[string]string `json:"extra_params,omitempty"`
	Scopes                 []string          `json:"scopes,omitempty"`
	TokenEndpointURL       string            `json:"token_endpoint_url"`
}

// AccessTokenResult is the output of [FuncGetAccessToken], in hyper-mcp's
// shape: exactly one of {"AccessToken": {...}} and {"Error": "..."}.
type AccessTokenResult struct {
	AccessToken *AccessToken `json:"AccessToken,omitempty"`
	Error       string       `json:"Error,omitempty"`
}

// AccessToken is an OAuth access token. ExpiresAt is a Rust SystemTime as
// serde writes it; absent when the token does not expire.
type AccessToken struct {
	AccessToken string      `json:"access_token"`
	ExpiresAt   *SystemTime `json:"expires_at"`
	Scopes      []string    `json:"scopes"`
}

// SystemTime is a point in time as Rust's serde writes a SystemTime.
type SystemTime struct {
	Secs  int64 `json:"secs_since_epoch"`
	Nanos int64 `json:"nanos_since_epoch"`
}

// Record is the input of [FuncWriteRecord]: a side effect the tool had (a
// file it wrote, a request it made), in a namespace the tool chooses.
type Record struct {
	Namespace string          `json:"namespace"`
	Data      json.RawMessage `json:"data"`
}

// UserFuncs lists the functions of [UserModule] with their signatures:
// whether each takes a JSON block, and whether it returns an offset.
func UserFuncs() []UserFunc {
	return []UserFunc{
		{FuncNotifyProgress, true, false},
		{FuncNotifyLoggingMessage, true, false},
		{FuncCreateElicitation, true, true},
		{FuncNotifyToolListChanged, false, false},
		{FuncNotifyPromptListChanged, false, false},
		{FuncNotifyResourceListChanged, false, false},
		{FuncNotifyResourceUpdated, true, false},
		{FuncWriteRecord, true, true},
		{FuncCreateMessage, true, true},
		{FuncListRoots, false, true},
		{FuncGetKeyringSecret, true, true},
		{FuncGetAccessToken, true, true},
		{FuncNotifyURLElicitationCompleted, true, false},
		{FuncRequestInputs, true, true},
		{FuncCloseStream, true, false},
		{FuncGrantReason, true, false},
	}
}

// UserFunc is the signature of one [UserModule] function.
type UserFunc struct {
	Name    string
	Input   bool // takes (offset i64)
	Returns bool // returns an i64 offset (0: none)
}
