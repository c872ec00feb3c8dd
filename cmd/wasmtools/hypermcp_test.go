package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestHyperMCPSemantics serves a hyper-mcp configuration, written in each
// of the three formats hyper-mcp reads, as hyper-mcp would: env_vars are
// Extism config keys that a Go PDK plugin reads with pdk.GetConfig;
// allowed_hosts entries grant a host on any port, and an explicitly named
// loopback address is reachable while a pattern that merely matches a
// loopback name is not; skip_prompts, skip_resources and
// skip_resource_templates leave those out; auths log in to HTTPS
// (loopback HTTP) sources by URL prefix, basic and token.
func TestHyperMCPSemantics(t *testing.T) {
	servlet, grants := testplugins.Test(t, "servlet"), testplugins.Test(t, "grants")
	everything := testplugins.Example(t, "everything")
	// The plugin server: /private/token/ wants the bearer token,
	// /private/ the basic login (the longer prefix wins, as in hyper-mcp).
	files := map[string]string{"/private/servlet.wasm": servlet, "/private/token/grants.wasm": grants}
	plugins := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, basic := r.BasicAuth()
		switch {
		case strings.HasPrefix(r.URL.Path, "/private/token/"):
			if r.Header.Get("Authorization") != "Bearer tok-123" {
				http.Error(w, "want the token", http.StatusUnauthorized)
				return
			}
		case !basic || u != "u" || p != "p":
			http.Error(w, "want the basic login", http.StatusUnauthorized)
			return
		}
		f, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeFile(w, r, f)
	}))
	defer plugins.Close()
	// The service the grants plugin asks, on a port no entry names.
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "reached") }))
	defer target.Close()
	_, port, _ := net.SplitHostPort(target.Listener.Addr().String())

	base := plugins.URL
	yaml := fmt.Sprintf(`auths:
  %[1]q:
    type: basic
    username: u
    password: p
  "%[1]s/private/token":
    type: token
    token: tok-123
oci:
  insecure_skip_signature: true
plugins:
  conf:
    url: "%[1]s/private/servlet.wasm"
    runtime_config:
      env_vars:
        greeting: "${GREETING}"
        website_url: https://example.com
  net:
    url: "%[1]s/private/token/grants.wasm"
    runtime_config:
      allowed_hosts: ["127.0.0.1", "local*"]
  all:
    url: "file://%[2]s"
    runtime_config:
      skip_prompts: ["test_simple_.*", "test_prompt_with_image"]
      skip_resources: ["test://static-.*"]
      skip_resource_templates: ["test://template/.*"]
`, base, everything)
	json := fmt.Sprintf(`{
  "auths": {
    %[1]q: {"type": "basic", "username": "u", "password": "p"},
    "%[1]s/private/token": {"type": "token", "token": "tok-123"}
  },
  "oci": {"insecure_skip_signature": true},
  "plugins": {
    "conf": {"url": "%[1]s/private/servlet.wasm", "runtime_config": {"env_vars": {"greeting": "${GREETING}", "website_url": "https://example.com"}}},
    "net": {"url": "%[1]s/private/token/grants.wasm", "runtime_config": {"allowed_hosts": ["127.0.0.1", "local*"]}},
    "all": {"url": "file://%[2]s", "runtime_config": {
      "skip_prompts": ["test_simple_.*", "test_prompt_with_image"],
      "skip_resources": ["test://static-.*"],
      "skip_resource_templates": ["test://template/.*"]}}
  }
}`, base, everything)
	toml := fmt.Sprintf(`[auths.%[1]q]
type = "basic"
username = "u"
password = "p"

[auths."%[1]s/private/token"]
type = "token"
token = "tok-123"

[oci]
insecure_skip_signature = true

[plugins.conf]
url = "%[1]s/private/servlet.wasm"
[plugins.conf.runtime_config]
env_vars = { greeting = "${GREETING}", website_url = "https://example.com" }

[plugins.net]
url = "%[1]s/private/token/grants.wasm"
[plugins.net.runtime_config]
allowed_hosts = ["127.0.0.1", "local*"]

[plugins.all]
url = "file://%[2]s"
[plugins.all.runtime_config]
skip_prompts = ["test_simple_.*", "test_prompt_with_image"]
skip_resources = ["test://static-.*"]
skip_resource_templates = ["test://template/.*"]
`, base, everything)

	for _, tt := range []struct{ file, content string }{{"config.yaml", yaml}, {"config.json", json}, {"config.toml", toml}} {
		t.Run(tt.file, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), tt.file)
			if err := os.WriteFile(cfg, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			url, stderr := serveInProcess(t, map[string]string{"GREETING": "hello"}, "--hyper-mcp-config", cfg, "--source-dir", t.TempDir())
			cs, err := connectURL(t, url, bearer(""))
			if err != nil {
				t.Fatal(err)
			}
			names := toolNames(t, cs)
			for _, want := range []string{"conf-config", "net-fetch", "all-test_simple_text"} {
				if !slices.Contains(names, want) {
					t.Fatalf("tools = %v, want %s among them\n%s", names, want, stderr.String())
				}
			}
			// env_vars are config, not environment.
			for key, want := range map[string]string{"greeting": "hello", "website_url": "https://example.com", "missing": "<unset>"} {
				if got := callText(t, cs, "conf-config", map[string]any{"key": key}); got != want {
					t.Errorf("config %s = %q, want %q", key, got, want)
				}
			}
			// "127.0.0.1" grants every port and reaches loopback;
			// "local*" matches localhost but does not name it.
			if got := callText(t, cs, "net-fetch", map[string]any{"url": target.URL}); got != "200 reached" {
				t.Errorf("fetch %s = %q, want 200 reached", target.URL, got)
			}
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "net-fetch", Arguments: map[string]any{"url": "http://localhost:" + port + "/"}})
			if err != nil {
				t.Fatal(err)
			}
			if text := res.Content[0].(*mcp.TextContent).Text; !strings.Contains(text, "allow_private_networks") {
				t.Errorf("fetch through a pattern to localhost = %q, want a refusal naming allow_private_networks", text)
			}
			// skip_prompts, skip_resources, skip_resource_templates.
			prompts, err := cs.ListPrompts(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var pn []string
			for _, p := range prompts.Prompts {
				pn = append(pn, p.Name)
			}
			if slices.Contains(pn, "all-test_simple_prompt") || slices.Contains(pn, "all-test_prompt_with_image") || !slices.Contains(pn, "all-test_prompt_with_arguments") {
				t.Errorf("prompts = %v, want the skipped ones left out", pn)
			}
			resources, err := cs.ListResources(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			var rn []string
			for _, r := range resources.Resources {
				rn = append(rn, r.URI)
			}
			if slices.ContainsFunc(rn, func(u string) bool { return strings.Contains(u, "static-") }) || !slices.ContainsFunc(rn, func(u string) bool { return strings.Contains(u, "watched-resource") }) {
				t.Errorf("resources = %v, want test://static-* left out", rn)
			}
			templates, err := cs.ListResourceTemplates(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(templates.ResourceTemplates) != 0 {
				t.Errorf("templates = %v, want none", templates.ResourceTemplates)
			}
		})
	}
}

// TestServeSecretsExpanded: ${VAR} in a plugin's secrets and access_tokens
// reaches the plugin resolved (get_keyring_secret, get_access_token), and
// a start with unset variables is refused naming all of them.
func TestServeSecretsExpanded(t *testing.T) {
	dir := t.TempDir()
	wasm, err := os.ReadFile(testplugins.Test(t, "hyperhost"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "hyperhost.wasm"), wasm, 0o644)
	cfg := filepath.Join(dir, "wasmtools.toml")
	os.WriteFile(cfg, []byte(`[plugins.hyperhost]
secrets = { "github/bot" = "${GH_SECRET}" }
access_tokens = { "static-client" = "${STATIC_TOKEN}" }
`), 0o644)
	url, stderr := serveInProcess(t, map[string]string{"GH_SECRET": "s3cret-from-env", "STATIC_TOKEN": "tok-from-env"}, "--config", cfg, dir)
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	if got := callText(t, cs, "secret", map[string]any{"service": "github", "user": "bot"}); got != "s3cret-from-env" {
		t.Errorf("secret = %q, want the variable's value\n%s", got, stderr.String())
	}
	if got := callText(t, cs, "token", map[string]any{"credentials": map[string]any{"client_id": "static-client", "token_endpoint_url": "https://auth.invalid/token"}}); !strings.Contains(got, `"access_token":"tok-from-env"`) {
		t.Errorf("token = %q, want the variable's value", got)
	}

	var out, errb strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code := run(ctx, []string{"serve", "--config", cfg, dir}, lookup(nil), strings.NewReader(""), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "GH_SECRET, STATIC_TOKEN") {
		t.Errorf("exit %d, want a refusal naming GH_SECRET, STATIC_TOKEN:\n%s", code, errb.String())
	}
}
