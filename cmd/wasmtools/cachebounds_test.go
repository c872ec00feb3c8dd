package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCacheBoundsFromConfig: the configuration's [cache] bounds reach the
// runtime's options (unset: 0, the sandbox's defaults), and a bound of 0
// is refused at start, before anything is served.
func TestCacheBoundsFromConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tt := range []struct {
		body              string
		checked, compiled int64
	}{
		{"", 0, 0},
		{"[cache]\nchecked_bytes = \"16MiB\"\ncompiled_bytes = \"1B\"\n", 16 << 20, 1},
	} {
		c := commonFlags{configPath: write("wasmtools.toml", tt.body)}
		if err := c.loadConfig(lookup(nil)); err != nil {
			t.Fatal(err)
		}
		if o := c.runtimeOptions(nil); o.CheckedCacheBytes != tt.checked || o.CompiledCacheBytes != tt.compiled {
			t.Errorf("%q: runtime options bound %d, %d; want %d, %d", tt.body, o.CheckedCacheBytes, o.CompiledCacheBytes, tt.checked, tt.compiled)
		}
	}
	cfg := write("zero.toml", "[cache]\ncompiled_bytes = 0\n")
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"serve", "--cache-dir", t.TempDir(), "--config", cfg, t.TempDir()}, lookup(nil), strings.NewReader(""), &bytes.Buffer{}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "cache.compiled_bytes: 0") {
		t.Errorf("serve with compiled_bytes = 0: exit %d, stderr:\n%s\nwant it refused, naming the setting", code, stderr.String())
	}
}
