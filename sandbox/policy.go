package sandbox

import (
	"log/slog"
	"maps"
	"time"
)

// Defaults of a [Policy]. They are restrictive on purpose: a plugin is
// untrusted code, and the operator widens what one plugin gets.
const (
	// DefaultMemoryLimit bounds one instance's linear memory.
	DefaultMemoryLimit = 64 << 20
	// DefaultCallTimeout bounds one export call, and an instance's
	// initialisation.
	DefaultCallTimeout = 30 * time.Second
	// DefaultMaxOutput bounds the bytes one call may return.
	DefaultMaxOutput = 4 << 20
	// DefaultCompileTimeout bounds compiling one module. Compiling a 4 MiB
	// Go plugin takes about 2 s on an idle machine, but 10 s on a loaded
	// one and 80 s under the race detector (measured on 2 cores at a load
	// of 12), and a module may be 16 times that size. Compiled code is
	// cached, so a plugin pays it once.
	DefaultCompileTimeout = 2 * time.Minute
	// DefaultLoadTimeout bounds loading a plugin after compiling it:
	// instantiating it and listing its tools, prompts and resources. It is
	// well under the 30 to 60 s that MCP clients wait for a server to
	// initialise, so that one slow plugin cannot make a client give up.
	DefaultLoadTimeout = 10 * time.Second
	// DefaultMaxKernelMemory bounds the host-side Extism memory blocks one
	// call may allocate (input and output included).
	DefaultMaxKernelMemory = 16 << 20
)

const wasmPageSize = 65536

// Policy is what one plugin's instances may do and use. The zero value is
// not useful; start from [NewPolicy]. A Policy is immutable: each WithXxx
// returns a changed copy and never fails; values are checked where the
// policy is used ([Runtime.Compile]).
//
// Nothing is granted by default: no files, no environment, no arguments,
// no network, no real clock, and guest stdout/stderr go to the log, never
// to the process's stdout.
type Policy struct {
	memoryLimit     uint64
	callTimeout     time.Duration
	maxOutput       uint64
	maxKernelMemory uint64
	compileTimeout  time.Duration
	loadTimeout     time.Duration
	moduleLimits    ModuleLimits
	log             *slog.Logger
	config          map[string]string
	env             map[string]string
	network         Network
	mounts          []Mount
}

// NewPolicy returns the default policy: the Default* limits, nothing
// granted, and guest output discarded.
func NewPolicy() Policy {
	return Policy{
		memoryLimit:     DefaultMemoryLimit,
		callTimeout:     DefaultCallTimeout,
		maxOutput:       DefaultMaxOutput,
		maxKernelMemory: DefaultMaxKernelMemory,
		compileTimeout:  DefaultCompileTimeout,
		loadTimeout:     DefaultLoadTimeout,
		log:             slog.New(slog.DiscardHandler),
	}
}

// WithMemoryLimit bounds each instance's linear memory, in bytes, rounded
// down to whole 64 KiB pages (at least one). A guest's memory.grow past it
// fails as the Wasm spec says (the guest sees -1), and a module whose
// minimum memory is larger does not compile.
func (p Policy) WithMemoryLimit(bytes uint64) Policy {
	p.memoryLimit = bytes
	return p
}

// WithCallTimeout bounds one export call. An overrun stops the guest even
// if it never calls the host, fails with an error matching
// context.DeadlineExceeded, and leaves the instance closed.
func (p Policy) WithCallTimeout(d time.Duration) Policy {
	p.callTimeout = d
	return p
}

// WithMaxOutput bounds the bytes one call may return. A guest that sets a
// larger output traps before the host copies it.
func (p Policy) WithMaxOutput(bytes uint64) Policy {
	p.maxOutput = bytes
	return p
}

// WithMaxKernelMemory bounds the Extism memory blocks one call may hold.
func (p Policy) WithMaxKernelMemory(bytes uint64) Policy {
	p.maxKernelMemory = bytes
	return p
}

// WithCompileTimeout bounds compiling the module ([Runtime.Compile]). An
// overrun fails with an error matching context.DeadlineExceeded. wazero
// cannot stop inside one function's compilation, so the compilation goes
// on in the background until the function it is in is done (a time that
// [ModuleLimits] bound), and is then dropped; Compile returns at the
// deadline.
func (p Policy) WithCompileTimeout(d time.Duration) Policy {
	p.compileTimeout = d
	return p
}

// WithLoadTimeout bounds what a host does to load a plugin once it is
// compiled: instantiating it and asking it for its tools. It is separate
// from the call timeout, which bounds each call within the load too.
// The sandbox does not apply it itself; [Policy.LoadTimeout] reports it.
func (p Policy) WithLoadTimeout(d time.Duration) Policy {
	p.loadTimeout = d
	return p
}

// WithModuleLimits sets what a module may ask the compiler to do; a zero
// field keeps its default. A module over a limit does not compile, with a
// [*LimitError] naming the limit and the value.
func (p Policy) WithModuleLimits(l ModuleLimits) Policy {
	p.moduleLimits = l
	return p
}

// WithLogger sets where guest stdout, stderr and log calls go. The default
// discards them.
func (p Policy) WithLogger(l *slog.Logger) Policy {
	p.log = l
	return p
}

// WithConfig sets the values the guest reads with the Extism config_get
// import. The map is copied.
func (p Policy) WithConfig(cfg map[string]string) Policy {
	c := make(map[string]string, len(cfg))
	for k, v := range cfg {
		c[k] = v
	}
	p.config = c
	return p
}

// WithEnv sets the environment variables the guest sees through WASI. The
// map is copied. The default is none: the host's environment never leaks.
func (p Policy) WithEnv(env map[string]string) Policy {
	c := make(map[string]string, len(env))
	for k, v := range env {
		c[k] = v
	}
	p.env = c
	return p
}

// Config returns a copy of the config values granted.
func (p Policy) Config() map[string]string { return maps.Clone(p.config) }

// Env returns a copy of the environment granted.
func (p Policy) Env() map[string]string { return maps.Clone(p.env) }

// MemoryLimit reports the per-instance memory limit in bytes.
func (p Policy) MemoryLimit() uint64 { return p.memoryLimit }

// CallTimeout reports the per-call timeout.
func (p Policy) CallTimeout() time.Duration { return p.callTimeout }

// CompileTimeout reports the compile timeout.
func (p Policy) CompileTimeout() time.Duration { return p.compileTimeout }

// LoadTimeout reports the load timeout (see [Policy.WithLoadTimeout]).
func (p Policy) LoadTimeout() time.Duration { return p.loadTimeout }

// ModuleLimits reports the module limits, defaults filled in.
func (p Policy) ModuleLimits() ModuleLimits { return p.moduleLimits.withDefaults() }

func (p Policy) memoryLimitPages() uint32 {
	pages := p.memoryLimit / wasmPageSize
	if pages < 1 {
		pages = 1
	}
	if pages > 65536 {
		pages = 65536
	}
	return uint32(pages)
}
