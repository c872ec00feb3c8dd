package plugins_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

func newRuntime(t *testing.T) *sandbox.Runtime { return testplugins.Runtime(t) }

func load(t *testing.T, rt *sandbox.Runtime, path string, opts plugins.Options) *plugins.Plugin {
	t.Helper()
	p, err := plugins.Load(context.Background(), rt, path, testplugins.Bytes(t, path), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func toolNames(ts []*plugins.Tool) []string {
	var names []string
	for _, t := range ts {
		names = append(names, t.Name)
	}
	return names
}

func TestLoadDetectsInterface(t *testing.T) {
	rt := newRuntime(t)
	tests := []struct {
		path  string
		iface abi.Interface
		tools []string
	}{
		{testplugins.Example(t, "hash"), abi.InterfaceV2, []string{"base64", "hash"}},
		{testplugins.Example(t, "notes"), abi.InterfaceV2, []string{"note_add", "note_clear", "note_list"}},
		{testplugins.Example(t, "counter"), abi.InterfaceServlet, []string{"count"}},
		{testplugins.Test(t, "servlet"), abi.InterfaceServlet, []string{"echo", "repeat", "fail", "panic", "config", "var_count", "image", "print", "remember", "random", "mathrand"}},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			p := load(t, rt, tt.path, plugins.Options{})
			if p.Interface() != tt.iface {
				t.Errorf("interface = %s, want %s", p.Interface(), tt.iface)
			}
			if diff := cmp.Diff(tt.tools, toolNames(p.Tools())); diff != "" {
				t.Errorf("tools (-want +got):\n%s", diff)
			}
			if len(p.SHA256()) != 64 || p.Size() == 0 {
				t.Errorf("sha256 %q size %d", p.SHA256(), p.Size())
			}
		})
	}
}

func TestLoadRefuses(t *testing.T) {
	rt := newRuntime(t)
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	tests := []struct {
		name string
		wasm []byte
		opts plugins.Options
		want string
	}{
		{"not wasm", []byte("hello, world\n"), plugins.Options{}, "not a WebAssembly module"},
		{"missing import", testplugins.Bytes(t, testplugins.Test(t, "missingimport")), plugins.Options{}, "extism:host/user.launch_missiles"},
		{"schema not an object", testplugins.Bytes(t, testplugins.Test(t, "badschema")), plugins.Options{}, `type is "string", but MCP requires "object"`},
		{"capabilities not an object", testplugins.Bytes(t, testplugins.Test(t, "badcaps")), plugins.Options{}, "requiredClientCapabilities must be an object"},
		{"unknown task support", testplugins.Bytes(t, testplugins.Test(t, "badtask")), plugins.Options{}, `execution.taskSupport "always" is not forbidden, optional or required`},
		{"invalid name from prefix", counter, plugins.Options{Prefix: "my tools."}, `tool name "my tools.count" is not allowed`},
		{"name too long", counter, plugins.Options{Prefix: strings.Repeat("x", 60)}, "is not allowed"},
		{"no plugin interface", testplugins.Bytes(t, testplugins.Test(t, "missingimport"))[:0], plugins.Options{}, "not a WebAssembly module"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := plugins.Load(context.Background(), rt, "dir/"+strings.ReplaceAll(tt.name, " ", "-")+".wasm", tt.wasm, tt.opts)
			if err == nil {
				p.Close(context.Background())
				t.Fatal("loaded; want an error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
		})
	}
}

func TestCatalogueRefusesCollisions(t *testing.T) {
	rt := newRuntime(t)
	path := testplugins.Example(t, "counter")
	first := load(t, rt, path, plugins.Options{Name: "counter"})
	second := load(t, rt, path, plugins.Options{Name: "counter2"})
	prefixed := load(t, rt, path, plugins.Options{Name: "counter3", Prefix: "c3_"})
	sameName := load(t, rt, testplugins.Example(t, "hash"), plugins.Options{Name: "counter"})

	cat, rejected := plugins.NewCatalogue([]*plugins.Plugin{first, second, prefixed, sameName})
	if diff := cmp.Diff([]string{"c3_count", "count"}, toolNames(cat.Tools())); diff != "" {
		t.Errorf("tools (-want +got):\n%s", diff)
	}
	if len(rejected) != 2 {
		t.Fatalf("rejected %d plugins, want 2: %v", len(rejected), rejected)
	}
	if rejected[0].Plugin != second || !strings.Contains(rejected[0].Err.Error(), `"count" is served by plugin "counter"`) {
		t.Errorf("first rejection: %v", rejected[0].Err)
	}
	if rejected[1].Plugin != sameName || !strings.Contains(rejected[1].Err.Error(), "name is taken") {
		t.Errorf("second rejection: %v", rejected[1].Err)
	}
	if tl, ok := cat.Tool("count"); !ok || tl.Plugin() != first {
		t.Error("count is not served by the first plugin")
	}
}

func TestLoadAllSkipsBadFiles(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{
		"counter.wasm": testplugins.Example(t, "counter"),
		"twin.wasm":    testplugins.Example(t, "counter"),
	})
	os.WriteFile(filepath.Join(dir, "junk.wasm"), []byte("not wasm at all"), 0o644)
	os.WriteFile(filepath.Join(dir, "README.txt"), []byte("ignored"), 0o644)
	os.WriteFile(filepath.Join(dir, ".partial.wasm"), []byte("\x00asm"), 0o644)

	cat, errs := plugins.LoadAll(context.Background(), newRuntime(t), []string{dir, filepath.Join(dir, "nope")}, nil)
	defer cat.Close(context.Background())
	var names []string
	for _, p := range cat.Plugins() {
		names = append(names, p.Name())
	}
	if diff := cmp.Diff([]string{"counter"}, names); diff != "" {
		t.Errorf("plugins (-want +got):\n%s", diff)
	}
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	for _, want := range []string{"nope: ", "junk.wasm): not a WebAssembly module", `plugin "twin"`} {
		if !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("no error says %q: %q", want, msgs)
		}
	}
	if len(errs) != 3 {
		t.Errorf("got %d errors, want 3: %q", len(errs), msgs)
	}
}

func TestValidateArguments(t *testing.T) {
	p := load(t, newRuntime(t), testplugins.Example(t, "hash"), plugins.Options{})
	var hash *plugins.Tool
	for _, tl := range p.Tools() {
		if tl.Name == "hash" {
			hash = tl
		}
	}
	tests := []struct {
		name, args string
		want       string // "" for valid
	}{
		{"valid", `{"text":"abc"}`, ""},
		{"valid with enum", `{"text":"abc","algorithm":"md5"}`, ""},
		{"missing required", `{}`, "text"},
		{"wrong type", `{"text":5}`, "string"},
		{"not in enum", `{"text":"a","algorithm":"crc32"}`, "enum"},
		{"extra property", `{"text":"a","x":1}`, "x"},
		{"not an object", `[1,2]`, "object"},
		{"not JSON", `{"text":`, "not JSON"},
		{"absent", ``, "text"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := hash.ValidateArguments(json.RawMessage(tt.args))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("valid arguments refused: %v", err)
				}
				return
			}
			if !errors.Is(err, plugins.ErrInvalidArguments) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v; want ErrInvalidArguments mentioning %q", err, tt.want)
			}
		})
	}
}

func TestInstanceCallTool(t *testing.T) {
	rt := newRuntime(t)
	for _, path := range []string{testplugins.Example(t, "notes"), testplugins.Test(t, "servlet")} {
		p := load(t, rt, path, plugins.Options{})
		inst, err := p.NewInstance(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		defer inst.Close(context.Background())
		tool := p.Tools()[0]
		res, err := inst.CallTool(context.Background(), &plugins.Call{Tool: tool, Arguments: json.RawMessage(`{"text":"hi"}`)})
		if err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		if len(res.Content) != 1 || res.IsError {
			t.Errorf("%s: result %+v", tool.Name, res)
		}
	}
}

func shaHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
