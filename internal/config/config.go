// Package config reads the operator's configuration file (TOML): what
// each plugin is granted and how it is limited, global limits, and the HTTP
// transport's protection. A plugin with no entry gets the defaults, and the
// defaults grant nothing.
//
//	[defaults]
//	memory_limit = "64MiB"
//	call_timeout = "30s"
//	compile_timeout = "2m"
//	load_timeout = "10s"
//
//	[defaults.module]
//	max_module_size = "64MiB"
//	max_nesting = 2048
//
//	[limits]
//	memory_budget = "2GiB"
//	max_concurrent_calls = 64
//
//	[http]
//	auth_token = "${WASMTOOLS_TOKEN}"
//	metrics_public = false
//	body_timeout = "30s"
//
//	[http.tokens]
//	alice = "${ALICE_TOKEN}"
//
//	[sources]
//	refresh_interval = "10m"
//	public_key = "/etc/wasmtools/cosign.pub"
//
//	[registries."ghcr.io"]
//	username = "bot"
//	password = "${GHCR_TOKEN}"
//
//	[plugins.time]
//	source = "oci://ghcr.io/tuananh/time-plugin:latest"
//
//	[plugins.fetcher]
//	sha256 = "9f2c…"
//	allowed_hosts = ["api.example.com", "*.example.org", "127.0.0.1:18409"]
//	allowed_paths = [{ host = "/srv/data", guest = "/data", mode = "ro" }]
//	config = { api_key = "${API_KEY}" }
//	tools = { deny = ["debug_*"] }
//	clock = "fake"
//	secrets = { "github/bot" = "${GITHUB_TOKEN}" }
//	access_tokens = { "my-client-id" = "${API_TOKEN}" }
//
//	[plugins.weather.ask]
//	hosts = ["api.weather.example:443", "*.tiles.example"]
//	secrets = { "weather/key" = "${WEATHER_KEY}" }
//
//	[grants]
//	max_questions = 10
//
//	[cache]
//	checked_bytes = "1GiB"
//	compiled_bytes = "2GiB"
//
// ${VAR} in any string is replaced by the host environment variable VAR
// when the file is read; a variable that is not set is an error naming
// every such variable at once, and a variable set to "" is a value.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/wasmtools/wasmtools/internal/auth"
	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// File is the configuration file.
type File struct {
	Defaults Plugin            `toml:"defaults"`
	Limits   Limits            `toml:"limits"`
	HTTP     HTTP              `toml:"http"`
	Sources  Sources           `toml:"sources"`
	Grants   Grants            `toml:"grants"`
	Cache    Cache             `toml:"cache"`
	Plugins  map[string]Plugin `toml:"plugins"`
	// Registries are logins, by host[:port], for OCI registries and
	// HTTPS plugin servers; a registry without one uses the Docker
	// config file's.
	Registries map[string]Credential `toml:"registries"`

	// urlAuths are hyper-mcp's auths: logins for HTTPS sources whose URL
	// starts with the key, the longest key first.
	urlAuths map[string]Credential
}

// Sources configures plugins fetched from remote sources (see the
// plugins' source setting).
type Sources struct {
	// RefreshInterval, if set, resolves every remote source again this
	// often (a moved tag is fetched, verified and swapped in); 0 means
	// only at start and on `wasmtools reload`.
	RefreshInterval Duration `toml:"refresh_interval"`
	// Timeout bounds one source's fetch; 0 means 5m.
	Timeout Duration `toml:"timeout"`
	// StageTimeout bounds each stage of a fetch before the download
	// (resolving a tag, verifying its signature, reading its manifest),
	// so that a registry that stalls or trickles is given up on; 0 means
	// 30s.
	StageTimeout Duration `toml:"stage_timeout"`
	// PublicKey is the PEM public key (as cosign writes it) that OCI
	// plugins' signatures are verified with, for plugins without a
	// public_key of their own.
	PublicKey string `toml:"public_key"`
	// DockerConfig is the Docker config file whose registry logins are
	// used; "" means the default ($DOCKER_CONFIG, ~/.docker), "-" none.
	DockerConfig string `toml:"docker_config"`
}

// Cache bounds the two halves of the --cache-dir folder, each per build
// of wasmtools (and wazero version): past a bound, what was used least
// recently goes. Read at start; a change needs a restart.
type Cache struct {
	// CheckedBytes bounds the plugins as checked and rewritten for the
	// sandbox; unset means 1GiB.
	CheckedBytes *Size `toml:"checked_bytes"`
	// CompiledBytes bounds wazero's machine code; unset means 2GiB.
	CompiledBytes *Size `toml:"compiled_bytes"`
}

// Bounds returns the bounds as sandbox.Options takes them: 0 for unset
// (the default).
func (c Cache) Bounds() (checked, compiled int64) {
	get := func(s *Size) int64 {
		if s == nil {
			return 0
		}
		return int64(*s)
	}
	return get(c.CheckedBytes), get(c.CompiledBytes)
}

// check refuses a bound of 0, which could be read as the default (the
// convention of other sizes here), as no bound (the folder growing with
// every module ever compiled) or as no cache: each would surprise
// someone, and the first two with a full disk. No disk cache is
// --cache-dir "".
func (c Cache) check() error {
	var errs []error
	for _, b := range []struct {
		name string
		v    *Size
	}{{"checked_bytes", c.CheckedBytes}, {"compiled_bytes", c.CompiledBytes}} {
		switch {
		case b.v == nil:
		case *b.v == 0:
			errs = append(errs, fmt.Errorf("cache.%s: 0: want a size above 0 (unset: the default; no disk cache at all: --cache-dir \"\")", b.name))
		case uint64(*b.v) > math.MaxInt64:
			errs = append(errs, fmt.Errorf("cache.%s: %d bytes: too large", b.name, uint64(*b.v)))
		}
	}
	return errors.Join(errs...)
}

// Credential is a registry login: username and password, or a token.
type Credential struct {
	Username string `toml:"username"`
	Password string `toml:"password"`
	Token    string `toml:"token"`
}

// Plugin is one plugin's settings; an unset field takes the [defaults]
// value, then the built-in default.
type Plugin struct {
	Enabled *bool `toml:"enabled"`
	// Source names a remote plugin: oci://REGISTRY/REPO:TAG (or
	// @sha256:DIGEST), https://… (http:// on loopback only) or
	// file:///PATH. Only in [plugins.NAME].
	Source string `toml:"source"`
	// SHA256 pins the plugin's bytes, for every kind of source.
	SHA256 string `toml:"sha256"`
	// PublicKey is the PEM public key an OCI source's cosign signature
	// must verify with (over [sources] public_key).
	PublicKey string `toml:"public_key"`
	// InsecureSkipSignature serves an OCI source without verifying its
	// signature, and an HTTPS source without a pin: logged as a warning
	// on every fetch.
	InsecureSkipSignature *bool  `toml:"insecure_skip_signature"`
	Prefix                string `toml:"prefix"`
	Stateless             *bool  `toml:"stateless"`
	// HandleNote false leaves out of the plugin's results the note that
	// tells a 2026-07-28 client's model its session handle (the handle
	// stays in _meta): for results a client checks exactly.
	HandleNote *bool `toml:"handle_note"`
	// Images says whether new instances start from a pre-initialised
	// image (sandbox.Policy.WithImages): true always, false never; unset,
	// as the plugin's wasmtools.image section says, and on without one.
	Images *bool `toml:"images"`
	// Access, if set, says who may list and use the plugin's tools,
	// prompts and resources (only in [plugins.NAME]); unset, everyone.
	Access *Access `toml:"access"`

	MemoryLimit    Size     `toml:"memory_limit"`
	CallTimeout    Duration `toml:"call_timeout"`
	CompileTimeout Duration `toml:"compile_timeout"`
	LoadTimeout    Duration `toml:"load_timeout"`
	MaxOutput      Size     `toml:"max_output"`
	// Module bounds what the plugin's module may ask the compiler to do
	// (sandbox.ModuleLimits); each unset field takes the [defaults.module]
	// value, then the built-in default.
	Module Module `toml:"module"`

	AllowedHosts         []string          `toml:"allowed_hosts"`
	AllowPrivateNetworks *bool             `toml:"allow_private_networks"`
	AllowedPaths         []Path            `toml:"allowed_paths"`
	Config               map[string]string `toml:"config"`
	Env                  map[string]string `toml:"env"`
	Tools                Tools             `toml:"tools"`
	MaxInstances         int               `toml:"max_instances"`

	// Clock is "real" (the default: the host's wall and monotonic
	// clocks) or "fake" (a fixed epoch, for deterministic runs).
	Clock string `toml:"clock"`
	// Secrets grants keyring secrets, "service/user" = value, served to
	// the plugin's get_keyring_secret (hyper-mcp's host function).
	Secrets map[string]string `toml:"secrets"`
	// AccessTokens gives OAuth access tokens, client_id = token, served
	// to the plugin's get_access_token before any token endpoint is asked.
	AccessTokens map[string]string `toml:"access_tokens"`

	// Ask is the ceiling of run-time grants: what the plugin may ask the
	// person using a client for, and get if they agree. Empty asks
	// nothing.
	Ask Ask `toml:"ask"`

	// hyperSecrets are the keyring entries ("service/user") a hyper-mcp
	// configuration grants, whose values must be in Secrets.
	hyperSecrets map[string]bool
	// hyperHosts: AllowedHosts came from a hyper-mcp configuration and
	// are read as Extism reads them (sandbox.Network.Extism).
	hyperHosts bool
	// hyperSkip are hyper-mcp's skip_prompts, skip_resources and
	// skip_resource_templates.
	hyperSkip plugins.Skip
}

// Ask is what a plugin may ask for at run time (issue 30): the host asks
// the client's user, through elicitation, and grants it only if they
// agree. Nothing outside it is ever asked for.
type Ask struct {
	// Hosts are network destinations, written as allowed_hosts entries
	// (host, host:port, patterns with *). allow_private_networks applies
	// to them too.
	Hosts []string `toml:"hosts"`
	// Paths are host folders, each seen by the guest at its guest path,
	// that the person may let it read ("ro", the default) or read and
	// change ("rw": the person is asked for reading and, on the first
	// change, for changing). A grant lasts for the call, or the session.
	Paths []Path `toml:"paths"`
	// Secrets are keyring secrets ("service/user" = value) served to
	// get_keyring_secret once the person agrees. Only in [plugins.NAME]:
	// a secret is never in every plugin's ceiling.
	Secrets map[string]string `toml:"secrets"`
}

// Grants are the host's settings for run-time grants.
type Grants struct {
	// MaxQuestions bounds the grant questions one session may be asked,
	// across its plugins; past it, grants not already given are refused
	// without asking. 0 means 10.
	MaxQuestions int `toml:"max_questions"`
	// RememberFile, if set, keeps answers per subject across sessions and
	// restarts in this JSON file (made if missing, mode 0600): the person
	// is offered "always allow" too, and "deny" is kept. `wasmtools
	// grants list|revoke` reads and changes it. A relative path is
	// relative to the configuration file.
	RememberFile string `toml:"remember_file"`
}

// Module is sandbox.ModuleLimits in the configuration file. A module over
// one is refused, the error naming the setting (such as max_nesting).
type Module struct {
	MaxModuleSize     Size   `toml:"max_module_size"`
	MaxFunctions      uint32 `toml:"max_functions"`
	MaxFunctionSize   Size   `toml:"max_function_size"`
	MaxNesting        uint32 `toml:"max_nesting"`
	MaxBlocks         uint32 `toml:"max_blocks"`
	MaxLoops          uint32 `toml:"max_loops"`
	MaxBrTableTargets uint32 `toml:"max_br_table_targets"`
	MaxLocals         uint32 `toml:"max_locals"`
	MaxTables         uint32 `toml:"max_tables"`
	MaxTableSize      uint32 `toml:"max_table_size"`
	MaxSegments       uint32 `toml:"max_segments"`
}

// limits returns m over d as sandbox.ModuleLimits.
func (m Module) limits(d Module) sandbox.ModuleLimits {
	first := cmp.Or[uint32]
	return sandbox.ModuleLimits{
		MaxModuleSize:     uint64(cmp.Or(m.MaxModuleSize, d.MaxModuleSize)),
		MaxFunctions:      first(m.MaxFunctions, d.MaxFunctions),
		MaxFunctionSize:   uint32(min(uint64(cmp.Or(m.MaxFunctionSize, d.MaxFunctionSize)), 1<<32-1)),
		MaxNesting:        first(m.MaxNesting, d.MaxNesting),
		MaxBlocks:         first(m.MaxBlocks, d.MaxBlocks),
		MaxLoops:          first(m.MaxLoops, d.MaxLoops),
		MaxBrTableTargets: first(m.MaxBrTableTargets, d.MaxBrTableTargets),
		MaxLocals:         first(m.MaxLocals, d.MaxLocals),
		MaxTables:         first(m.MaxTables, d.MaxTables),
		MaxTableSize:      first(m.MaxTableSize, d.MaxTableSize),
		MaxSegments:       first(m.MaxSegments, d.MaxSegments),
	}
}

// Path grants a host folder to the guest.
type Path struct {
	Host  string `toml:"host"`
	Guest string `toml:"guest"`
	Mode  string `toml:"mode"` // "ro" (default) or "rw"
}

// Tools filters the tools a plugin serves by name (its own names, before
// any prefix), with * and ? patterns. A tool is served if it matches an
// allow pattern (or there are none) and no deny pattern.
type Tools struct {
	Allow []string `toml:"allow"`
	Deny  []string `toml:"deny"`
	// DenyRegexp are regular expressions (RE2), each matched against the
	// whole name, as hyper-mcp's skip_tools are.
	DenyRegexp []string `toml:"deny_regexp"`
}

// Limits are global.
type Limits struct {
	// MemoryBudget bounds the memory all instances may have, counted as
	// each instance's memory limit; past it, new instances are refused.
	MemoryBudget          Size `toml:"memory_budget"`
	MaxConcurrentCalls    int  `toml:"max_concurrent_calls"`
	MaxInstances          int  `toml:"max_instances"`
	MaxInstancesPerPlugin int  `toml:"max_instances_per_plugin"`
	// ParkedBytesTotal bounds what calls parked for a 2026-07-28
	// client's answer keep of their requests (arguments and _meta); 0
	// means 64MiB (host.DefaultMaxParkedBytes).
	ParkedBytesTotal Size `toml:"parked_bytes_total"`
	// RequestBytesTotal bounds the bytes of the HTTP request bodies read
	// and served at once; 0 means 64MiB (host.DefaultRequestBytes).
	RequestBytesTotal Size `toml:"request_bytes_total"`
	// Tenants' shares of the bounds above and of the state store (see
	// host.Options): 0 means the host's defaults (a quarter of the bound).
	MaxCallsPerSubject       int     `toml:"max_calls_per_subject"`
	CallsPerSecondPerSubject float64 `toml:"calls_per_second_per_subject"`
	MaxHandlesPerSubject     int     `toml:"max_handles_per_subject"`
	MaxSessionsPerSubject    int     `toml:"max_sessions_per_subject"`
	MaxParkedPerSubject      int     `toml:"max_parked_per_subject"`
	ParkedBytesPerSubject    Size    `toml:"parked_bytes_per_subject"`
	RequestBytesPerSubject   Size    `toml:"request_bytes_per_subject"`
	MaxAnonymousTasks        int     `toml:"max_anonymous_tasks"`
	StoreBytesPerRecord      Size    `toml:"store_bytes_per_record"`
	StoreBytesPerSubject     Size    `toml:"store_bytes_per_subject"`
	StoreBytesTotal          Size    `toml:"store_bytes_total"`
}

// HTTP protects the HTTP transport.
type HTTP struct {
	// AuthToken, if set, is the bearer token every HTTP request must
	// carry.
	AuthToken string `toml:"auth_token"`
	// AllowedOrigins are browser origins allowed besides the server's
	// own (cross-origin requests from others are refused).
	AllowedOrigins []string `toml:"allowed_origins"`
	// MetricsPublic serves /metrics without the bearer token (to a
	// Prometheus scraper that has none). The Host and Origin checks still
	// apply. Off by default: the metrics name every plugin.
	MetricsPublic bool `toml:"metrics_public"`
	// HeaderTimeout bounds the time a client takes to send a request's
	// headers, BodyTimeout the time from its headers to the end of its
	// body, and IdleTimeout how long a keep-alive connection may wait for
	// its next request; 0 means the host.Default* values (10s, 30s, 2m).
	// A response, such as an SSE stream, is not bounded by them.
	HeaderTimeout Duration `toml:"header_timeout"`
	BodyTimeout   Duration `toml:"body_timeout"`
	IdleTimeout   Duration `toml:"idle_timeout"`
	// MaxRequestBody bounds a request body; 0 means 4 MiB.
	MaxRequestBody Size `toml:"max_request_body"`
	// MaxConnections bounds the connections the HTTP listener holds at
	// once (--max-connections overrides it); 0 means twice
	// --max-sessions and 1,024 (host.MaxConnections).
	MaxConnections int `toml:"max_connections"`
	// MaxHeaderBytes bounds a request's headers (net/http reads 4 KiB
	// more); 0 means 16 KiB (host.DefaultMaxHeaderBytes). A connection
	// still reading them holds up to some 14 times what it read.
	MaxHeaderBytes Size `toml:"max_header_bytes"`
	// Tokens gives subjects bearer tokens of their own (subject name =
	// token): a request with one is that subject's, and the session
	// handles minted for it are bound to it. auth_token, if also set, is
	// a token shared by clients that are not told apart.
	Tokens map[string]string `toml:"tokens"`
	// OperatorToken, if set, is the bearer token of the operator: the
	// only credential (with OperatorSubjects and OperatorScope) that
	// /drain, /reload, /status and /metrics answer to. It must differ
	// from every tenant token. Without an operator credential, /drain and
	// /reload are not served over HTTP (signals still work) and /status
	// and /metrics answer loopback connections only.
	OperatorToken string `toml:"operator_token"`
	// OperatorSubjects are subjects (of http.tokens, or issuer + " " +
	// sub of an OAuth access token) that act as the operator.
	OperatorSubjects []string `toml:"operator_subjects"`
	// OperatorScope, if set, is an OAuth scope whose holders act as the
	// operator ("wasmtools:operate").
	OperatorScope string `toml:"operator_scope"`
	// OAuth makes the server an OAuth 2.1 resource server (see [OAuth]).
	OAuth *OAuth `toml:"oauth"`
}

// OAuth configures wasmtools as an OAuth 2.1 resource server, per the MCP
// authorization specification: access tokens from Issuer's authorization
// server, audience-bound to Resource.
type OAuth struct {
	// Issuer is the authorization server's issuer URL; its keys are
	// discovered through RFC 8414 or OpenID discovery under it.
	Issuer string `toml:"issuer"`
	// Resource is this server's canonical resource URI (RFC 8707), the
	// audience every access token must name: "https://tools.example/mcp".
	Resource string `toml:"resource"`
	// Scopes are required of every access token (none by default).
	Scopes []string `toml:"scopes"`
	// ClockSkew tolerates clocks this far apart on exp and nbf; 0 means
	// 30s.
	ClockSkew Duration `toml:"clock_skew"`
	// KeysMinRefresh is the least time between two fetches of the key
	// set for a token signed with a key not yet known (a rotation); 0
	// means 10s. It keeps made-up key IDs from making wasmtools fetch the
	// keys at a client's rate. It may not exceed the key set's max age
	// (keys_max_age, 1h, after which the keys are fetched again): keys
	// past it would be used until it passed.
	KeysMinRefresh Duration `toml:"keys_min_refresh"`
	// IntrospectionURL, if set, checks tokens that are not JWTs through
	// RFC 7662 introspection, authenticated with ClientID and
	// ClientSecret.
	IntrospectionURL string `toml:"introspection_url"`
	ClientID         string `toml:"client_id"`
	ClientSecret     string `toml:"client_secret"`
	// IntrospectionMaxAge is how long an active token's introspection
	// answer is used without asking again, never past the token's exp;
	// 0 means 5m. A token revoked at the authorization server is
	// accepted until then. Refusals are kept 30s.
	IntrospectionMaxAge Duration `toml:"introspection_max_age"`
	// MaxIntrospections bounds the introspection requests in flight; 0
	// means 8. A request needing one more waits 2s at most, then gets 503.
	MaxIntrospections int `toml:"max_introspections"`
}

// Access names who may use a plugin: subjects (of http.tokens, or
// "ISSUER SUB" of OAuth), OAuth scopes, or claims (name = value). Anyone
// matching one is allowed; others neither see nor may call its tools.
type Access struct {
	Subjects []string          `toml:"subjects"`
	Scopes   []string          `toml:"scopes"`
	Claims   map[string]string `toml:"claims"`
}

// Size is a byte count written as a number or with a unit: "64MiB", "1GB".
type Size uint64

// UnmarshalText parses a size.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	*s = Size(v)
	return err
}

// ParseSize parses a byte count with an optional unit (B, KiB, MiB, GiB,
// KB, MB, GB).
func ParseSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	whole := s
	units := []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1000_000}, {"GB", 1000_000_000}, {"B", 1}}
	mult := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a whole number with an optional unit (KiB, MiB, GiB, KB, MB, GB)", s)
	}
	if n > math.MaxUint64/mult { // n * mult would wrap around to a small size
		return 0, fmt.Errorf("size %q: over 2^64 bytes", whole)
	}
	return n * mult, nil
}

// Duration is a time.Duration written as "30s", "5m".
type Duration time.Duration

// UnmarshalText parses a duration.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("duration %q: %v", b, err)
	}
	*d = Duration(v)
	return nil
}

// Load reads and checks the configuration file at path, resolving ${VAR}
// with getenv (which reports whether a variable is set).
func Load(path string, getenv func(string) (string, bool)) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	f, err := Parse(b, getenv)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	f.relativeTo(filepath.Dir(path))
	return f, nil
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Parse reads a configuration from TOML text.
func Parse(b []byte, getenv func(string) (string, bool)) (*File, error) {
	var f File
	md, err := toml.Decode(string(b), &f)
	if err != nil {
		return nil, err
	}
	if keys := md.Undecoded(); len(keys) > 0 {
		names := make([]string, len(keys))
		for i, k := range keys {
			names[i] = k.String()
		}
		return nil, fmt.Errorf("unknown settings: %s", strings.Join(names, ", "))
	}
	return &f, f.finish(getenv)
}

// finish resolves ${VAR} references with getenv and checks the settings.
func (f *File) finish(getenv func(string) (string, bool)) error {
	missing := map[string]bool{}
	resolve := func(s string) string {
		return varRef.ReplaceAllStringFunc(s, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := getenv(name)
			if !ok {
				missing[name] = true
			}
			return v
		})
	}
	f.HTTP.AuthToken = resolve(f.HTTP.AuthToken)
	for subject, token := range f.HTTP.Tokens {
		f.HTTP.Tokens[subject] = resolve(token)
	}
	f.HTTP.OperatorToken = resolve(f.HTTP.OperatorToken)
	if o := f.HTTP.OAuth; o != nil {
		o.ClientSecret = resolve(o.ClientSecret)
	}
	f.Defaults.resolve(resolve)
	f.Sources.PublicKey = resolve(f.Sources.PublicKey)
	f.Sources.DockerConfig = resolve(f.Sources.DockerConfig)
	f.Grants.RememberFile = resolve(f.Grants.RememberFile)
	for host, c := range f.Registries {
		c.Username, c.Password, c.Token = resolve(c.Username), resolve(c.Password), resolve(c.Token)
		f.Registries[host] = c
	}
	for prefix, c := range f.urlAuths {
		c.Username, c.Password, c.Token = resolve(c.Username), resolve(c.Password), resolve(c.Token)
		f.urlAuths[prefix] = c
	}
	for name, p := range f.Plugins {
		p.resolve(resolve)
		f.Plugins[name] = p
	}
	if len(missing) > 0 {
		names := slices.Sorted(maps.Keys(missing))
		return fmt.Errorf("environment variables not set: %s (a variable set to the empty string counts as set)", strings.Join(names, ", "))
	}
	var errs []error
	errs = append(errs, f.HTTP.check())
	errs = append(errs, f.Defaults.check("defaults"))
	if f.Defaults.Secrets != nil || f.Defaults.AccessTokens != nil {
		errs = append(errs, errors.New("defaults: secrets and access_tokens are granted per plugin, in [plugins.NAME], never to every plugin"))
	}
	if f.Defaults.Ask.Secrets != nil {
		errs = append(errs, errors.New("defaults.ask.secrets: secrets are put in a ceiling per plugin, in [plugins.NAME.ask], never for every plugin"))
	}
	errs = append(errs, f.Cache.check())
	if f.Grants.MaxQuestions < 0 {
		errs = append(errs, fmt.Errorf("grants.max_questions: %d: must not be negative (0 means 10)", f.Grants.MaxQuestions))
	}
	if f.Defaults.Access != nil {
		errs = append(errs, errors.New("defaults.access: access is given per plugin, in [plugins.NAME]"))
	}
	if f.Defaults.Source != "" {
		errs = append(errs, errors.New("defaults.source: a source names one plugin: set it in [plugins.NAME]"))
	}
	for name, p := range f.Plugins {
		errs = append(errs, p.check("plugins."+name))
		if p.Source != "" && !sourceName.MatchString(name) {
			errs = append(errs, fmt.Errorf("plugins.%s: a plugin with a source needs a name of letters, digits, '_', '-' and '.', not starting with '.'", name))
		}
	}
	for _, host := range slices.Sorted(maps.Keys(f.Registries)) {
		c := f.Registries[host]
		if host == "" || strings.ContainsAny(host, "/ ") {
			errs = append(errs, fmt.Errorf("registries.%q: want a host[:port]", host))
		}
		if !(c.Token != "" && c.Username == "" && c.Password == "" || c.Token == "" && c.Username != "" && c.Password != "") {
			errs = append(errs, fmt.Errorf("registries.%q: want username and password, or token", host))
		}
	}
	return errors.Join(errs...)
}

func (h *HTTP) check() error {
	var errs []error
	if h.MaxConnections < 0 {
		errs = append(errs, fmt.Errorf("http.max_connections: %d: must not be negative (0 means twice --max-sessions and 1024)", h.MaxConnections))
	}
	seen := map[string]string{}
	for _, subject := range slices.Sorted(maps.Keys(h.Tokens)) {
		token := h.Tokens[subject]
		switch {
		case subject == "":
			errs = append(errs, errors.New("http.tokens: a subject has no name"))
		case len(token) < 16:
			errs = append(errs, fmt.Errorf("http.tokens.%s: a token must have at least 16 characters", subject))
		case token == h.AuthToken:
			errs = append(errs, fmt.Errorf("http.tokens.%s: the token is auth_token, which identifies no one", subject))
		case seen[token] != "":
			errs = append(errs, fmt.Errorf("http.tokens.%s: the same token as %s", subject, seen[token]))
		}
		seen[token] = subject
	}
	if op := h.OperatorToken; op != "" {
		switch {
		case len(op) < 16:
			errs = append(errs, errors.New("http.operator_token: a token must have at least 16 characters"))
		case op == h.AuthToken:
			errs = append(errs, errors.New("http.operator_token: the same token as auth_token, which every client holds"))
		case seen[op] != "":
			errs = append(errs, fmt.Errorf("http.operator_token: the same token as tenant %s", seen[op]))
		}
	}
	if o := h.OAuth; o != nil {
		if o.Issuer == "" || o.Resource == "" {
			errs = append(errs, errors.New("http.oauth: issuer and resource are required"))
		}
		if o.IntrospectionURL != "" && o.ClientID == "" {
			errs = append(errs, errors.New("http.oauth: introspection_url needs client_id (and client_secret)"))
		}
		// Refused here too, not only at start: a reload keeps the
		// configuration in force rather than take one the server
		// cannot serve.
		if min := time.Duration(o.KeysMinRefresh); min > auth.DefaultKeysMaxAge {
			errs = append(errs, fmt.Errorf("http.oauth: keys_min_refresh (%v) is over keys_max_age (%v), the age at which the key set is fetched again: keys past it would be used until keys_min_refresh passed", min, auth.DefaultKeysMaxAge))
		}
	}
	return errors.Join(errs...)
}

func (p *Plugin) resolve(r func(string) string) {
	for k, v := range p.Config {
		p.Config[k] = r(v)
	}
	for k, v := range p.Env {
		p.Env[k] = r(v)
	}
	for k, v := range p.Secrets {
		p.Secrets[k] = r(v)
	}
	for k, v := range p.AccessTokens {
		p.AccessTokens[k] = r(v)
	}
	for i, h := range p.AllowedHosts {
		p.AllowedHosts[i] = r(h)
	}
	for i, h := range p.Ask.Hosts {
		p.Ask.Hosts[i] = r(h)
	}
	for k, v := range p.Ask.Secrets {
		p.Ask.Secrets[k] = r(v)
	}
	for i := range p.AllowedPaths {
		p.AllowedPaths[i].Host = r(p.AllowedPaths[i].Host)
	}
	for i := range p.Ask.Paths {
		p.Ask.Paths[i].Host = r(p.Ask.Paths[i].Host)
	}
	p.SHA256 = r(p.SHA256)
	p.Source = r(p.Source)
	p.PublicKey = r(p.PublicKey)
}

var (
	hexSHA     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	sourceName = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$`)
)

func (p *Plugin) check(where string) error {
	var errs []error
	if p.SHA256 != "" && !hexSHA.MatchString(p.SHA256) {
		errs = append(errs, fmt.Errorf("%s.sha256: want 64 lower-case hex digits", where))
	}
	for i, h := range p.AllowedHosts {
		if err := sandbox.CheckHostGrant(h); err != nil {
			errs = append(errs, fmt.Errorf("%s.allowed_hosts[%d]: %v", where, i, err))
		}
	}
	for i, h := range p.Ask.Hosts {
		if err := sandbox.CheckHostGrant(h); err != nil {
			errs = append(errs, fmt.Errorf("%s.ask.hosts[%d]: %v", where, i, err))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(p.Ask.Secrets)) {
		if service, user, ok := strings.Cut(k, "/"); !ok || service == "" || user == "" {
			errs = append(errs, fmt.Errorf("%s.ask.secrets: key %q is not \"service/user\"", where, k))
		} else if _, granted := p.Secrets[k]; granted {
			errs = append(errs, fmt.Errorf("%s.ask.secrets: %q is granted in secrets already: keep it in one of the two", where, k))
		}
	}
	guests := map[string]bool{}
	checkPaths := func(setting string, paths []Path) {
		for i, m := range paths {
			if !filepath.IsAbs(m.Host) || !strings.HasPrefix(m.Guest, "/") {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: want host (an absolute folder path) and guest (an absolute path)", where, setting, i))
			} else if g := path.Clean(m.Guest); guests[g] {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: guest path %q is used twice", where, setting, i, m.Guest))
			} else {
				guests[g] = true
			}
			if m.Mode != "" && m.Mode != "ro" && m.Mode != "rw" {
				errs = append(errs, fmt.Errorf("%s.%s[%d].mode: %q is not ro or rw", where, setting, i, m.Mode))
			}
		}
	}
	checkPaths("allowed_paths", p.AllowedPaths)
	checkPaths("ask.paths", p.Ask.Paths)
	if p.Clock != "" && p.Clock != "real" && p.Clock != "fake" {
		errs = append(errs, fmt.Errorf("%s.clock: %q is not real or fake", where, p.Clock))
	}
	for _, k := range slices.Sorted(maps.Keys(p.Secrets)) {
		if service, user, ok := strings.Cut(k, "/"); !ok || service == "" || user == "" {
			errs = append(errs, fmt.Errorf("%s.secrets: key %q is not \"service/user\"", where, k))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(p.AccessTokens)) {
		if k == "" || p.AccessTokens[k] == "" {
			errs = append(errs, fmt.Errorf("%s.access_tokens: client %q needs a non-empty token", where, k))
		}
	}
	for _, pat := range append(append([]string{}, p.Tools.Allow...), p.Tools.Deny...) {
		if _, err := path.Match(pat, ""); err != nil {
			errs = append(errs, fmt.Errorf("%s.tools: bad pattern %q", where, pat))
		}
	}
	for _, re := range p.Tools.DenyRegexp {
		if _, err := regexp.Compile(re); err != nil {
			errs = append(errs, fmt.Errorf("%s.tools.deny_regexp: %q: %v", where, re, err))
		}
	}
	if p.Source != "" {
		if _, err := sources.Parse(p.Source); err != nil {
			errs = append(errs, fmt.Errorf("%s.source: %v", where, err))
		}
	}
	return errors.Join(errs...)
}

// Effective is what one plugin gets: its entry over the defaults.
type Effective struct {
	Enabled bool
	// Source is the plugin's remote source, "" for a local file.
	Source string
	// PublicKeys verify an OCI source's signature: the plugin's
	// public_key, else [sources] public_key.
	PublicKeys            []string
	InsecureSkipSignature bool
	SHA256                string
	Options               plugins.Options
	Network               sandbox.Network
	Mounts                []sandbox.Mount
	// AskMounts are the folders the person may grant at run time
	// ([plugins.NAME.ask] paths).
	AskMounts []sandbox.Mount
	Instances int
	// HandleNote: results carry the session handle note (see
	// Plugin.HandleNote).
	HandleNote bool
}

// For returns the settings of the plugin named name.
func (f *File) For(name string) Effective {
	d, p := f.Defaults, f.Plugins[name]
	e := Effective{Enabled: true}
	if b := cmp.Or(p.Enabled, d.Enabled); b != nil {
		e.Enabled = *b
	}
	e.SHA256 = cmp.Or(p.SHA256, d.SHA256)
	e.Source = p.Source
	if k := cmp.Or(p.PublicKey, d.PublicKey, f.Sources.PublicKey); k != "" {
		e.PublicKeys = []string{k}
	}
	if b := cmp.Or(p.InsecureSkipSignature, d.InsecureSkipSignature); b != nil {
		e.InsecureSkipSignature = *b
	}
	pol := sandbox.NewPolicy()
	if v := cmp.Or(p.MemoryLimit, d.MemoryLimit); v > 0 {
		pol = pol.WithMemoryLimit(uint64(v))
	}
	if v := cmp.Or(p.CallTimeout, d.CallTimeout); v > 0 {
		pol = pol.WithCallTimeout(time.Duration(v))
	}
	if v := cmp.Or(p.MaxOutput, d.MaxOutput); v > 0 {
		pol = pol.WithMaxOutput(uint64(v))
	}
	if v := cmp.Or(p.CompileTimeout, d.CompileTimeout); v > 0 {
		pol = pol.WithCompileTimeout(time.Duration(v))
	}
	if v := cmp.Or(p.LoadTimeout, d.LoadTimeout); v > 0 {
		pol = pol.WithLoadTimeout(time.Duration(v))
	}
	pol = pol.WithModuleLimits(p.Module.limits(d.Module))
	if v := cmp.Or(p.Images, d.Images); v != nil {
		pol = pol.WithImages(map[bool]sandbox.Images{true: sandbox.ImagesOn, false: sandbox.ImagesOff}[*v])
	}
	hosts := p.AllowedHosts
	if hosts == nil {
		hosts = d.AllowedHosts
	}
	ask := p.Ask.Hosts
	if ask == nil {
		ask = d.Ask.Hosts
	}
	if len(hosts) > 0 || len(ask) > 0 {
		private := cmp.Or(p.AllowPrivateNetworks, d.AllowPrivateNetworks)
		e.Network = sandbox.Network{AllowedHosts: hosts, Ask: ask, AllowPrivate: private != nil && *private, Extism: p.AllowedHosts != nil && p.hyperHosts}
		pol = pol.WithNetwork(e.Network)
	}
	paths := p.AllowedPaths
	if paths == nil {
		paths = d.AllowedPaths
	}
	for _, m := range paths {
		e.Mounts = append(e.Mounts, sandbox.Mount{HostPath: m.Host, GuestPath: m.Guest, ReadOnly: m.Mode != "rw"})
	}
	if len(e.Mounts) > 0 {
		pol = pol.WithMounts(e.Mounts...)
	}
	askPaths := p.Ask.Paths
	if askPaths == nil {
		askPaths = d.Ask.Paths
	}
	for _, m := range askPaths {
		e.AskMounts = append(e.AskMounts, sandbox.Mount{HostPath: m.Host, GuestPath: m.Guest, ReadOnly: m.Mode != "rw"})
	}
	if len(e.AskMounts) > 0 {
		pol = pol.WithAskMounts(e.AskMounts...)
	}
	if cfg := firstMap(p.Config, d.Config); cfg != nil {
		pol = pol.WithConfig(cfg)
	}
	if env := firstMap(p.Env, d.Env); env != nil {
		pol = pol.WithEnv(env)
	}
	pol = pol.WithFakeClock(cmp.Or(p.Clock, d.Clock) == "fake")
	tools := p.Tools
	if tools.Allow == nil && tools.Deny == nil && tools.DenyRegexp == nil {
		tools = d.Tools
	}
	stateless := cmp.Or(p.Stateless, d.Stateless)
	e.Options = plugins.Options{
		Prefix:    cmp.Or(p.Prefix, d.Prefix),
		Policy:    &pol,
		Stateless: stateless != nil && *stateless,
		Tools:     plugins.ToolFilter{Allow: tools.Allow, Deny: tools.Deny, DenyRegexp: tools.DenyRegexp},
		Skip:      p.hyperSkip,
		// Secrets and tokens are granted per plugin only: [defaults]
		// would hand them to every plugin.
		Secrets:      p.Secrets,
		AccessTokens: p.AccessTokens,
		AskSecrets:   p.Ask.Secrets,
	}
	e.Instances = cmp.Or(p.MaxInstances, d.MaxInstances)
	note := cmp.Or(p.HandleNote, d.HandleNote)
	e.HandleNote = note == nil || *note
	return e
}

// firstMap is cmp.Or for maps, which are not comparable.
func firstMap(a, b map[string]string) map[string]string {
	if a != nil {
		return a
	}
	return b
}

// relativeTo makes the file paths the configuration names (public keys,
// the Docker config) relative to dir, the configuration file's folder,
// when they are not absolute.
func (f *File) relativeTo(dir string) {
	abs := func(p *string) {
		if *p != "" && *p != "-" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	abs(&f.Sources.PublicKey)
	abs(&f.Sources.DockerConfig)
	abs(&f.Grants.RememberFile)
	abs(&f.Defaults.PublicKey)
	for name, p := range f.Plugins {
		abs(&p.PublicKey)
		f.Plugins[name] = p
	}
}

// SourceCredential returns the login for an HTTPS source's URL: the
// hyper-mcp auths entry whose URL is the longest prefix of it (as
// hyper-mcp matches them, case-sensitively), else the registries entry of
// its host[:port]; nil if neither.
func (f *File) SourceCredential(sourceURL, host string) *Credential {
	best := ""
	for prefix := range f.urlAuths {
		if strings.HasPrefix(sourceURL, prefix) && len(prefix) > len(best) {
			best = prefix
		}
	}
	if best != "" {
		c := f.urlAuths[best]
		return &c
	}
	return f.Credential(host)
}

// Credential returns the login configured for host (a registry's
// host[:port]), or nil.
func (f *File) Credential(host string) *Credential {
	if c, ok := f.Registries[host]; ok {
		return &c
	}
	return nil
}
