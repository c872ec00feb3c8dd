//go:build wasip1

package guest

import (
	"encoding/json"
	"errors"

	"github.com/wasmtools/wasmtools/abi"
)

// The MCP host functions (module extism:host/user). See docs/ABI.md.

//go:wasmimport extism:host/user notify_progress
func hostNotifyProgress(offset uint64)

//go:wasmimport extism:host/user notify_logging_message
func hostNotifyLoggingMessage(offset uint64)

//go:wasmimport extism:host/user create_elicitation
func hostCreateElicitation(offset uint64) uint64

//go:wasmimport extism:host/user notify_tool_list_changed
func hostNotifyToolListChanged()

//go:wasmimport extism:host/user notify_prompt_list_changed
func hostNotifyPromptListChanged()

//go:wasmimport extism:host/user close_stream
func hostCloseStream(offset uint64)

//go:wasmimport extism:host/user grant_reason
func hostGrantReason(offset uint64)

//go:wasmimport extism:host/user write_record
func hostWriteRecord(offset uint64) uint64

//go:wasmimport extism:host/user create_message
func hostCreateMessage(offset uint64) uint64

//go:wasmimport extism:host/user list_roots
func hostListRoots() uint64

//go:wasmimport extism:host/user get_keyring_secret
func hostGetKeyringSecret(offset uint64) uint64

//go:wasmimport extism:host/user get_access_token
func hostGetAccessToken(offset uint64) uint64

//go:wasmimport extism:host/user notify_url_elicitation_completed
func hostNotifyURLElicitationCompleted(offset uint64)

func storeJSON(v any) uint64 {
	b, err := json.Marshal(v)
	if err != nil {
		panic("guest: " + err.Error())
	}
	return store(b)
}

// Progress reports progress of the current call: progress so far, out of
// total (0 when unknown), with an optional message. It is sent to the
// client only if the call asked for progress; the host rate-limits it, so
// calling it often is cheap but not every update may be seen.
func Progress(progress, total float64, message string) {
	p := abi.ProgressParams{Progress: progress, Message: message}
	if total > 0 {
		p.Total = &total
	}
	hostNotifyProgress(storeJSON(p))
}

// Log sends a log message at an MCP level (debug, info, notice, warning,
// error, critical, alert, emergency). The host always logs it, and sends it
// to the client when the client asked for that level.
func Log(level string, data any) {
	hostNotifyLoggingMessage(storeJSON(abi.LogMessage{Level: level, Logger: "guest", Data: data}))
}

// Elicit asks the user a question and waits for the answer. req.Mode
// "form" (the default) asks for req.RequestedSchema, a flat object schema;
// the content of an "accept" answer has been validated against it. The
// error is set when the host could not ask (the client offers no
// elicitation, or the call has asked as many questions as the client will
// answer); the result is then "decline", as hyper-mcp answers.
func Elicit(req abi.ElicitRequest) (*abi.ElicitResult, error) {
	var res abi.ElicitResult
	if err := json.Unmarshal(load(hostCreateElicitation(storeJSON(req))), &res); err != nil {
		return nil, err
	}
	if res.Error != "" {
		return &res, errors.New(res.Error)
	}
	return &res, nil
}

// ToolListChanged tells the host that the plugin's tool list changed: it
// lists the tools again and tells clients.
func ToolListChanged() { hostNotifyToolListChanged() }

// PromptListChanged tells the host that the plugin's prompt list changed
// (a prompt registered with [RegisterPrompt] as a call ran): it lists the
// prompts again once the call ends and tells clients.
func PromptListChanged() { hostNotifyPromptListChanged() }

// CloseStream ends the HTTP response stream that carries the current
// call's messages, telling the client to reconnect after retryAfterMs
// milliseconds; the call runs on and its result reaches the client on the
// stream it reconnects with. A call about to run long uses it to free the
// client's connection. It does something only for a 2025-11-25 client
// over HTTP.
func CloseStream(retryAfterMs int64) {
	hostCloseStream(storeJSON(abi.CloseStreamParams{RetryAfterMs: retryAfterMs}))
}

// GrantReason says why the plugin needs what it asks for next in this
// call (a host, a folder, a secret the operator lets the person approve at
// run time). The host shows it in its question, quoted as the plugin's
// words: at most 200 characters, control characters removed. "" clears
// it.
func GrantReason(reason string) {
	hostGrantReason(storeJSON(abi.GrantReason{Reason: reason}))
}

// WriteRecord leaves a record of a side effect the call had (a file it
// wrote, a request it made). Records are served in the result's _meta and
// written to the host's audit log. The error says why a record was
// refused (too large, too many).
func WriteRecord(namespace string, data any) error {
	b, err := json.Marshal(data)
	if err != nil {
		return err
	}
	if off := hostWriteRecord(storeJSON(abi.Record{Namespace: namespace, Data: b})); off != 0 {
		return errors.New(string(load(off)))
	}
	return nil
}

// CreateMessage asks the client's model for a completion (MCP sampling)
// and waits for it. params is an MCP CreateMessageParams: any value that
// marshals to {"messages": [{"role", "content"}], "maxTokens", ...}. The
// error is set when the host could not ask (the client offers no
// sampling) or the client refused. A 2026-07-28 client is asked through an
// input-required result.
func CreateMessage(params any) (*abi.CreateMessageResult, error) {
	var res abi.CreateMessageResult
	if err := json.Unmarshal(load(hostCreateMessage(storeJSON(params))), &res); err != nil {
		return nil, err
	}
	if res.Error != "" {
		return &res, errors.New(res.Error)
	}
	return &res, nil
}

// Root is one of the client's roots: a file:// URI and an optional name.
type Root struct {
	URI  string `json:"uri"`
	Name string `json:"name,omitempty"`
}

// ListRoots asks the client for its roots and waits for them. A client
// that offers no roots has none: the list is empty. A 2026-07-28 client is
// asked through an input-required result, like Elicit.
func ListRoots() ([]Root, error) {
	var res struct {
		Roots []Root `json:"roots"`
	}
	if err := json.Unmarshal(load(hostListRoots()), &res); err != nil {
		return nil, err
	}
	return res.Roots, nil
}

// KeyringSecret returns the secret the operator granted the plugin as
// "service/user". Asking for a secret that is not granted fails the call.
func KeyringSecret(service, user string) []byte {
	return load(hostGetKeyringSecret(storeJSON(abi.KeyringEntry{Service: service, User: user})))
}

// AccessToken returns an OAuth access token for creds: one the operator
// configured for creds.ClientID, or one from a client-credentials grant at
// creds.TokenEndpointURL (whose host must be granted to the plugin).
func AccessToken(creds abi.OAuthCredentials) (string, error) {
	var res abi.AccessTokenResult
	if err := json.Unmarshal(load(hostGetAccessToken(storeJSON(creds))), &res); err != nil {
		return "", err
	}
	if res.AccessToken == nil {
		return "", errors.New(res.Error)
	}
	return res.AccessToken.AccessToken, nil
}

// URLElicitationCompleted tells the client that the URL elicitation
// elicitationID (one the call asked with Elicit in mode "url") is done.
func URLElicitationCompleted(elicitationID string) {
	hostNotifyURLElicitationCompleted(storeJSON(map[string]string{"elicitationId": elicitationID}))
}

//go:wasmimport extism:host/user request_inputs
func hostRequestInputs(offset uint64) uint64

// RequestInputs asks several questions at once: elicitations
// ({"method": "elicitation/create", "params": abi.ElicitRequest}),
// sampling requests ({"method": "sampling/createMessage", "params": MCP
// CreateMessageParams}) and the client's roots ({"method": "roots/list"}),
// by key. A 2026-07-28 client answers them all in one round; an older
// client is asked them in turn. Each answer is in InputResponses under its
// key (an ElicitResult, a CreateMessageResult, a ListRootsResult); a
// request the client could not be asked has its reason in Errors. The
// error is set when the batch could not be asked at all.
func RequestInputs(requests map[string]abi.InputRequest) (*abi.InputResults, error) {
	var res abi.InputResults
	if err := json.Unmarshal(load(hostRequestInputs(storeJSON(abi.InputRequests{InputRequests: requests}))), &res); err != nil {
		return nil, err
	}
	if res.Error != "" {
		return &res, errors.New(res.Error)
	}
	return &res, nil
}
