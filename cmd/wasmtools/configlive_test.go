package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/sources"
	"github.com/wasmtools/wasmtools/internal/sources/sourcestest"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// readGranted calls the grants plugin's read of path in a new session,
// and returns its text, or "" when the call is refused (the tool is not
// served, or its result is an error).
func readGranted(t *testing.T, url, path string) string {
	t.Helper()
	cs, err := connectURL(t, url, bearer(""))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"Path": path}})
	if err != nil || res.IsError || len(res.Content) == 0 {
		return ""
	}
	return res.Content[0].(*mcp.TextContent).Text
}

// TestConfigReloadRefusedKeepsNoRevokedGrant: a configuration change
// revokes a plugin's folder grant and, in the same edit, pins the plugin
// to the bytes the operator deploys next (or sets anything else under
// which the file served now cannot load: a lower memory limit, a module
// limit, a load that times out). The new configuration is valid and is
// applied to every other plugin, but the file served now is refused under
// it, and the reloader keeps serving the plugin compiled under the OLD
// configuration: every new session still reads the folder the file on
// disk revoked. A later rescan (any plugin file event, SIGHUP, `wasmtools
// reload`) even marks it "loaded" with no error, and never loads it again
// under the configuration in force.
func TestConfigReloadRefusedKeepsNoRevokedGrant(t *testing.T) {
	data := t.TempDir()
	os.WriteFile(filepath.Join(data, "secret.txt"), []byte("top secret"), 0o644)
	dir := testplugins.Folder(t, map[string]string{"grants.wasm": testplugins.Test(t, "grants")})
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf("[plugins.grants]\nallowed_paths = [{ host = %q, guest = \"/data\" }]\n", data)), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
	if got := readGranted(t, url, "/data/secret.txt"); got != "top secret" {
		t.Fatalf("with the grant: read = %q\n%s", got, stderr.String())
	}

	// The grant revoked; the plugin pinned to other bytes.
	os.WriteFile(cfgPath, []byte("[plugins.grants]\nsha256 = \""+strings.Repeat("ab", 32)+"\"\n"), 0o644)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="configuration reloaded"`, "does not match the pin")) {
		t.Fatalf("the new configuration was not applied:\n%s", stderr.String())
	}
	if got := readGranted(t, url, "/data/secret.txt"); got == "top secret" {
		t.Errorf("a new session still reads the folder the configuration revoked: the plugin compiled under the old configuration is served")
	}

	// A rescan of the folder (here: another plugin deployed, any: counter
	// loads in milliseconds) does not make the plugin served under the
	// old configuration "loaded".
	os.WriteFile(filepath.Join(dir, ".counter.tmp"), testplugins.Bytes(t, testplugins.Example(t, "counter")), 0o644)
	os.Rename(filepath.Join(dir, ".counter.tmp"), filepath.Join(dir, "counter.wasm"))
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugin loaded", "counter.wasm")) {
		t.Fatalf("counter was not loaded:\n%s", stderr.String())
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url", url, "--json"}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	var rep statusReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatal(err)
	}
	for _, p := range rep.Plugins {
		if p.Name == "grants" && p.State == "loaded" && p.SHA256 != "" {
			t.Errorf("status: grants %s, sha256 %s, error %q: served and said loaded, though its bytes do not match the configuration's pin", p.State, p.SHA256, p.Error)
		}
	}
	if got := readGranted(t, url, "/data/secret.txt"); got == "top secret" {
		t.Errorf("after a rescan, a new session still reads the folder the configuration revoked")
	}
}

// k8sConfigWrite updates dir as Kubernetes' atomic writer updates a
// ConfigMap volume: the files go into a new timestamped folder, the
// "..data" link is replaced by a rename to point at it, and each file's
// name is a link through "..data" (made once).
func k8sConfigWrite(t *testing.T, dir, version string, files map[string]string) {
	t.Helper()
	ts := "..2026_12_06_" + version
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, ts, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		os.RemoveAll(filepath.Join(dir, old))
	}
}

// toolsSession connects to url, and returns the session and a function
// that waits, within the given time, until the session is served want
// tools: it lists them again on each list_changed (the readiness signal
// of a new catalogue), and reports whether there were want.
func toolsSession(t *testing.T, url string) func(want int, within time.Duration) bool {
	t.Helper()
	changed := make(chan struct{}, 1)
	copts := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}}
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return func(want int, within time.Duration) bool {
		deadline := time.NewTimer(within)
		defer deadline.Stop()
		for {
			res, err := cs.ListTools(context.Background(), nil)
			if err == nil && len(res.Tools) == want {
				return true
			}
			select {
			case <-changed:
			case <-deadline.C:
				return false
			}
		}
	}
}

// TestConfigLinkedFileUpdate: the configuration file is watched, and
// applied live, also when it is updated the way Kubernetes updates a
// ConfigMap volume (the config file is a link through "..data", and only
// "..data" is replaced: no event names the file), or when --config names
// a link to a file elsewhere whose target is rewritten. The watch looked
// only for events naming the file itself in its folder, so neither change
// was ever applied: a plugin disabled (or a grant revoked) in the
// ConfigMap stayed served until a restart.
func TestConfigLinkedFileUpdate(t *testing.T) {
	enabled := "[plugins.counter]\nenabled = true\n"
	disabled := "[plugins.counter]\nenabled = false\n"
	t.Run("kubernetes volume", func(t *testing.T) {
		dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
		vol := t.TempDir()
		k8sConfigWrite(t, vol, "1", map[string]string{"wasmtools.toml": enabled})
		url, stderr := serveInProcess(t, nil, "--config", filepath.Join(vol, "wasmtools.toml"), dir)
		tools := toolsSession(t, url)
		if !tools(1, startupTimeout) {
			t.Fatalf("counter is not served:\n%s", stderr.String())
		}
		k8sConfigWrite(t, vol, "2", map[string]string{"wasmtools.toml": disabled})
		if !tools(0, 30*time.Second) {
			t.Errorf("the ConfigMap's new configuration (counter disabled) was not applied:\n%s", stderr.String())
		}
	})
	t.Run("link to a file elsewhere", func(t *testing.T) {
		dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
		target := filepath.Join(t.TempDir(), "wasmtools.toml")
		os.WriteFile(target, []byte(enabled), 0o644)
		link := filepath.Join(t.TempDir(), "wasmtools.toml")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		url, stderr := serveInProcess(t, nil, "--config", link, dir)
		tools := toolsSession(t, url)
		if !tools(1, startupTimeout) {
			t.Fatalf("counter is not served:\n%s", stderr.String())
		}
		tmp := target + ".tmp"
		os.WriteFile(tmp, []byte(disabled), 0o644)
		os.Rename(tmp, target)
		if !tools(0, 30*time.Second) {
			t.Errorf("the linked file's new configuration (counter disabled) was not applied:\n%s", stderr.String())
		}
	})
}

// TestConfigMaxInstances: max_instances bounds a plugin's live instances
// (the least recently used idle one is evicted), whether it is set in
// [defaults] ("for every plugin; a plugin with no entry gets these") or in
// the plugin's entry, and whether it was there at start or added by a
// change of the configuration file (which "reloads every plugin under the
// new settings"; only global limits wait for a restart). The CLI read it
// once, at start, and only for plugins with an entry: [defaults]
// max_instances bounded no plugin without one, and a limit set or lowered
// live bounded nothing.
func TestConfigMaxInstances(t *testing.T) {
	// live holds n sessions open, each having called counter's count
	// once, and returns counter's live instances.
	live := func(t *testing.T, url string, n int) int {
		t.Helper()
		for range n {
			cs, err := connectURL(t, url, bearer(""))
			if err != nil {
				t.Fatal(err)
			}
			callText(t, cs, "count", nil)
		}
		return statusOf(t, url)["counter"].LiveInstances
	}
	t.Run("defaults", func(t *testing.T) {
		dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
		cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
		os.WriteFile(cfgPath, []byte("[defaults]\nmax_instances = 1\n"), 0o644)
		url, _ := serveInProcess(t, nil, "--config", cfgPath, dir)
		if n := live(t, url, 3); n > 1 {
			t.Errorf("[defaults] max_instances = 1: counter (no entry of its own) has %d live instances", n)
		}
	})
	t.Run("set live", func(t *testing.T) {
		dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
		cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
		os.WriteFile(cfgPath, []byte("[plugins.counter]\nenabled = true\n"), 0o644)
		url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
		os.WriteFile(cfgPath, []byte("[plugins.counter]\nmax_instances = 1\n"), 0o644)
		reloaded := func(s string) bool {
			return strings.Contains(s, `msg="configuration reloaded"`) && strings.Count(s, `msg="plugin loaded" plugin=counter`) >= 2
		}
		if !stderr.waitFor(time.Now().Add(startupTimeout), reloaded) {
			t.Fatalf("counter was not reloaded under the new configuration:\n%s", stderr.String())
		}
		if n := live(t, url, 3); n > 1 {
			t.Errorf("max_instances = 1 set live: counter has %d live instances", n)
		}
	})
}

// TestConfigAccessRuleOfPluginEnabledLive: a plugin is enabled by a
// change of the configuration file, in the same edit as its access rule
// (only alice may use it). Enabling was applied live but the access rule
// only at start, so until a restart the plugin was served to every
// tenant: bob listed and called a plugin the file on disk says is alice's
// alone. Access rules are now applied live, before the plugins are loaded
// again: alice is served it, bob is not, and once the rule goes, bob is.
func TestConfigAccessRuleOfPluginEnabledLive(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"counter.wasm":   testplugins.Example(t, "counter"),
		"versioned.wasm": testplugins.Test(t, "versioned"),
	})
	const head = "[http.tokens]\nalice = \"alice-token-0123456789\"\nbob = \"bob-token-0123456789\"\n\n"
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(head+"[plugins.counter]\nenabled = false\n\n[plugins.versioned]\nenabled = false\n"), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)

	// counter enabled, alice's alone.
	os.WriteFile(cfgPath, []byte(head+"[plugins.counter]\naccess = { subjects = [\"alice\"] }\n\n[plugins.versioned]\nenabled = false\n"), 0o644)
	if !stderr.waitFor(time.Now().Add(startupTimeout), func(s string) bool { return strings.Count(s, `msg="configuration reloaded"`) >= 1 }) {
		t.Fatalf("the configuration was not reloaded:\n%s", stderr.String())
	}
	// A second change, versioned enabled, is applied after the first
	// one's reload is done (one at a time): once bob is served versioned,
	// counter is as the first change left it.
	os.WriteFile(cfgPath, []byte(head+"[plugins.counter]\naccess = { subjects = [\"alice\"] }\n\n[plugins.versioned]\nenabled = true\n"), 0o644)
	bob, err := connectURL(t, url, bearer("bob-token-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(startupTimeout)
	for !slices.Contains(toolNames(t, bob), "version") {
		if time.Now().After(deadline) {
			t.Fatalf("versioned was not enabled:\n%s", stderr.String())
		}
		// versioned's load under the second change is the signal; the list
		// is read again after it (or after a second, in case it came
		// between the read and the wait).
		stderr.waitFor(time.Now().Add(time.Second), contains(`msg="plugin loaded" plugin=versioned`))
	}
	if names := toolNames(t, bob); slices.Contains(names, "count") {
		t.Errorf("bob is served %v: counter, alice's alone in the configuration, is everyone's", names)
	}
	res, err := bob.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"})
	if err == nil && !res.IsError {
		t.Errorf("bob called counter's count, alice's alone in the configuration: %v", res.Content[0].(*mcp.TextContent).Text)
	}
	// The rule is applied live, not held back to a restart: alice is
	// served counter now, and once the rule goes, bob is too.
	alice, err := connectURL(t, url, bearer("alice-token-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	if names := toolNames(t, alice); !slices.Contains(names, "count") {
		t.Errorf("alice is served %v: want counter, hers by the new rule", names)
	}
	os.WriteFile(cfgPath, []byte(head+"[plugins.counter]\n\n[plugins.versioned]\nenabled = true\n"), 0o644)
	for deadline := time.Now().Add(startupTimeout); !slices.Contains(toolNames(t, bob), "count"); {
		if time.Now().After(deadline) {
			t.Fatalf("counter's rule removed, bob is still not served it:\n%s", stderr.String())
		}
		stderr.waitFor(time.Now().Add(time.Second), func(s string) bool { return strings.Count(s, `msg="configuration reloaded"`) >= 3 })
	}
}

// TestConfigSourceSettingsChangedLive: a remote plugin's verification
// settings are changed in the configuration file: its public key rotated
// (the old key leaked), or insecure_skip_signature turned off. The
// version served was verified only under the old settings, and fails
// under the new ones. A restart serves it no more (the store's record
// is kept per verification settings, and is not used under others); a
// live change kept serving it, loaded again under the new configuration
// as if it had been verified under it, because a refused fetch keeps the
// link of "the version served".
func TestConfigSourceSettingsChangedLive(t *testing.T) {
	cosign := sourcestest.Cosign(t)
	host, _ := sourcestest.Registry(t)
	oldKey, oldPub := sourcestest.KeyPair(t, cosign, t.TempDir())
	_, newPub := sourcestest.KeyPair(t, cosign, t.TempDir())
	wasm := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	signed := sourcestest.Push(t, host, "plugins/signed", "stable", sources.MediaTypeWasm, wasm)
	sourcestest.Sign(t, cosign, oldKey, host+"/plugins/signed@"+signed)
	sourcestest.Push(t, host, "plugins/unsigned", "stable", sources.MediaTypeWasm, bytes.Replace(wasm, []byte(`"v1"`), []byte(`"v2"`), 1))

	for _, tt := range []struct{ name, repo, before, after string }{
		{"public key rotated", "plugins/signed", fmt.Sprintf("public_key = %q\n", oldPub), fmt.Sprintf("public_key = %q\n", newPub)},
		{"insecure_skip_signature turned off", "plugins/unsigned", "insecure_skip_signature = true\n", fmt.Sprintf("public_key = %q\n", newPub)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			entry := "[plugins.versioned]\nsource = \"oci://" + host + "/" + tt.repo + ":stable\"\n"
			cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
			os.WriteFile(cfgPath, []byte(entry+tt.before), 0o644)
			url, stderr := serveInProcess(t, nil, "--config", cfgPath, "--source-dir", t.TempDir())
			tools := toolsSession(t, url)
			if !tools(1, startupTimeout) {
				t.Fatalf("versioned is not served:\n%s", stderr.String())
			}
			os.WriteFile(cfgPath, []byte(entry+tt.after), 0o644)
			if !stderr.waitFor(time.Now().Add(startupTimeout), contains(`msg="configuration reloaded"`, `msg="plugin source refused`)) {
				t.Fatalf("the new configuration was not applied:\n%s", stderr.String())
			}
			if !tools(0, 30*time.Second) {
				t.Errorf("the version verified only under the old settings is still served under the new ones:\n%s", stderr.String())
			}
		})
	}
}

// TestConfigChangeNotHeldBySlowSource: a change of the configuration
// file (here: a local plugin disabled, as one would to stop a plugin
// found misbehaving) is applied at once, whatever a remote source's
// server does meanwhile. Every change first synced every remote source
// and only then reloaded the plugins under the new settings, so a server
// that accepted the fetch and sent nothing (or trickled) held the local
// plugin's disabling for the source's whole timeout ([sources] timeout,
// 5 minutes by default), and every later change behind it.
func TestConfigChangeNotHeldBySlowSource(t *testing.T) {
	wasm := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	var hang atomic.Bool
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hang.Load() { // the headers and a first byte, then nothing
			w.Header().Set("Content-Length", fmt.Sprint(len(wasm)))
			w.Write(wasm[:1])
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.Write(wasm)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	remote := "[plugins.remote]\nsource = \"" + srv.URL + "/versioned.wasm\"\ninsecure_skip_signature = true\n\n"
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(remote+"[plugins.counter]\nenabled = true\n"), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, "--source-dir", t.TempDir(), dir)
	tools := toolsSession(t, url)
	if !tools(2, startupTimeout) {
		t.Fatalf("counter and remote are not served:\n%s", stderr.String())
	}
	hang.Store(true)
	os.WriteFile(cfgPath, []byte(remote+"[plugins.counter]\nenabled = false\n"), 0o644)
	if !tools(1, time.Minute) {
		t.Errorf("counter, disabled in the configuration, was still served a minute later, while a remote source's server sent nothing after its headers:\n%s", stderr.String())
	}
}

// TestConfigTruncatedNotApplied: a configuration file rewritten in place
// by a command whose output is redirected into it (`sops -d wasmtools.enc
// > wasmtools.toml`, `vault kv get … > wasmtools.toml`, a template
// rendered by a slow tool) is empty from the shell's truncation until the
// command writes: 100 ms of quiet and the watch read it. An empty file is
// valid TOML, and was applied as the whole configuration: every plugin
// the file disables was served to every client (and every pin, tool
// filter and ceiling dropped) until the command finished writing.
func TestConfigTruncatedNotApplied(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"counter.wasm":   testplugins.Example(t, "counter"),
		"versioned.wasm": testplugins.Test(t, "versioned"),
	})
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte("[plugins.counter]\nenabled = false\n"), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
	tools := toolsSession(t, url)
	if !tools(1, startupTimeout) { // versioned's version
		t.Fatalf("versioned alone is not served:\n%s", stderr.String())
	}
	// The shell truncates; the command has not written yet.
	f, err := os.OpenFile(cfgPath, os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	read := func(s string) bool {
		return strings.Contains(s, `msg="configuration reloaded"`) || strings.Contains(s, "new configuration refused")
	}
	if !stderr.waitFor(time.Now().Add(startupTimeout), read) {
		t.Fatalf("the truncated file was not read:\n%s", stderr.String())
	}
	// Applied, counter is served within moments of the log line.
	if tools(2, 5*time.Second) {
		t.Errorf("counter, disabled in the configuration, is served while the file is being rewritten (empty)")
	}
}

// TestStatusShowsRetrying: a plugin whose load failed for a reason that
// may pass (here its compile timeout is cut to nothing; on a loaded
// machine, any) is shown by `wasmtools status` as retrying, with the
// reason and the next attempt's time, and said so in the log once.
func TestStatusShowsRetrying(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"slowstart.wasm": testplugins.Test(t, "slowstart")})
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte("[plugins.slowstart]\ncompile_timeout = \"1ns\"\n"), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("for a reason that may pass")) {
		t.Fatalf("the transient failure was not said:\n%s", stderr.String())
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url", url}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("status: exit %d: %s", code, errb.String())
	}
	if s := out.String(); !strings.Contains(s, "retrying") || !strings.Contains(s, "deadline exceeded") || !strings.Contains(s, "tried again at") {
		t.Errorf("status does not say the plugin is retrying, why and when:\n%s", s)
	}
}

// TestConfigHandleNoteAndMaxQuestionsLive: `handle_note` and `[grants]
// max_questions` apply to each call after a configuration change, as the
// other per-request settings do, not only after a restart: a session at
// the old cap of grant questions is asked again under a higher one, and
// a result that mints a handle leaves out the note once the
// configuration says so.
func TestConfigHandleNoteAndMaxQuestionsLive(t *testing.T) {
	dir, cfgPath, srv := grantSetup(t)
	os.WriteFile(filepath.Join(dir, "counter.wasm"), testplugins.Bytes(t, testplugins.Example(t, "counter")), 0o644)
	base, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(cfgPath, append(base, "\n[grants]\nmax_questions = 1\n"...), 0o644)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
	target := strings.TrimPrefix(srv.URL, "http://")

	g := &grantClient{} // dismisses every question
	gs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: g.handler}).
		Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer gs.Close()
	fetchText(t, gs, map[string]any{"url": srv.URL}) // asked, dismissed
	if got := fetchText(t, gs, map[string]any{"url": srv.URL}); !strings.Contains(got, "asked the most grant questions it may be (1)") {
		t.Fatalf("past the cap of 1: %q", got)
	}
	blocks := func() int { // of a result that mints a handle (2026-07-28)
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count"})
		if err != nil {
			t.Fatal(err)
		}
		return len(res.Content)
	}
	if n := blocks(); n != 2 {
		t.Fatalf("handle_note on: %d content blocks, want the count and the note", n)
	}

	os.WriteFile(cfgPath, append(base, "\n[defaults]\nhandle_note = false\n\n[grants]\nmax_questions = 3\n"...), 0o644)
	// Applied once the plugins are loaded again under it.
	reloaded := func(s string) bool { return strings.Count(s, `msg="plugin loaded" plugin=counter`) >= 2 }
	if !stderr.waitFor(time.Now().Add(startupTimeout), reloaded) {
		t.Fatalf("the new configuration was not applied:\n%s", stderr.String())
	}
	want := "host " + target + " is not granted to this plugin: the person dismissed the question"
	if got := fetchText(t, gs, map[string]any{"url": srv.URL}); !strings.Contains(got, want) {
		t.Errorf("max_questions raised to 3: %q, want the session asked again (%q)", got, want)
	}
	if n := blocks(); n != 1 {
		t.Errorf("handle_note = false: %d content blocks, want the count alone", n)
	}
}

// TestConfigEditBeforeWatchApplied: a configuration file edited after the
// server read it at start but before its watch was set up (a deploy that
// writes the file and starts the service at once) is applied: no event
// will come for that edit, so without a look at the file once watched,
// the server ran under the old configuration until the next edit.
func TestConfigEditBeforeWatchApplied(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	cfgPath := filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte("# nothing yet\n"), 0o644)
	hook := func() { os.WriteFile(cfgPath, []byte("[plugins.counter]\nenabled = false\n"), 0o644) }
	configWatchHook.Store(&hook)
	defer configWatchHook.Store(nil)
	url, stderr := serveInProcess(t, nil, "--config", cfgPath, dir)
	// The watch may begin before the first load ends (a loaded machine):
	// then counter is never loaded, and no "plugin removed" is logged.
	if !stderr.waitFor(time.Now().Add(time.Minute), contains(`msg="configuration reloaded"`)) {
		t.Fatalf("the configuration edited before it was watched was not applied:\n%s", stderr.String())
	}
	tools := toolsSession(t, url)
	if !tools(0, startupTimeout) {
		t.Errorf("counter, disabled by the edit, is still served")
	}
}
