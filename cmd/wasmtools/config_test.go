package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

func lookup(vars map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
}

// serveInProcess runs `wasmtools serve --http` and waits for it.
func serveInProcess(t *testing.T, env map[string]string, args ...string) (string, *lockedBuffer) {
	t.Helper()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &lockedBuffer{}
	done := make(chan struct{})
	go func() {
		run(ctx, append([]string{"serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--http", addr}, args...), lookup(env), strings.NewReader(""), &bytes.Buffer{}, stderr)
		close(done)
	}()
	t.Cleanup(func() { cancel(); <-done })
	// Ready once serving, and the plugins' first load is done.
	// With remote sources, also once they are fetched (in the background,
	// after the first load).
	ready := func(s string) bool {
		return contains("serving MCP over streamable HTTP", "plugins loaded")(s) &&
			(!strings.Contains(s, "fetching in the background") || strings.Contains(s, `msg="plugin sources fetched"`))
	}
	refused := contains("level=ERROR msg=\"configuration refused\"")
	stderr.waitFor(time.Now().Add(startupTimeout), func(s string) bool { return ready(s) || refused(s) })
	if s := stderr.String(); !ready(s) || refused(s) {
		t.Fatalf("serve did not start:\n%s", s)
	}
	return "http://" + addr, stderr
}

type bearer string

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b != "" {
		r.Header.Set("Authorization", "Bearer "+string(b))
	}
	return http.DefaultTransport.RoundTrip(r)
}

func connectURL(t *testing.T, url string, rt http.RoundTripper) (*mcp.ClientSession, error) {
	t.Helper()
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: rt}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func TestConfig(t *testing.T) {
	// The example folder with versioned for notes, as the plugin with no
	// entry: a few hundred bytes where notes takes seconds to load under
	// the race detector.
	dir := testplugins.Folder(t, map[string]string{
		"hash.wasm":      testplugins.Example(t, "hash"),
		"versioned.wasm": testplugins.Test(t, "versioned"),
		"counter.wasm":   testplugins.Example(t, "counter"),
		"servlet.wasm":   testplugins.Test(t, "servlet"),
	})
	hashSum := sha256.Sum256(testplugins.Bytes(t, testplugins.Example(t, "hash")))
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
[http]
auth_token = "${TOKEN}"

[plugins.hash]
sha256 = "%s"
tools = { deny = ["base64"] }

[plugins.counter]
enabled = false

[plugins.servlet]
sha256 = "%s"
config = { greeting = "${GREETING}" }
`, hex.EncodeToString(hashSum[:]), strings.Repeat("0", 64))), 0o644)
	url, stderr := serveInProcess(t, map[string]string{"TOKEN": "s3cret", "GREETING": "hi"}, "--config", cfgPath, dir)

	if _, err := connectURL(t, url, bearer("")); err == nil {
		t.Error("connected without the token")
	}
	if _, err := connectURL(t, url, bearer("wrong")); err == nil {
		t.Error("connected with a wrong token")
	}
	cs, err := connectURL(t, url, bearer("s3cret"))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	names := toolNames(t, cs)
	// hash: pinned and matching, base64 denied; counter: disabled;
	// servlet: its pin does not match; versioned: no entry, defaults.
	if got := strings.Join(names, ","); got != "hash,version" {
		t.Errorf("tools = %s", got)
	}
	if !strings.Contains(stderr.String(), "does not match the pin") {
		t.Errorf("the pin mismatch was not logged:\n%s", stderr.String())
	}

	// A browser page of another origin cannot call.
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", "http://evil.example")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin request: %s, want 403", resp.Status)
	}
	// Nor can a DNS-rebound name reach the loopback server.
	req, _ = http.NewRequest(http.MethodPost, url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Host = "attacker.example"
	req.Header.Set("Authorization", "Bearer s3cret")
	req.Header.Set("Content-Type", "application/json")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("non-local Host header: %s, want 403", resp.Status)
	}
}

func TestConfigRefused(t *testing.T) {
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(`[plugins.a]
config = { k = "${NOT_SET_ONE}", j = "${NOT_SET_TWO}" }`), 0o644)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"serve", "--config", cfgPath, t.TempDir()}, lookup(nil), strings.NewReader(""), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "NOT_SET_ONE, NOT_SET_TWO") {
		t.Errorf("exit %d:\n%s", code, errb.String())
	}
}

// TestConfigReload: a changed configuration is applied live, and a broken
// one refused; the file written in place, or mounted from a Kubernetes
// ConfigMap, whose update replaces the "..data" link the file points
// through and names the file in no event.
func TestConfigReload(t *testing.T) {
	for _, layout := range []string{"file", "configmap"} {
		t.Run(layout, func(t *testing.T) {
			cfgDir := t.TempDir()
			cfgPath := filepath.Join(cfgDir, "wasmtools.toml")
			version := 0
			writeConfig := func(b []byte) {
				if layout == "file" {
					os.WriteFile(cfgPath, b, 0o644)
					return
				}
				version++
				ts := fmt.Sprintf("..2026_12_06_%d", version)
				os.Mkdir(filepath.Join(cfgDir, ts), 0o755)
				os.WriteFile(filepath.Join(cfgDir, ts, "wasmtools.toml"), b, 0o644)
				old, _ := os.Readlink(filepath.Join(cfgDir, "..data"))
				os.Symlink(ts, filepath.Join(cfgDir, "..data_tmp"))
				if err := os.Rename(filepath.Join(cfgDir, "..data_tmp"), filepath.Join(cfgDir, "..data")); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Lstat(cfgPath); err != nil {
					os.Symlink(filepath.Join("..data", "wasmtools.toml"), cfgPath)
				}
				if old != "" {
					os.RemoveAll(filepath.Join(cfgDir, old))
				}
			}
			testConfigReload(t, cfgPath, writeConfig)
		})
	}
}

func testConfigReload(t *testing.T, cfgPath string, writeConfig func([]byte)) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	writeConfig([]byte("[plugins.counter]\nenabled = true\n"))
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
	// The client hears of each catalogue change: the readiness signal of
	// the new configuration.
	changed := make(chan struct{}, 16)
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}
	copts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	callText(t, cs, "count", nil)
	// The watch starts apart from serving and gives no sign of it: the
	// file is written again each second until the change is seen.
	disabled := []byte("[plugins.counter]\nenabled = false\n")
	writeConfig(disabled)
	deadline := time.NewTimer(startupTimeout)
	defer deadline.Stop()
	again := time.NewTicker(time.Second)
	defer again.Stop()
	for {
		res, _ := cs.ListTools(context.Background(), nil)
		if res != nil && len(res.Tools) == 0 {
			break
		}
		select {
		case <-changed:
		case <-again.C:
			writeConfig(disabled)
		case <-deadline.C:
			t.Fatalf("the plugin was not disabled by the new configuration:\n%s", stderr.String())
		}
	}
	// A broken configuration is refused, the one in force kept.
	writeConfig([]byte("[plugins.counter\n"))
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("new configuration refused")) {
		t.Fatalf("the broken configuration was not reported:\n%s", stderr.String())
	}
}

// The inspect tests of grants inspect counter: what is granted is the
// configuration's, whatever the plugin, and counter (602 bytes of WAT,
// no manifest section) loads in milliseconds where a Go plugin such as
// hash takes seconds under the race detector.
func TestInspectGrants(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	os.WriteFile(filepath.Join(dir, "counter.manifest.json"), []byte(`{"hosts":["api.example.com","cdn.example.com"],"config":["key"]}`), 0o644)
	cfgPath := filepath.Join(dir, "c.toml")
	os.WriteFile(cfgPath, []byte(`[plugins.counter]
allowed_hosts = ["api.example.com"]`), 0o644)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"inspect", "--config", cfgPath, "--json", filepath.Join(dir, "counter.wasm")}, nil, nil, &out, &errb)
	var in inspection
	json.Unmarshal(out.Bytes(), &in)
	if code != 0 || in.Requested == nil || strings.Join(in.Missing, ";") != "host cdn.example.com;config key" {
		t.Errorf("exit %d, %+v\n%s", code, in, errb.String())
	}
}

// TestInspectGrantsWithoutManifest: the text output shows what the
// configuration grants a plugin that states no needs (it was only in
// --json).
func TestInspectGrantsWithoutManifest(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cfgPath := filepath.Join(dir, "c.toml")
	os.WriteFile(cfgPath, []byte("[plugins.counter]\nallowed_hosts = [\"api.example.com\"]\nenv = [\"LANG\"]\n"), 0o644)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"inspect", "--config", cfgPath, filepath.Join(dir, "counter.wasm")}, lookup(map[string]string{"LANG": "C"}), nil, &out, &errb)
	if code != 0 || !strings.Contains(out.String(), "hosts   granted [api.example.com]") {
		t.Errorf("exit %d:\n%s%s", code, out.String(), errb.String())
	}
}
