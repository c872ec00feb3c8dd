package config

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSources(t *testing.T) {
	f, err := Parse([]byte(`
[sources]
refresh_interval = "10m"
public_key = "/etc/wasmtools/cosign.pub"

[registries."127.0.0.1:5000"]
username = "bot"
password = "${PW}"

[plugins.time]
source = "oci://127.0.0.1:5000/tuananh/time-plugin:latest"
tools = { deny_regexp = ["debug_.*"] }

[plugins.fetch]
source = "https://plugins.example.com/fetch.wasm"
sha256 = "`+strings.Repeat("ab", 32)+`"
public_key = "/keys/fetch.pub"
insecure_skip_signature = true
`), env(map[string]string{"PW": "secret"}))
	if err != nil {
		t.Fatal(err)
	}
	if c := f.Credential("127.0.0.1:5000"); c == nil || c.Password != "secret" {
		t.Errorf("credential = %+v", c)
	}
	tm, fe := f.For("time"), f.For("fetch")
	if tm.Source != "oci://127.0.0.1:5000/tuananh/time-plugin:latest" || !cmp.Equal(tm.PublicKeys, []string{"/etc/wasmtools/cosign.pub"}) || tm.InsecureSkipSignature {
		t.Errorf("time = %+v", tm)
	}
	if tm.Options.Tools.Serves("debug_x") || !tm.Options.Tools.Serves("now") {
		t.Error("deny_regexp not applied")
	}
	if !cmp.Equal(fe.PublicKeys, []string{"/keys/fetch.pub"}) || !fe.InsecureSkipSignature {
		t.Errorf("fetch = %+v", fe)
	}
}

func TestSourcesRefused(t *testing.T) {
	tests := []struct{ name, toml, want string }{
		{"bad source", "[plugins.p]\nsource = \"s3://b/p.wasm\"", "plugins.p.source"},
		{"http off loopback", "[plugins.p]\nsource = \"http://example.com/p.wasm\"", "only on loopback"},
		{"source in defaults", "[defaults]\nsource = \"oci://r/a:b\"", "defaults.source"},
		{"bad name", "[plugins.\".x\"]\nsource = \"oci://r/a:b\"", "needs a name"},
		{"bad regexp", "[plugins.p.tools]\ndeny_regexp = [\"(\"]", "deny_regexp"},
		{"registry login", "[registries.\"r\"]\nusername = \"u\"", "want username and password, or token"},
		{"unknown key", "[sources]\nrefresh = \"1m\"", "unknown settings: sources.refresh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Parse([]byte(tt.toml), env(nil)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestHyperMCP(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(s), 0o644)
		return p
	}
	toml := write("hyper.toml", `
[auths."https://plugins.example.com/"]
type = "basic"
username = "u"
password = "p"

[oci]
insecure_skip_signature = true

[plugins.notes]
url = "https://plugins.example.com/notes.wasm"
[plugins.notes.runtime_config]
allowed_hosts = ["api.example.com"]
allowed_paths = ["/srv/notes:/data", "/tmp"]
env_vars = { MODE = "${MODE}" }
memory_limit = "512Mi"
skip_tools = ["admin_.*"]
allowed_secrets = [{ service = "notes", user = "bot" }]
`)
	h, err := LoadHyperMCP(toml, env(map[string]string{"MODE": "fast"}))
	if err != nil {
		t.Fatal(err)
	}
	p := h.Plugins["notes"]
	want := Plugin{
		Source: "https://plugins.example.com/notes.wasm", Prefix: "notes-",
		AllowedHosts: []string{"api.example.com"},
		AllowedPaths: []Path{{Host: "/srv/notes", Guest: "/data", Mode: "rw"}, {Host: "/tmp", Guest: "/tmp", Mode: "rw"}},
		Config:       map[string]string{"MODE": "fast"}, MemoryLimit: 512 << 20,
		Tools: Tools{DenyRegexp: []string{"admin_.*"}},
	}
	if diff := cmp.Diff(want, p, cmp.AllowUnexported(Plugin{}), cmp.FilterPath(func(p cmp.Path) bool {
		return p.Last().String() == ".hyperSecrets" || p.Last().String() == ".hyperHosts"
	}, cmp.Ignore())); diff != "" {
		t.Errorf("notes (-want +got):\n%s", diff)
	}
	if c := h.SourceCredential("https://plugins.example.com/notes.wasm", "plugins.example.com"); c == nil || c.Username != "u" {
		t.Errorf("auths: %+v", c)
	}
	if c := h.SourceCredential("https://other.example.com/plugins.example.com/", "other.example.com"); c != nil {
		t.Errorf("auths for another URL: %+v", c)
	}
	if e := h.For("notes"); !e.Network.Extism || e.Options.Policy.Config()["MODE"] != "fast" {
		t.Errorf("notes: network %+v, config %v: want Extism's host reading and env_vars as config", e.Network, e.Options.Policy.Config())
	}
	if s := h.Defaults.InsecureSkipSignature; s == nil || !*s {
		t.Error("oci.insecure_skip_signature not mapped")
	}
	// The keyring secret must be given by our configuration.
	var ours File
	if err := ours.Overlay(h); err == nil || !strings.Contains(err.Error(), "allowed_secrets") || !strings.Contains(err.Error(), `"notes/bot"`) {
		t.Fatalf("overlay without the secret: %v", err)
	}
	ours = File{Plugins: map[string]Plugin{"notes": {Secrets: map[string]string{"notes/bot": "s3cret"}, MemoryLimit: 64 << 20}}}
	if err := ours.Overlay(h); err != nil {
		t.Fatal(err)
	}
	if got := ours.Plugins["notes"]; got.MemoryLimit != 64<<20 || got.Source == "" || got.Prefix != "notes-" {
		t.Errorf("overlay: %+v", got)
	}

	for _, tt := range []struct{ name, file, content, want string }{
		{"unknown runtime key", "p.yaml", "plugins:\n  p:\n    url: oci://r/p:v1\n    runtime_config:\n      allowed_host: \"*\"\n", "allowed_host"},
		{"keyring auth", "p.json", `{"auths": {"https://r/": {"type": "keyring", "service": "s", "user": "u"}}, "plugins": {}}`, "auths.https://r/"},
		{"tuf", "p.json", `{"oci": {"use_sigstore_tuf_data": true}, "plugins": {}}`, "oci.use_sigstore_tuf_data"},
		{"dynamic", "p.yaml", "dynamic_loading: true\nplugins: {}\n", "dynamic_loading"},
		{"bad size", "p.yaml", "plugins:\n  p:\n    url: oci://r/p:v1\n    runtime_config:\n      memory_limit: lots\n", "memory_limit"},
		{"skip_resources", "p.toml", "[plugins.p]\nurl = \"oci://r/p:v1\"\n[plugins.p.runtime_config]\nskip_resources = [\"(\"]\n", "plugins.p.runtime_config.skip_resources[0]"},
		{"completions", "p.json", `{"disable_completions": true, "plugins": {}}`, "disable_completions"},
		{"unknown top-level key", "p.toml", "extra = 1\n[plugins]\n", "unknown settings: extra"},
		{"format", "p.ini", "", "unsupported format"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := LoadHyperMCP(write(tt.file, tt.content), env(nil))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestHyperSize(t *testing.T) {
	for in, want := range map[string]uint64{"256Mi": 256 << 20, "512MB": 512e6, "1 GiB": 1 << 30, "1048576": 1 << 20, "64KiB": 64 << 10} {
		if got, err := parseHyperSize(in); err != nil || got != want {
			t.Errorf("parseHyperSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

// TestHyperSizeOverflow: a memory_limit past 2^64 bytes is refused, not
// converted to whatever the float-to-integer conversion gives; the largest
// whole size is read exactly.
func TestHyperSizeOverflow(t *testing.T) {
	for _, in := range []string{"18446744073709551616", "17179869184Gi", "20000000000GB", "18446744073709551615.5", "17179869184.5Gi", "99999999999999999999999Mi"} {
		if got, err := parseHyperSize(in); err == nil {
			t.Errorf("parseHyperSize(%q) = %d; want an error (past 2^64 bytes)", in, got)
		}
	}
	if got, err := parseHyperSize("18446744073709551615"); err != nil || got != math.MaxUint64 {
		t.Errorf("parseHyperSize(2^64-1) = %d, %v; want %d", got, err, uint64(math.MaxUint64))
	}
}
