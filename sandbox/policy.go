package sandbox

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
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
// not valid; start from [NewPolicy]. A Policy is immutable: each WithXxx
// returns a changed copy and never fails, so that options chain; every
// value is checked at once by [Policy.Validate], which [Runtime.Compile]
// calls first.
//
// Nothing is granted by default: no files, no environment, no arguments,
// no network, and guest stdout/stderr go to the log, never to the
// process's stdout. Clocks are real (see [Policy.WithFakeClock]).
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
	askMounts       []Mount
	fakeClock       bool
	images          Images
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
	p.config = maps.Clone(cfg)
	return p
}

// WithEnv sets the environment variables the guest sees through WASI. The
// map is copied. The default is none: the host's environment never leaks.
func (p Policy) WithEnv(env map[string]string) Policy {
	p.env = maps.Clone(env)
	return p
}

// WithFakeClock gives the guest wazero's deterministic clocks instead of
// the real ones: the wall clock reads 2022-01-01T00:00:00Z and advances
// 1 ms per reading, the monotonic clock starts at 0. For reproducible
// runs. By default a guest reads the host's real wall and monotonic
// clocks, as under Extism, hyper-mcp and wassette; docs/SECURITY.md says
// what that gives away. Sleeping never blocks the host either way: a
// guest's sleep returns at once.
func (p Policy) WithFakeClock(fake bool) Policy {
	p.fakeClock = fake
	return p
}

// FakeClock reports whether the guest gets fake clocks.
func (p Policy) FakeClock() bool { return p.fakeClock }

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

// Validate reports every value of p that an instance could not honour,
// joined: a limit or timeout that is not positive, no logger, an empty
// config key, an environment variable WASI cannot pass (empty name, "=" in
// the name, NUL anywhere), an allowed or askable host that is not a host
// name or pattern (a URL, a port, a malformed "[" class), a negative
// network limit, and a mount or ask mount whose host path is not an
// absolute path to an existing folder or whose guest path is not a clean
// absolute path or is mounted twice. Mounts are checked against the file
// system as it is now.
func (p Policy) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("policy: "+format, args...))
	}
	if p.memoryLimit == 0 {
		bad("memory limit: must be positive")
	}
	if p.callTimeout <= 0 {
		bad("call timeout %v: must be positive", p.callTimeout)
	}
	if p.maxOutput == 0 {
		bad("max output: must be positive")
	}
	if p.maxKernelMemory == 0 {
		bad("max kernel memory: must be positive")
	}
	if p.log == nil {
		bad("logger: nil (use a discarding logger to drop guest output)")
	}
	for _, k := range sortedKeys(p.config) {
		if k == "" {
			bad("config: empty key")
		}
	}
	for _, k := range sortedKeys(p.env) {
		switch {
		case k == "":
			bad("env: empty variable name")
		case strings.ContainsAny(k, "=\x00"):
			bad("env %q: the name has \"=\" or NUL", k)
		case strings.ContainsRune(p.env[k], 0):
			bad("env %q: the value has NUL", k)
		}
	}
	for _, h := range p.network.AllowedHosts {
		if err := CheckHostGrant(h); err != nil { // host, host:port, [v6]:port, patterns
			bad("network: %v", err)
		}
	}
	for _, h := range p.network.Ask {
		if err := CheckHostGrant(h); err != nil {
			bad("network: ask: %v", err)
		}
	}
	if p.network.MaxResponse < 0 {
		bad("network: max response %d: must not be negative (0 means the default)", p.network.MaxResponse)
	}
	if p.network.Timeout < 0 {
		bad("network: timeout %v: must not be negative (0 means the default)", p.network.Timeout)
	}
	guests := map[string]bool{}
	for _, m := range append(slices.Clone(p.mounts), p.askMounts...) {
		if !filepath.IsAbs(m.HostPath) {
			bad("mount %q: the host path must be absolute", m.HostPath)
		} else if info, err := os.Stat(m.HostPath); err != nil {
			bad("mount %q: %v", m.HostPath, err)
		} else if !info.IsDir() {
			bad("mount %q: the host path is not a folder", m.HostPath)
		}
		guest := m.GuestPath
		if guest == "" {
			guest = "/"
		}
		if !path.IsAbs(guest) || path.Clean(guest) != guest {
			bad("mount %q: guest path %q: must be a clean absolute path", m.HostPath, m.GuestPath)
		} else if guests[guest] {
			bad("mount %q: guest path %q is mounted twice", m.HostPath, guest)
		}
		guests[guest] = true
	}
	return errors.Join(errs...)
}

// sortedKeys returns m's keys in order, so that errors come in a stable
// order.
func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
