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
func (i *Instance) CallTool(ctx context.Context, c Call) (*abi.CallToolResult, error) {
	if !c.Tool.plugin.SameCode(i.plugin) {
		return nil, fmt.Errorf("tool %q belongs to plugin %q, not %q", c.Tool.Name, c.Tool.plugin.name, i.plugin.name)
	}
	params := abi.CallParams{Name: c.Tool.Def.Name, Arguments: c.Arguments, Meta: c.Meta}
	var export string
	var input any
	if i.plugin.iface == abi.InterfaceServlet {
		export, input = abi.ExportCall, abi.ServletCallInput{Params: params}
	} else {
		export, input = abi.ExportCallTool, abi.CallToolInput{Request: params, Context: c.Context}
	}
	b, err := json.Marshal(input)
	if err != nil {
		return nil, fmt.Errorf("encode call: %w", err)
	}
	out, err := i.sb.Call(ctx, export, b, c.Host)
	if err != nil {
		return nil, err
	}
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
