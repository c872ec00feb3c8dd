package plugins_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Hostile plugin files and tool lists of project issue 12; see
// docs/SECURITY.md.

// TestHostilePluginFiles puts what is not a plugin file in a plugin
// folder: a symlink to /dev/zero (read whole, it ended the process), a
// FIFO, named or linked to (reading it blocked the load forever), a file
// over the module size limit. Each is refused, naming the file; the good
// plugin, and a symlink to another, are served.
func TestHostilePluginFiles(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero.wasm")); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "pipe.wasm")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	if err := os.Symlink(fifo, filepath.Join(dir, "fifo.wasm")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(testplugins.Test(t, "versioned"), filepath.Join(dir, "link.wasm")); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.wasm")
	if err := os.WriteFile(big, make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	policy := sandbox.NewPolicy().WithModuleLimits(sandbox.ModuleLimits{MaxModuleSize: 1 << 20})
	optsFor := func(path string) plugins.Options {
		return plugins.Options{Policy: &policy}
	}
	done := make(chan struct{})
	var cat *plugins.Catalogue
	var errs []error
	go func() {
		defer close(done)
		cat, errs = plugins.LoadAll(context.Background(), newRuntime(t), []string{dir, fifo}, optsFor)
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("LoadAll did not return in 60 s: blocked on a FIFO?")
	}
	defer cat.Close(context.Background())
	want := map[string]string{
		"zero.wasm": "not a regular file (a character device)",
		"fifo.wasm": "not a regular file (a FIFO)",
		"pipe.wasm": "not a regular file (a FIFO)",
		"big.wasm":  "2097152 bytes is over the limit max_module_size = 1048576",
	}
	for _, err := range errs {
		for file, reason := range want {
			if strings.Contains(err.Error(), file) && strings.Contains(err.Error(), reason) {
				delete(want, file)
			}
		}
	}
	for file, reason := range want {
		t.Errorf("no error for %s saying %q; errors: %v", file, reason, errs)
	}
	if len(errs) != 4 {
		t.Errorf("%d errors, want 4: %v", len(errs), errs)
	}
	if got := len(cat.Plugins()); got != 2 {
		t.Errorf("%d plugins served, want 2 (counter, and versioned through a symlink)", got)
	}
}

// listPlugin loads fixture hostilelist, whose lists are config values.
func listPlugin(t *testing.T, rt *sandbox.Runtime, policy sandbox.Policy, lists map[string]string) (*plugins.Plugin, error) {
	cfg := map[string]string{"tools": `{"tools":[]}`, "prompts": `{"prompts":[]}`, "resources": `{"resources":[]}`, "templates": `{"resourceTemplates":[]}`}
	for k, v := range lists {
		cfg[k] = v
	}
	policy = policy.WithConfig(cfg)
	path := testplugins.Test(t, "hostilelist")
	p, err := plugins.Load(context.Background(), rt, path, testplugins.Bytes(t, path), plugins.Options{Policy: &policy})
	if err == nil {
		t.Cleanup(func() { p.Close(context.Background()) })
	}
	return p, err
}

// tools returns a tool list of n tools, with next as its next cursor.
func tools(n int, next string) string {
	var b strings.Builder
	b.WriteString(`{"tools":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"name":"t%d"}`, i)
	}
	b.WriteString(`]`)
	if next != "" {
		fmt.Fprintf(&b, `,"nextCursor":%q`, next)
	}
	b.WriteString(`}`)
	return b.String()
}

func TestHostileToolLists(t *testing.T) {
	rt := newRuntime(t)
	// The baseline: loading the fixture with a list of 10 tools.
	start := time.Now()
	if p, err := listPlugin(t, rt, sandbox.NewPolicy(), map[string]string{"tools": tools(10, "")}); err != nil || len(p.Tools()) != 10 {
		t.Fatalf("10 tools: %v", err)
	}
	baseline := time.Since(start)
	many := func(key, field string, n int) string {
		var b strings.Builder
		fmt.Fprintf(&b, `{%q:[`, field)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"name":"p%d","uri":"u:%d","uriTemplate":"u:%d/{x}"}`, i, i, i)
		}
		b.WriteString(`]}`)
		return b.String()
	}
	// 4 000 000 bytes of padding in a page of one tool, and a next page.
	fat := `{"tools":[{"name":"t","description":"` + strings.Repeat("x", 4_000_000) + `"}],"nextCursor":"more"}`
	tests := []struct {
		name  string
		lists map[string]string
		want  string
	}{
		{"100001_tools", map[string]string{"tools": tools(100_001, "")}, "at least 100001 tools, over the limit MaxListItems = 2000"},
		{"2001_tools", map[string]string{"tools": tools(2001, "")}, "at least 2001 tools, over the limit MaxListItems = 2000"},
		{"pages_of_4MB", map[string]string{"tools": fat}, "by page 3, over the limit MaxListBytes = 8388608"},
		{"endless_pages", map[string]string{"tools": tools(1, "again")}, "the tools take more than 32 pages, over the limit MaxListPages = 32"},
		{"many_prompts", map[string]string{"prompts": many("prompts", "prompts", 2001)}, "list_prompts: at least 2001 prompts"},
		{"many_resources", map[string]string{"resources": many("resources", "resources", 2001)}, "list_resources: at least 2001 resources"},
		{"many_templates", map[string]string{"templates": many("templates", "resourceTemplates", 2001)}, "list_resource_templates: at least 2001 resource templates"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, err := listPlugin(t, rt, sandbox.NewPolicy().WithMaxOutput(8<<20), tt.lists)
			took := time.Since(start)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("load: %v; want an error saying %q", err, tt.want)
			}
			// The fixture copies its list from its configuration a byte at a
			// time through the kernel, which is slow under the race
			// detector: the slack is for that, not for the host.
			if bound := 20*baseline + 10*time.Second; took > bound {
				t.Errorf("refusing took %v, over %v (20 times loading 10 tools, plus 10 s)", took, bound)
			}
		})
	}
}

// TestHostileLoadTimeout: a plugin whose listing never ends is stopped at
// the load timeout, well before the call timeout.
func TestHostileLoadTimeout(t *testing.T) {
	const load = 500 * time.Millisecond
	start := time.Now()
	_, err := listPlugin(t, newRuntime(t), sandbox.NewPolicy().WithCallTimeout(time.Minute).WithLoadTimeout(load), map[string]string{"spin": "yes"})
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "took longer than the load timeout of 500ms") {
		t.Fatalf("load: %v; want the load timeout", err)
	}
	if took > load+10*time.Second {
		t.Errorf("the load took %v, over the load timeout plus 10 s", took)
	}
}
