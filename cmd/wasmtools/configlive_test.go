package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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

	// A rescan of the folder (here: another plugin deployed) does not
	// make the plugin served under the old configuration "loaded".
	os.WriteFile(filepath.Join(dir, ".hash.tmp"), testplugins.Bytes(t, testplugins.Example(t, "hash")), 0o644)
	os.Rename(filepath.Join(dir, ".hash.tmp"), filepath.Join(dir, "hash.wasm"))
	if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugin loaded", "hash.wasm")) {
		t.Fatalf("hash was not loaded:\n%s", stderr.String())
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
