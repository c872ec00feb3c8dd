package plugins

import (
	"context"
	"encoding/json"
	"fmt"

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
	var in any
	if i.plugin.iface == abi.InterfaceServlet {
		export, in = abi.ExportCall, abi.ServletCallInput{Params: params}
	} else {
		export, in = abi.ExportCallTool, abi.CallToolInput{Request: params, Context: c.Context}
	}
	if input, err = json.Marshal(in); err != nil {
		return "", nil, fmt.Errorf("encode call: %w", err)
	}
	return export, input, nil
}

// decodeResult decodes the output of a call of export.
func decodeResult(export string, out []byte) (*abi.CallToolResult, error) {
	var res abi.CallToolResult
	if err := decodeJSON(out, &res); err != nil {
		return nil, fmt.Errorf("%s: %w", export, err)
	}
	return &res, nil
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
