package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/wasmtools/wasmtools/sandbox"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

func TestParse(t *testing.T) {
	f, err := Parse([]byte(`
[defaults]
memory_limit = "16MiB"
call_timeout = "5s"
load_timeout = "3s"

[defaults.module]
max_nesting = 100
max_module_size = "8MiB"

[limits]
memory_budget = "1GiB"
max_concurrent_calls = 8

[http]
auth_token = "${TOKEN}"
tokens = { alice = "${ALICE}", bob = "bob-token-0123456789" }

[plugins.fetch]
sha256 = "`+strings.Repeat("ab", 32)+`"
allowed_hosts = ["api.example.com", "127.0.0.1:18409", "[::1]:8080", "*.example.org"]
allowed_paths = [{ host = "/srv", guest = "/data", mode = "rw" }]
config = { key = "${KEY}", empty = "${EMPTY}" }
env = { LANG = "C" }
tools = { deny = ["debug_*"] }
max_instances = 3
memory_limit = "32MiB"
compile_timeout = "1m"
module = { max_nesting = 200, max_table_size = 5000 }
handle_note = false
images = false

[plugins.off]
enabled = false
`), env(map[string]string{"TOKEN": "t0k", "KEY": "k3y", "EMPTY": "", "ALICE": "alice-token-0123456789"}))
	if err != nil {
		t.Fatal(err)
	}
	if f.HTTP.AuthToken != "t0k" || f.Limits.MemoryBudget != 1<<30 || f.Limits.MaxConcurrentCalls != 8 {
		t.Errorf("globals: %+v %+v", f.HTTP, f.Limits)
	}
	e := f.For("fetch")
	if !e.Enabled || e.Instances != 3 || e.Options.Policy.MemoryLimit() != 32<<20 || e.Options.Policy.CallTimeout() != 5*time.Second {
		t.Errorf("fetch: %+v", e)
	}
	if p := e.Options.Policy; p.CompileTimeout() != time.Minute || p.LoadTimeout() != 3*time.Second {
		t.Errorf("fetch: compile timeout %v, load timeout %v", p.CompileTimeout(), p.LoadTimeout())
	}
	want := sandbox.ModuleLimits{MaxNesting: 200, MaxTableSize: 5000, MaxModuleSize: 8 << 20}
	got := e.Options.Policy.ModuleLimits()
	if got.MaxNesting != want.MaxNesting || got.MaxTableSize != want.MaxTableSize || got.MaxModuleSize != want.MaxModuleSize || got.MaxLoops != sandbox.DefaultMaxLoops {
		t.Errorf("fetch: module limits %+v; want %+v over the defaults", got, want)
	}
	if d := f.For("other").Options.Policy; d.ModuleLimits().MaxNesting != 100 || d.CompileTimeout() != sandbox.DefaultCompileTimeout {
		t.Errorf("a plugin with no entry: module limits %+v, compile timeout %v", d.ModuleLimits(), d.CompileTimeout())
	}
	if diff := cmp.Diff([]string{"api.example.com", "127.0.0.1:18409", "[::1]:8080", "*.example.org"}, e.Network.AllowedHosts); diff != "" || e.Network.AllowPrivate {
		t.Errorf("network %+v", e.Network)
	}
	if len(e.Mounts) != 1 || e.Mounts[0].ReadOnly || e.Mounts[0].GuestPath != "/data" {
		t.Errorf("mounts %+v", e.Mounts)
	}
	if e.Options.Tools.Serves("debug_dump") || !e.Options.Tools.Serves("get") {
		t.Errorf("tool filter %+v", e.Options.Tools)
	}
	if d := f.For("other"); !d.Enabled || d.Options.Policy.MemoryLimit() != 16<<20 || len(d.Network.AllowedHosts) != 0 || len(d.Mounts) != 0 {
		t.Errorf("a plugin with no entry: %+v", d)
	}
	if f.For("off").Enabled {
		t.Error("off is enabled")
	}
	if diff := cmp.Diff(map[string]string{"alice": "alice-token-0123456789", "bob": "bob-token-0123456789"}, f.HTTP.Tokens); diff != "" {
		t.Errorf("http.tokens (-want +got):\n%s", diff)
	}
	if e.Options.Policy.Images() != sandbox.ImagesOff || f.For("other").Options.Policy.Images() != sandbox.ImagesAuto {
		t.Errorf("images: fetch %v (want off), other %v (want auto)", e.Options.Policy.Images(), f.For("other").Options.Policy.Images())
	}
	if e.HandleNote || !f.For("other").HandleNote {
		t.Errorf("handle_note: fetch %v (want false), other %v (want true)", e.HandleNote, f.For("other").HandleNote)
	}
}

func TestParseRefuses(t *testing.T) {
	tests := []struct{ name, toml, want string }{
		{"unset variables, all named", `[plugins.a]
config = { x = "${ONE}", y = "${TWO}" }
[http]
auth_token = "${ONE}"`, "environment variables not set: ONE, TWO"},
		{"unknown setting", `[plugins.a]
alowed_hosts = ["x"]`, "unknown settings: plugins.a.alowed_hosts"},
		{"bad size", `[defaults]
memory_limit = "lots"`, "size"},
		{"bad duration", `[defaults]
call_timeout = "soon"`, "duration"},
		{"bad pin", `[plugins.a]
sha256 = "xyz"`, "64 lower-case hex digits"},
		{"bad mode", `[plugins.a]
allowed_paths = [{ host = "/x", guest = "/y", mode = "wx" }]`, `"wx" is not ro or rw`},
		{"relative guest path", `[plugins.a]
allowed_paths = [{ host = "/x", guest = "y" }]`, "absolute path"},
		{"bad port", `[plugins.a]
allowed_hosts = ["ok.example.com", "api.example.com:http"]`, `plugins.a.allowed_hosts[1]: allowed host "api.example.com:http": the port must be a number`},
		{"a URL, not a host", `[defaults]
allowed_hosts = ["https://api.example.com/"]`, "want a host or host:port, not a URL"},
		{"IPv6 with a port, no brackets", `[plugins.a]
allowed_hosts = ["::ffff:1.2.3.4:8080"]`, "in brackets"},
		{"relative host path", `[defaults]
allowed_paths = [{ host = "x", guest = "/y" }]`, "want host (an absolute folder path)"},
		{"not TOML", `[plugins`, "expected"},
		{"ask: a URL", `[plugins.a.ask]
hosts = ["https://api.example.com/"]`, `plugins.a.ask.hosts[0]: allowed host "https://api.example.com/": want a host or host:port, not a URL`},
		{"ask: bad port in defaults", `[defaults.ask]
hosts = ["api.example.com:0"]`, `defaults.ask.hosts[0]`},
		{"ask: secrets in defaults", `[defaults.ask]
secrets = { "a/b" = "v" }`, "defaults.ask.secrets: secrets are put in a ceiling per plugin"},
		{"ask: secret not service/user", `[plugins.a.ask]
secrets = { "ab" = "v" }`, `plugins.a.ask.secrets: key "ab" is not "service/user"`},
		{"ask: secret granted already", `[plugins.a]
secrets = { "a/b" = "v" }
[plugins.a.ask]
secrets = { "a/b" = "v" }`, `plugins.a.ask.secrets: "a/b" is granted in secrets already`},
		{"ask: unknown setting", `[plugins.a.ask]
files = []`, "unknown settings: plugins.a.ask.files"},
		{"ask: bad path mode", `[plugins.a.ask]
paths = [{ host = "/x", guest = "/y", mode = "w" }]`, `plugins.a.ask.paths[0].mode: "w" is not ro or rw`},
		{"ask: relative path", `[defaults.ask]
paths = [{ host = "x", guest = "/y" }]`, `defaults.ask.paths[0]: want host (an absolute folder path)`},
		{"ask: a guest path granted already", `[plugins.a]
allowed_paths = [{ host = "/x", guest = "/data" }]
[plugins.a.ask]
paths = [{ host = "/z", guest = "/data/" }]`, `plugins.a.ask.paths[0]: guest path "/data/" is used twice`},
		{"grants: negative cap", `[grants]
max_questions = -1`, "grants.max_questions: -1: must not be negative"},
		{"short subject token", `[http]
tokens = { alice = "short" }`, "http.tokens.alice: a token must have at least 16 characters"},
		{"subject token shared", `[http]
auth_token = "shared-token-0123456789"
tokens = { alice = "shared-token-0123456789" }`, "the token is auth_token"},
		{"keys refreshed less often than they age", `[http.oauth]
issuer = "https://as.example"
resource = "https://tools.example/mcp"
keys_min_refresh = "2h"`, "http.oauth: keys_min_refresh (2h0m0s) is over keys_max_age (1h0m0s)"},
		{"cache: a bound of 0", `[cache]
checked_bytes = 0`, "cache.checked_bytes: 0: want a size above 0"},
		{"cache: a bound of 0, with a unit", `[cache]
compiled_bytes = "0GiB"`, "cache.compiled_bytes: 0: want a size above 0"},
		{"cache: a negative bound", `[cache]
compiled_bytes = -1`, `size "-1"`},
		{"cache: a bound not a size", `[cache]
checked_bytes = "lots"`, `size "lots"`},
		{"cache: a bound past int64", `[cache]
checked_bytes = "9223372036854775808"`, "cache.checked_bytes: 9223372036854775808 bytes: too large"},
		{"cache: unknown setting", `[cache]
max_bytes = "1GiB"`, "unknown settings: cache.max_bytes"},
		{"two subjects, one token", `[http]
tokens = { alice = "same-token-0123456789", bob = "same-token-0123456789" }`, "http.tokens.bob: the same token as alice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.toml), env(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v; want %q", err, tt.want)
			}
		})
	}
}

func TestAskCeiling(t *testing.T) {
	f, err := Parse([]byte(`
[defaults.ask]
hosts = ["*.example.org"]

[plugins.weather]
allow_private_networks = true
[plugins.weather.ask]
hosts = ["127.0.0.1:18409", "${HOST}"]
paths = [{ host = "/srv/docs", guest = "/docs" }, { host = "/srv/out", guest = "/out", mode = "rw" }]
secrets = { "weather/key" = "${KEY}" }

[plugins.plain]

[grants]
max_questions = 4
`), env(map[string]string{"HOST": "api.weather.example", "KEY": "k3y"}))
	if err != nil {
		t.Fatal(err)
	}
	if f.Grants.MaxQuestions != 4 {
		t.Errorf("max_questions = %d, want 4", f.Grants.MaxQuestions)
	}
	w := f.For("weather")
	if diff := cmp.Diff(sandbox.Network{Ask: []string{"127.0.0.1:18409", "api.weather.example"}, AllowPrivate: true}, w.Network); diff != "" {
		t.Errorf("weather network (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"weather/key": "k3y"}, w.Options.AskSecrets); diff != "" {
		t.Errorf("weather ask secrets (-want +got):\n%s", diff)
	}
	if got := w.Options.Policy.Network().Ask; len(got) != 2 {
		t.Errorf("policy ask = %v", got)
	}
	if diff := cmp.Diff([]sandbox.Mount{{HostPath: "/srv/docs", GuestPath: "/docs", ReadOnly: true}, {HostPath: "/srv/out", GuestPath: "/out"}}, w.AskMounts); diff != "" {
		t.Errorf("weather ask mounts (-want +got):\n%s", diff)
	}
	p := f.For("plain")
	if diff := cmp.Diff(sandbox.Network{Ask: []string{"*.example.org"}}, p.Network); diff != "" {
		t.Errorf("plain network, from the defaults (-want +got):\n%s", diff)
	}
	if p.Options.AskSecrets != nil {
		t.Errorf("plain ask secrets = %v, want none", p.Options.AskSecrets)
	}
	none, _ := Parse([]byte(`[plugins.x]`), env(nil))
	if n := none.For("x").Network; len(n.Ask) > 0 || len(n.AllowedHosts) > 0 {
		t.Errorf("no ceiling: network %+v, want nothing", n)
	}
}

// TestCacheBounds: [cache]'s bounds parse as sizes, unset ones are 0
// (sandbox.Options' default).
func TestCacheBounds(t *testing.T) {
	for _, tt := range []struct {
		toml              string
		checked, compiled int64
	}{
		{"", 0, 0},
		{"[cache]\nchecked_bytes = \"10MiB\"", 10 << 20, 0},
		{"[cache]\ncompiled_bytes = 4096\nchecked_bytes = \"1B\"", 1, 4096},
	} {
		f, err := Parse([]byte(tt.toml), env(nil))
		if err != nil {
			t.Fatalf("%q: %v", tt.toml, err)
		}
		if checked, compiled := f.Cache.Bounds(); checked != tt.checked || compiled != tt.compiled {
			t.Errorf("%q: bounds %d, %d; want %d, %d", tt.toml, checked, compiled, tt.checked, tt.compiled)
		}
	}
}

// TestParseSizeOverflow: a size whose unit takes it past 2^64 bytes is
// refused, not wrapped around to a small one.
func TestParseSizeOverflow(t *testing.T) {
	for _, in := range []string{"17179869184GiB", "18446744073709552KB", "18446744073709551615 KiB"} {
		if got, err := ParseSize(in); err == nil {
			t.Errorf("ParseSize(%q) = %d; want an error (past 2^64 bytes)", in, got)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{"10": 10, "1KiB": 1024, "64MiB": 64 << 20, "2 GiB": 2 << 30, "5MB": 5_000_000, "7B": 7} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

// TestSecretsExpanded: ${VAR} is resolved in secrets and access_tokens,
// and the error for unset variables names all of them, from every place.
func TestSecretsExpanded(t *testing.T) {
	src := `
[http]
auth_token = "${TOKEN}"

[plugins.p]
secrets = { "github/bot" = "${GITHUB_TOKEN}", "plain/x" = "literal" }
access_tokens = { "client-1" = "Bearer ${API_TOKEN}" }
config = { k = "${CONF}" }
`
	f, err := Parse([]byte(src), env(map[string]string{"TOKEN": "t", "GITHUB_TOKEN": "gh-123", "API_TOKEN": "api-456", "CONF": "c"}))
	if err != nil {
		t.Fatal(err)
	}
	e := f.For("p")
	if got := e.Options.Secrets["github/bot"]; got != "gh-123" {
		t.Errorf("secret = %q, want gh-123", got)
	}
	if got := e.Options.Secrets["plain/x"]; got != "literal" {
		t.Errorf("plain secret = %q", got)
	}
	if got := e.Options.AccessTokens["client-1"]; got != "Bearer api-456" {
		t.Errorf("access token = %q, want Bearer api-456", got)
	}
	_, err = Parse([]byte(src), env(map[string]string{"TOKEN": "t"}))
	if err == nil || !strings.Contains(err.Error(), "API_TOKEN, CONF, GITHUB_TOKEN") {
		t.Fatalf("err = %v, want one error naming API_TOKEN, CONF, GITHUB_TOKEN", err)
	}
}
