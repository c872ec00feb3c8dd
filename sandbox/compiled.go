package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/wasmtools/wasmtools/abi"
)

// Compiled is a validated, compiled module, ready to instantiate. It is safe
// for concurrent use. Close it once no instance is needed: closing it
// closes every instance made from it.
type Compiled struct {
	rt     wazero.Runtime
	mod    wazero.CompiledModule
	policy Policy

	imports []Func
	exports []Func

	fsConfig wazero.FSConfig // the mounts; nil for none
	roots    []*os.Root      // the mounted folders, closed with the module
	asks     []askRoot       // the ask mounts (askfiles.go); their roots are in roots
	net      netClient       // the instances' HTTP connections, closed with the module

	// sha256 is the digest of the module's bytes as given to Compile,
	// which a snapshot names. snap says whether the host can snapshot
	// its instances, and how (snapshot.go).
	sha256 [32]byte
	snap   *snapModule
	// customs are the custom sections kept out of wazero's bytes
	// (splitCustom); the rest are mod's.
	customs customSections

	closeOnce  sync.Once
	closeErr   error
	closedFlag atomic.Bool // Closed

	// calls holds how to stop each call running in an instance of the
	// module, which Close stops before it frees them.
	calls struct {
		sync.Mutex
		closed bool
		stop   map[*Instance]callStop
	}
}

// callStop is how Close stops a call: its context's cancel, then the
// guest's interrupt flag (nil while an instance starts: its
// initialisation's flag is set as its context ends).
type callStop struct {
	cancel context.CancelCauseFunc
	intr   *interrupter
}

// startCall registers i's call, stopped by Close with cancel and intr; it
// reports false once the module is closed.
func (c *Compiled) startCall(i *Instance, cancel context.CancelCauseFunc, intr *interrupter) bool {
	c.calls.Lock()
	defer c.calls.Unlock()
	if c.calls.closed {
		return false
	}
	if c.calls.stop == nil {
		c.calls.stop = make(map[*Instance]callStop)
	}
	c.calls.stop[i] = callStop{cancel, intr}
	return true
}

func (c *Compiled) endCall(i *Instance) {
	c.calls.Lock()
	delete(c.calls.stop, i)
	c.calls.Unlock()
}

// Func names a function a module imports or exports, with its signature in
// WebAssembly text format, such as "(i64) -> (i32)".
type Func struct {
	Module    string `json:"module,omitempty"` // imports only
	Name      string `json:"name"`
	Signature string `json:"signature"`
}

// defineHost defines the host modules a guest may import in rt.
func defineHost(ctx context.Context, rt wazero.Runtime) error {
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, rt); err != nil {
		return fmt.Errorf("sandbox: define %s: %w", abi.WASIModule, err)
	}
	if err := instantiateKernel(ctx, rt); err != nil {
		return fmt.Errorf("sandbox: define %s: %w", abi.EnvModule, err)
	}
	if err := instantiateUser(ctx, rt); err != nil {
		return fmt.Errorf("sandbox: define %s: %w", abi.UserModule, err)
	}
	return nil
}

func newCompiled(rt wazero.Runtime, mod wazero.CompiledModule, p Policy) (*Compiled, error) {
	var err error
	c := &Compiled{rt: rt, mod: mod, policy: p}
	if c.fsConfig, c.roots, err = p.fsConfig(); err != nil {
		return nil, err
	}
	asks, roots, err := p.openAskMounts()
	if err != nil {
		closeRoots(c.roots)
		return nil, err
	}
	c.asks, c.roots = asks, append(c.roots, roots...)
	for _, d := range mod.ExportedFunctions() {
		names := slices.DeleteFunc(slices.Clone(d.ExportNames()), func(n string) bool { return n == startExport })
		if len(names) == 0 {
			continue // the start function, exported by instrument only
		}
		c.exports = append(c.exports, Func{Name: names[0], Signature: signature(d)})
	}
	slices.SortFunc(c.exports, func(a, b Func) int { return strings.Compare(a.Name, b.Name) })

	var problems []string
	for _, d := range mod.ImportedFunctions() {
		modName, name, _ := d.Import()
		c.imports = append(c.imports, Func{Module: modName, Name: name, Signature: signature(d)})
		host := rt.Module(modName)
		var f api.FunctionDefinition
		if host != nil {
			f = host.ExportedFunctionDefinitions()[name]
		}
		switch {
		case f == nil:
			problems = append(problems, fmt.Sprintf("%s.%s, which this host does not provide", modName, name))
		case signature(f) != signature(d):
			problems = append(problems, fmt.Sprintf("%s.%s as %s, but this host provides %s", modName, name, signature(d), signature(f)))
		}
	}
	for name, d := range mod.ImportedMemories() {
		m, n, _ := d.Import()
		_ = name
		problems = append(problems, fmt.Sprintf("memory %s.%s, but a plugin must define its own memory", m, n))
	}
	if len(problems) > 0 {
		closeRoots(c.roots)
		return nil, fmt.Errorf("unsupported imports: %s", strings.Join(problems, "; "))
	}
	if mem := mod.ExportedMemories(); len(mem) == 0 {
		// Extism guests exchange bytes through host calls, but WASI
		// needs the guest's memory to pass buffers.
		if len(mod.ImportedFunctions()) > 0 && slices.ContainsFunc(c.imports, func(f Func) bool { return f.Module == abi.WASIModule }) {
			closeRoots(c.roots)
			return nil, errors.New("imports WASI but exports no memory")
		}
	}
	return c, nil
}

func signature(d api.FunctionDefinition) string {
	names := func(ts []api.ValueType) string {
		s := make([]string, len(ts))
		for i, t := range ts {
			s[i] = api.ValueTypeName(t)
		}
		return strings.Join(s, ", ")
	}
	return "(" + names(d.ParamTypes()) + ") -> (" + names(d.ResultTypes()) + ")"
}

// Imports lists the functions the module imports, in module order.
func (c *Compiled) Imports() []Func { return slices.Clone(c.imports) }

// ImportsFunc reports whether the module imports function name of module.
func (c *Compiled) ImportsFunc(module, name string) bool {
	for _, f := range c.imports {
		if f.Module == module && f.Name == name {
			return true
		}
	}
	return false
}

// Exports lists the functions the module exports, sorted by name.
func (c *Compiled) Exports() []Func { return slices.Clone(c.exports) }

// Contained reports whether a call of an instance of the module can have
// no effect outside the instance but lines in the host's log: the module
// imports no function of the host's own ([abi.UserModule]: progress,
// logs to the client, questions, secrets, ...), and its policy grants no
// network, no folder, and no grant to be asked for at run time. Such a
// call may run on an instance that turns out to be stale and be run
// again, with nothing outside it telling the difference.
func (c *Compiled) Contained() bool {
	for _, f := range c.imports {
		if f.Module == abi.UserModule {
			return false
		}
	}
	p := c.policy
	return len(p.network.AllowedHosts) == 0 && len(p.network.Ask) == 0 && len(p.mounts) == 0 && len(p.askMounts) == 0
}

// HasExport reports whether the module exports a function named name.
func (c *Compiled) HasExport(name string) bool {
	_, ok := c.mod.ExportedFunctions()[name]
	return ok && name != startExport
}

// CustomSection returns the contents of the first custom section named
// name, or nil.
func (c *Compiled) CustomSection(name string) []byte {
	if data, ok := c.customs.first(name); ok {
		return data
	}
	for _, s := range c.mod.CustomSections() {
		if s.Name() == name {
			return s.Data()
		}
	}
	return nil
}

// Policy returns the policy the module was compiled under.
func (c *Compiled) Policy() Policy { return c.policy }

// Closed reports whether Close was called. Safe for concurrent use.
func (c *Compiled) Closed() bool { return c.closedFlag.Load() }

// Close closes every instance of the module and frees its machine code.
// A call running in one of them is stopped, failing with a [TrapError]
// that matches [ErrClosed]. It is idempotent.
func (c *Compiled) Close(ctx context.Context) error {
	c.closeOnce.Do(func() {
		c.closedFlag.Store(true)
		// Stop the running calls first: wazero's close does not stop a
		// guest the host interrupts itself (interrupt.go).
		c.calls.Lock()
		c.calls.closed = true
		for _, stop := range c.calls.stop {
			// Under the lock, which endCall takes as the call ends:
			// no later call's flag is set.
			stop.cancel(ErrClosed)
			stop.intr.interrupt()
		}
		c.calls.Unlock()
		c.closeErr = c.rt.Close(ctx)
		if c.snap != nil && c.snap.image != nil && c.snap.image.file != nil {
			c.snap.image.file.close() // mappings of it outlive the descriptor
		}
		closeRoots(c.roots)
		c.net.close()
	})
	return c.closeErr
}
