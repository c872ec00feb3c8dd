package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Instance is one live sandbox of a plugin, with the guest state its calls
// build up. It is not safe for concurrent use: the caller runs one call at
// a time. Close it when done.
type Instance struct {
	plugin *Plugin
	sb     *sandbox.Instance
}

// NewInstance starts a fresh instance of p, running the guest's
// initialisation.
func (p *Plugin) NewInstance(ctx context.Context) (*Instance, error) {
	sb, err := p.compiled.Instantiate(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: new instance: %w", p.name, err)
	}
	return &Instance{plugin: p, sb: sb}, nil
}

// Plugin returns the plugin the instance runs.
func (i *Instance) Plugin() *Plugin { return i.plugin }

// Call is one tool call.
type Call struct {
	Tool      *Tool
	Arguments json.RawMessage
	// Meta is the request's _meta, passed to the guest.
	Meta json.RawMessage
	// Context tells a v2 guest who calls.
	Context abi.CallContext
	// Host serves the guest's extism:host/user calls (progress, logging,
	// elicitation, records) during this call; nil refuses them.
	Host sandbox.HostFunc
}

// CallTool runs one tool call and returns the guest's result. The
// arguments are not validated here; see [Tool.ValidateArguments].
//
// A guest that fails the call (its export returns an error) yields a
// [sandbox.GuestError]; one that traps, panics or overruns its deadline
// yields a [sandbox.TrapError], and the instance is then closed
// ([Instance.Err] says why) and must be replaced. Output that is not a
// CallToolResult is an error too.
//
// The input is encoded, and the output decoded, in functions of their
// own, so that this frame, under the guest's, stays small: a call's
// goroutine that fits in 8 KiB of stack is not copied to a larger one
// (docs/DESIGN.md, "The Go guest inside the server").
func (i *Instance) CallTool(ctx context.Context, c *Call) (*abi.CallToolResult, error) {
	export, b, err := i.callInput(c)
	if err != nil {
		return nil, err
	}
	out, err := i.sb.Call(ctx, export, b, c.Host)
	if err != nil {
		return nil, err
	}
	return decodeResult(export, out)
}

// callInput is the export that runs c on i and its input.
func (i *Instance) callInput(c *Call) (export string, input []byte, err error) {
	if !c.Tool.plugin.SameCode(i.plugin) {
		return "", nil, fmt.Errorf("tool %q belongs to plugin %q, not %q", c.Tool.Name, c.Tool.plugin.name, i.plugin.name)
	}
	params := abi.CallParams{Name: c.Tool.Def.Name, Arguments: c.Arguments, Meta: c.Meta}
	servlet := i.plugin.iface == abi.InterfaceServlet
	export = abi.ExportCallTool
	buf := make([]byte, 0, 48+len(params.Name)+len(params.Arguments)+len(params.Meta))
	if servlet {
		export = abi.ExportCall
		input = appendServletInput(buf, &params)
	} else {
		cc := &c.Context
		buf = slices.Grow(buf, 96+len(cc.Meta)+len(cc.SessionID)+len(cc.ProtocolVersion)+len(cc.Cursor))
		input = appendCallToolInput(buf, &params, cc)
	}
	if input != nil {
		return export, input, nil
	}
	if servlet {
		input, err = json.Marshal(abi.ServletCallInput{Params: params})
	} else {
		input, err = json.Marshal(abi.CallToolInput{Request: params, Context: c.Context})
	}
	if err != nil {
		return "", nil, fmt.Errorf("encode call: %w", err)
	}
	return export, input, nil
}

// appendServletInput and appendCallToolInput append to b a call's input as
// json.Marshal encodes it, byte for byte, without its reflection (a fifth
// of the host's own work on a call; FuzzCallInput holds them to it). They
// return nil, for json.Marshal to encode it, when a string needs an
// escape, when a raw value has space to take out or a character
// json.Marshal escapes (<, >, &, U+2028, U+2029), or when the request's
// ID is not an integer.
func appendServletInput(b []byte, p *abi.CallParams) []byte {
	b = append(b, `{"params":`...)
	if b = appendCallParams(b, p); b == nil {
		return nil
	}
	return append(b, '}')
}

func appendCallToolInput(b []byte, p *abi.CallParams, c *abi.CallContext) []byte {
	b = append(b, `{"request":`...)
	if b = appendCallParams(b, p); b == nil {
		return nil
	}
	b = append(b, `,"context":{"id":`...)
	switch id := c.ID.(type) {
	case int64:
		b = strconv.AppendInt(b, id, 10)
	case nil:
		b = append(b, "null"...)
	default:
		return nil
	}
	b = append(b, `,"_meta":`...)
	if c.Meta == nil {
		b = append(b, "null"...)
	} else if b = appendRaw(b, c.Meta); b == nil {
		return nil
	}
	for _, f := range [...]struct{ name, v string }{{"session_id", c.SessionID}, {"protocol_version", c.ProtocolVersion}, {"cursor", c.Cursor}} {
		if f.v != "" {
			b = append(append(append(b, `,"`...), f.name...), `":`...)
			if b = appendPlainString(b, f.v); b == nil {
				return nil
			}
		}
	}
	return append(b, "}}"...)
}

func appendCallParams(b []byte, p *abi.CallParams) []byte {
	b = append(b, `{"name":`...)
	if b = appendPlainString(b, p.Name); b == nil {
		return nil
	}
	if len(p.Arguments) > 0 {
		if b = appendRaw(append(b, `,"arguments":`...), p.Arguments); b == nil {
			return nil
		}
	}
	if len(p.Meta) > 0 {
		if b = appendRaw(append(b, `,"_meta":`...), p.Meta); b == nil {
			return nil
		}
	}
	return append(b, '}')
}

// appendPlainString appends s quoted, or returns nil if json.Marshal would
// escape any of its bytes.
func appendPlainString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return nil
		}
	}
	return append(append(append(b, '"'), s...), '"')
}

// appendRaw appends v, a raw JSON value, or returns nil if it is not valid
// JSON or json.Marshal would write it otherwise: it compacts a raw value
// and escapes <, > and & (and U+2028 and U+2029, whose UTF-8 starts with
// 0xE2) in its strings.
func appendRaw(b []byte, v []byte) []byte {
	if !json.Valid(v) {
		return nil
	}
	in := false // inside a string
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case in && c == '\\':
			i++ // an escaped character: none of those below
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\r' || c == '\n'):
			return nil
		case c == '<' || c == '>' || c == '&':
			return nil
		case c == 0xe2 && i+2 < len(v) && v[i+1] == 0x80 && v[i+2]&^1 == 0xa8:
			return nil
		}
	}
	return append(b, v...)
}

// decodeResult decodes the output of a call of export.
func decodeResult(export string, out []byte) (*abi.CallToolResult, error) {
	if res, ok := textResult(out); ok {
		return res, nil
	}
	var res abi.CallToolResult
	if err := decodeJSON(out, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", export, err)
	}
	return &res, nil
}

// textResult decodes out without encoding/json when it is the result
// nearly every guest returns, written as encoding/json writes it: text
// blocks and nothing else, no space between tokens:
//
//	{"content":[{"type":"text","text":"..."},...]}
//
// optionally with ,"isError":true (or false) before the last brace. It
// reports false for any other output, valid or not, which decodeJSON
// decodes; for the output it takes, the result is decodeJSON's, its blocks
// the bytes of out (FuzzDecodeOutput holds it to that). json.Unmarshal took 1.5 µs of a Go
// guest's 100-byte echo, and walked it twice (its validity, then its
// fields); this walks it once.
func textResult(out []byte) (*abi.CallToolResult, bool) {
	const head, open = `{"content":[`, `{"type":"text","text":"`
	rest, ok := bytes.CutPrefix(out, []byte(head))
	if !ok || !utf8.Valid(out) {
		return nil, false
	}
	res := &abi.CallToolResult{Content: make([]json.RawMessage, 0, 1)}
	for len(rest) > 0 && rest[0] != ']' {
		if len(res.Content) > 0 {
			if rest[0] != ',' {
				return nil, false
			}
			rest = rest[1:]
		}
		if !bytes.HasPrefix(rest, []byte(open)) {
			return nil, false
		}
		n := stringEnd(rest, len(open)-1)
		if n < 0 || n >= len(rest) || rest[n] != '}' {
			return nil, false
		}
		res.Content = append(res.Content, rest[:n+1:n+1])
		rest = rest[n+1:]
	}
	switch string(rest) {
	case "]}", `],"isError":false}`:
	case `],"isError":true}`:
		res.IsError = true
	default:
		return nil, false
	}
	return res, true
}

// stringEnd returns the index just past the JSON string that starts at
// b[i] (a quote), or -1 if there is none there: a control character, an
// escape JSON does not have, or no closing quote. The caller has checked
// that b is valid UTF-8.
func stringEnd(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c == '\\':
			i++
			if i >= len(b) {
				return -1
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					return -1
				}
				for _, h := range b[i+1 : i+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

// Err reports why the instance is closed, or nil while it is usable.
func (i *Instance) Err() error { return i.sb.Err() }

// Close frees the instance. It is idempotent.
func (i *Instance) Close(ctx context.Context) error { return i.sb.Close(ctx) }

// maxSnapshot bounds a state handoff.
const maxSnapshot = 16 << 20

// Snapshot asks the instance for its state, for its plugin's next version
// (see [abi.ExportSnapshot]).
func (i *Instance) Snapshot(ctx context.Context) ([]byte, error) {
	out, err := i.sb.Call(ctx, abi.ExportSnapshot, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if len(out) > maxSnapshot {
		return nil, fmt.Errorf("snapshot: %d bytes is over the %d-byte limit", len(out), maxSnapshot)
	}
	var s abi.Snapshot
	if err := decodeJSON(out, &s); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return out, nil
}

// Restore hands a snapshot of the previous version's instance to this one.
func (i *Instance) Restore(ctx context.Context, snapshot []byte) error {
	if _, err := i.sb.Call(ctx, abi.ExportRestore, snapshot, nil); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// Request runs a v2 request export (get_prompt, read_resource, complete)
// with the MCP params and returns the guest's result JSON.
func (i *Instance) Request(ctx context.Context, export string, params json.RawMessage, cc abi.CallContext, host sandbox.HostFunc) (json.RawMessage, error) {
	b, err := json.Marshal(abi.RequestInput{Request: params, Context: cc})
	if err != nil {
		return nil, err
	}
	out, err := i.sb.Call(ctx, export, b, host)
	if err != nil {
		return nil, err
	}
	var v json.RawMessage
	if err := decodeJSON(out, &v); err != nil {
		return nil, fmt.Errorf("%s: %w", export, err)
	}
	return v, nil
}

// RootsListChanged tells a v2 guest that exports on_roots_list_changed
// that its client's roots changed; meta is the notification's _meta ({}
// when nil). Plugins that do not export it are not called.
func (i *Instance) RootsListChanged(ctx context.Context, meta json.RawMessage) error {
	if !i.plugin.hasExport[abi.ExportOnRootsListChanged] {
		return nil
	}
	if len(meta) == 0 {
		meta = json.RawMessage(`{}`)
	}
	b, err := json.Marshal(abi.NotificationInput{Context: abi.NotificationContext{Meta: meta}})
	if err != nil {
		return err
	}
	if _, err := i.sb.Call(ctx, abi.ExportOnRootsListChanged, b, nil); err != nil {
		return fmt.Errorf("%s: %w", abi.ExportOnRootsListChanged, err)
	}
	return nil
}

// State is an instance's state between calls, saved by
// [Instance.SaveState] to start another instance with
// ([Plugin.RestoreState]).
type State struct {
	// Host is set for a snapshot the host took of the whole guest
	// (memory, globals, Extism vars; see [sandbox.Instance.Snapshot]),
	// which restores only into a plugin of the same sha256. Otherwise
	// Data is the guest's own snapshot ([abi.ExportSnapshot]), which any
	// version exporting [abi.ExportRestore] accepts.
	Host bool
	// SHA256 is the plugin the state was saved from.
	SHA256 string
	// Data is the state; of a host snapshot, its head, the bytes before
	// its compressed frames, which follow in Frames ([State.Bytes] joins
	// them).
	Data []byte
	// Frames, of a host snapshot, are the compressed frames its bytes end
	// with, in order, with their sums ([sandbox.Instance.SnapshotParts]):
	// a store may keep those a state shares with the one before apart.
	// Their bytes are the instance's, not to be written to.
	Frames []sandbox.Frame
}

// Bytes returns the whole state: Data, then the bytes of Frames.
func (s *State) Bytes() []byte {
	if len(s.Frames) == 0 {
		return s.Data
	}
	size := len(s.Data)
	for _, f := range s.Frames {
		size += len(f.Bytes)
	}
	b := append(make([]byte, 0, size), s.Data...)
	for _, f := range s.Frames {
		b = append(b, f.Bytes...)
	}
	return b
}

// SaveState saves the instance's state between calls: a host-side
// snapshot when the host can take one ([Plugin.CanSnapshot]), else the
// guest's own snapshot when the plugin exports the handoff pair
// ([Plugin.HandsOffState]). With neither, it fails with the host's reason,
// an error matching [sandbox.ErrSnapshotRefused]. It must not run during a
// call of the instance.
func (i *Instance) SaveState(ctx context.Context) (*State, error) {
	hostErr := i.plugin.CanSnapshot()
	if hostErr == nil {
		head, frames, err := i.sb.SnapshotParts(ctx)
		if err != nil {
			return nil, fmt.Errorf("plugin %q: %w", i.plugin.name, err)
		}
		return &State{Host: true, SHA256: i.plugin.sha256, Data: head, Frames: frames}, nil
	}
	if i.plugin.HandsOffState() {
		return i.SaveGuestState(ctx)
	}
	return nil, fmt.Errorf("plugin %q: %w, and it exports no %s", i.plugin.name, hostErr, abi.ExportSnapshot)
}

// SaveGuestState saves the guest's own snapshot ([abi.ExportSnapshot]):
// the state a plugin hands to another version of itself.
func (i *Instance) SaveGuestState(ctx context.Context) (*State, error) {
	b, err := i.Snapshot(ctx)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: %w", i.plugin.name, err)
	}
	return &State{SHA256: i.plugin.sha256, Data: b}, nil
}

// RestoreState starts an instance of p with state s, instead of the
// guest's initialisation. A host snapshot restores only into a plugin of
// the same sha256 (else the error matches [sandbox.ErrSnapshotMismatch]),
// whose policy holds it (memory limit); the guest's own state is handed to
// a fresh instance's [abi.ExportRestore].
func (p *Plugin) RestoreState(ctx context.Context, s *State) (*Instance, error) {
	if !s.Host {
		inst, err := p.NewInstance(ctx)
		if err != nil {
			return nil, err
		}
		if err := inst.Restore(ctx, s.Bytes()); err != nil {
			_ = inst.Close(ctx)
			return nil, fmt.Errorf("plugin %q: %w", p.name, err)
		}
		return inst, nil
	}
	if s.SHA256 != p.sha256 {
		return nil, fmt.Errorf("plugin %q: restore: %w: saved from %s, this is %s", p.name, sandbox.ErrSnapshotMismatch, s.SHA256, p.sha256)
	}
	sb, err := p.compiled.Restore(ctx, s.Bytes())
	if err != nil {
		return nil, fmt.Errorf("plugin %q: %w", p.name, err)
	}
	return &Instance{plugin: p, sb: sb}, nil
}
