package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/wasmtools/wasmtools/internal/config"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// prefixes is a repeatable NAME=PREFIX flag.
type prefixes map[string]string

func (p prefixes) String() string { return fmt.Sprint(map[string]string(p)) }
func (p prefixes) Set(v string) error {
	name, prefix, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return errors.New("want PLUGIN=PREFIX")
	}
	p[name] = prefix
	return nil
}

// names is a repeatable PLUGIN flag.
type names map[string]bool

func (n names) String() string { return fmt.Sprint(map[string]bool(n)) }
func (n names) Set(v string) error {
	n[v] = true
	return nil
}

// commonFlags are the flags of every command that loads plugins.
type commonFlags struct {
	cacheDir   string
	interrupt  interruption
	verbose    bool
	prefix     prefixes
	stateless  names
	configPath string
	// hyperPath is hyper-mcp's configuration file (serve's
	// --hyper-mcp-config), mapped over configPath's; "" for none.
	hyperPath string

	mu  sync.Mutex
	cfg *config.File // the configuration in force; empty without --config
	// cfgSum is the digest of the files cfg was read from (filesDigest),
	// taken before they were read: an edit made meanwhile differs.
	cfgSum [sha256.Size]byte
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	c.prefix = prefixes{}
	c.stateless = names{}
	fs.StringVar(&c.configPath, "config", "", "the operator's configuration FILE (TOML): grants, limits, pins per plugin; see README")
	fs.Var(c.stateless, "stateless", "PLUGIN: the plugin keeps no state between calls; serve it from a shared pool of warm instances (repeatable)")
	fs.StringVar(&c.cacheDir, "cache-dir", defaultCacheDir(), "where compiled plugins are cached between runs (\"\" for no disk cache)")
	fs.Var(&c.interrupt, "interrupt", "how a guest is stopped at its deadline: flag (a check wasmtools compiles into each plugin; the default) or wazero (wazero's own check: several times slower; a fallback)")
	fs.BoolVar(&c.verbose, "v", false, "log debug messages")
	fs.Var(c.prefix, "prefix", "PLUGIN=PREFIX: serve PLUGIN's tools as PREFIX+name (repeatable)")
}

// loadConfig reads --config, if given, into c.cfg, with hyper-mcp's
// configuration (--hyper-mcp-config) mapped over it. As hyper-mcp does,
// HYPER_MCP_INSECURE_SKIP_SIGNATURE=true overrides the latter's
// oci.insecure_skip_signature.
func (c *commonFlags) loadConfig(lookupEnv func(string) (string, bool)) error {
	sum := c.filesDigest()
	cfg := &config.File{}
	if c.configPath != "" {
		var err error
		if cfg, err = config.Load(c.configPath, lookupEnv); err != nil {
			return err
		}
	}
	if c.hyperPath != "" {
		h, err := config.LoadHyperMCP(c.hyperPath, lookupEnv)
		if err != nil {
			return err
		}
		if v, ok := lookupEnv("HYPER_MCP_INSECURE_SKIP_SIGNATURE"); ok && v != "" {
			skip, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("HYPER_MCP_INSECURE_SKIP_SIGNATURE: %q is not true or false", v)
			}
			h.Defaults.InsecureSkipSignature = &skip
		}
		if err := cfg.Overlay(h); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.cfg, c.cfgSum = cfg, sum
	c.mu.Unlock()
	return nil
}

// filesDigest is a digest of the configuration files' bytes now (a file
// that cannot be read counts as such).
func (c *commonFlags) filesDigest() [sha256.Size]byte {
	h := sha256.New()
	for _, p := range []string{c.configPath, c.hyperPath} {
		if p == "" {
			continue
		}
		b, err := os.ReadFile(p)
		fmt.Fprintf(h, "%t %d\n", err == nil, len(b))
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// configChanged reports whether the configuration files differ from
// those the configuration in force was read from.
func (c *commonFlags) configChanged() bool {
	sum := c.filesDigest()
	c.mu.Lock()
	defer c.mu.Unlock()
	return sum != c.cfgSum
}

func (c *commonFlags) config() *config.File {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cfg == nil {
		return &config.File{}
	}
	return c.cfg
}

func (c *commonFlags) runtime(log *slog.Logger) (*sandbox.Runtime, error) {
	return sandbox.NewRuntime(c.runtimeOptions(log))
}

// runtimeOptions are the runtime's options: the flags', and the cache
// folder's bounds of the configuration in force (read once, at start).
func (c *commonFlags) runtimeOptions(log *slog.Logger) sandbox.Options {
	checked, compiled := c.config().Cache.Bounds()
	return sandbox.Options{CacheDir: c.cacheDir, Logger: log, Interruption: sandbox.Interruption(c.interrupt),
		CheckedCacheBytes: checked, CompiledCacheBytes: compiled}
}

// interruption is the --interrupt flag: "flag" or "wazero".
type interruption sandbox.Interruption

func (i *interruption) String() string {
	if sandbox.Interruption(*i) == sandbox.InterruptWazero {
		return "wazero"
	}
	return "flag"
}

func (i *interruption) Set(s string) error {
	switch s {
	case "flag":
		*i = interruption(sandbox.InterruptFlag)
	case "wazero":
		*i = interruption(sandbox.InterruptWazero)
	default:
		return fmt.Errorf("%q is neither flag nor wazero", s)
	}
	return nil
}

// optsFor gives each plugin file its options: the configuration's, with
// the command-line flags over them.
func (c *commonFlags) optsFor(log *slog.Logger) func(path string) plugins.Options {
	cfg := c.config()
	return func(path string) plugins.Options {
		name := pluginName(path)
		eff := cfg.For(name)
		opts := eff.Options
		pol := opts.Policy.WithLogger(log.With("plugin", name))
		opts.Policy = &pol
		if p, ok := c.prefix[name]; ok {
			opts.Prefix = p
		}
		if c.stateless[name] {
			opts.Stateless = true
		}
		opts.Disabled = !eff.Enabled
		return opts
	}
}

// check refuses bytes that do not match the configuration's sha256 pin.
func (c *commonFlags) check() func(path string, wasm []byte) error {
	cfg := c.config()
	return func(path string, wasm []byte) error {
		pin := cfg.For(pluginName(path)).SHA256
		if pin == "" {
			return nil
		}
		sum := sha256.Sum256(wasm)
		if got := hex.EncodeToString(sum[:]); got != pin {
			return fmt.Errorf("sha256 %s does not match the pin %s in the configuration", got, pin)
		}
		return nil
	}
}

func pluginName(path string) string {
	return strings.TrimSuffix(filepath.Base(path), ".wasm")
}

// warnUnknownNames says which plugin names the configuration ([plugins.NAME]
// with no source), --prefix and --stateless give that no plugin served
// has: a misspelt name would otherwise leave its grant, prefix or setting
// unapplied without a word. Not an error: the plugin may be deployed
// later, and the setting then applies.
func (c *commonFlags) warnUnknownNames(log *slog.Logger, served func(name string) bool) {
	say := func(where, name string) {
		if !served(name) {
			log.Warn("a setting names a plugin that is not served (a plugin's name is its file's, without .wasm): it applies if one comes", "where", where, "plugin", name)
		}
	}
	cfg := c.config()
	for _, name := range slices.Sorted(maps.Keys(cfg.Plugins)) {
		if cfg.Plugins[name].Source == "" {
			say("[plugins."+name+"]", name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.prefix)) {
		say("--prefix", name)
	}
	for _, name := range slices.Sorted(maps.Keys(c.stateless)) {
		say("--stateless", name)
	}
}
