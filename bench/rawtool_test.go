package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/wasmtools/wasmtools/bench/internal/native"
	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/jsonobj"
	"github.com/wasmtools/wasmtools/internal/rawkernel"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// rawToolServer returns the floor of any Wasm tool host on the go-sdk
// (raw-wazero-tool in BenchmarkWarmCall and BenchmarkConcurrentSessions):
// a go-sdk server whose one tool, p's, runs p's export "call" on plain
// wazero, with none of what wasmtools adds. Each session gets its own
// instance and kernel, made on its first call; the tool's arguments go to
// the guest as the servlet interface's input, unvalidated (rawInput), and
// its output is decoded as the call's result, or, when the export returns
// non-zero, the guest's message is the tool's error (run), as wasmtools
// reports it. Its guest memories are outside the Go
// heap, as wasmtools' are (mmapAllocator). There is no deadline or
// interruption (wazero runs the guest with no termination check), no
// memory limit, no per-call bookkeeping, and the least Extism kernel
// (package rawkernel), as in the raw-wazero baseline.
//
// Against it, what separates wasmtools from native splits in two: the
// guest's own time inside a go-sdk server, which any Wasm host pays
// (raw-wazero-tool against native), and wasmtools' (wasmtools against
// raw-wazero-tool).
func rawToolServer(ctx context.Context, b *testing.B, p plugin) *rawTool {
	if q, _ := json.Marshal(p.tool); string(q) != `"`+p.tool+`"` {
		b.Fatalf("tool %q needs escapes, which rawInput does not write", p.tool)
	}
	t := &rawTool{r: newRawRuntime(ctx, b, testplugins.Bytes(b, p.path(b))), instances: map[any]*rawInstance{}}
	t.srv = mcp.NewServer(&mcp.Implementation{Name: "raw-wazero-tool", Version: "1"}, nil)
	t.srv.AddTool(&mcp.Tool{Name: p.tool, InputSchema: json.RawMessage(`{"type":"object"}`)}, t.call)
	return t
}

// rawToolHandleServer is rawToolServer's floor on the 2026-07-28 path
// with a session handle (raw-wazero-tool-2026-handle in
// BenchmarkWarmCall): served over stateless streamable HTTP, its tool
// declares schema, the input schema wasmtools lists for the tool to a
// 2026-07-28 client (the plugin's, and the session argument with its
// x-mcp-header annotation, so that the go-sdk client mirrors it into its
// header and the go-sdk server checks the two agree; both parse the
// schema's properties at every call, so a smaller schema would be a
// cheaper path, not the same one), and keys its instances by the
// argument. A call without a handle, or with one this server did
// not mint, gets a new instance and handle (a random string, neither
// signed nor expiring, as native-2026-handle's); the argument is taken out
// of the arguments the guest gets (by jsonobj.Cut, as wasmtools takes
// it), and every result returns the handle in
// _meta. Against native-2026-handle, it is the most any Wasm host on the
// go-sdk keeps on that path with this guest; wasmtools-handle against it
// is what wasmtools itself keeps of that. It runs the plugin on r, the
// runtime and compiled module of the plugin's rawToolServer, so that the
// process holds no second copy of the module's decoded form (the collector
// would run less often, and the floor look faster, for it alone).
func rawToolHandleServer(r *rawRuntime, p plugin, schema json.RawMessage) *rawTool {
	t := &rawTool{r: r, instances: map[any]*rawInstance{}}
	t.srv = mcp.NewServer(&mcp.Implementation{Name: "raw-wazero-tool", Version: "1"}, nil)
	t.srv.AddTool(&mcp.Tool{Name: p.tool, InputSchema: schema}, t.callHandle)
	return t
}

// listedSchema is the input schema h lists for tool to a 2026-07-28
// client. The client and its server are closed before it returns.
func listedSchema(ctx context.Context, b *testing.B, h *host.Host, tool string) json.RawMessage {
	srv := httptest.NewServer(h.HTTPHandler())
	defer srv.Close()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	if v := cs.InitializeResult().ProtocolVersion; v != handleProtocol {
		b.Fatalf("negotiated %s, want %s", v, handleProtocol)
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, t := range tools.Tools {
		if t.Name != tool {
			continue
		}
		schema, err := json.Marshal(t.InputSchema)
		if err != nil {
			b.Fatal(err)
		}
		if !strings.Contains(string(schema), `"x-mcp-header":"`+native.SessionHeader+`"`) {
			b.Fatalf("tool %s's listed schema has no x-mcp-header %s: %s", tool, native.SessionHeader, schema)
		}
		return schema
	}
	b.Fatalf("tool %s is not listed", tool)
	return nil
}

// rawTool is the server of rawToolServer or rawToolHandleServer and its
// sessions' instances, keyed by the go-sdk session (*mcp.ServerSession)
// or the session handle (string).
type rawTool struct {
	srv *mcp.Server
	r   *rawRuntime

	mu        sync.Mutex
	instances map[any]*rawInstance
}

// rawInstance is one session's instance in rawToolServer.
type rawInstance struct {
	mu sync.Mutex // a session's calls take turns on its instance
	k  *rawkernel.Kernel
	m  api.Module
	f  api.Function // m's export "call", kept for every call (see callOn)
	// stack is f's room for its result (callOn).
	stack [1]uint64
}

// call is rawToolServer's tool handler: the go-sdk session keys the
// instance.
func (t *rawTool) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return t.run(ctx, t.instance(req.Session, nil), req.Params.Name, req.Params.Arguments)
}

// callHandle is rawToolHandleServer's tool handler: the session argument
// keys the instance, and the result returns it.
func (t *rawTool) callHandle(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	var h string
	rest, raw, found := jsonobj.Cut(req.Params.Arguments, native.SessionArgument)
	if found {
		if err := json.Unmarshal(raw, &h); err != nil {
			return nil, fmt.Errorf("session argument: %w", err)
		}
	}
	if len(rest) == 0 {
		rest = json.RawMessage(`{}`)
	}
	inst := t.instance(h, &h)
	res, err := t.run(ctx, inst, req.Params.Name, rest)
	if err != nil {
		return nil, err
	}
	if res.Meta == nil {
		res.Meta = mcp.Meta{}
	}
	res.Meta[native.MetaSession] = h
	return res, nil
}

// instance returns key's instance, made if it has none. With minted not
// nil, key is a handle: one this server did not mint (or "") gets a new
// instance under a new handle, which *minted is set to.
func (t *rawTool) instance(key any, minted *string) *rawInstance {
	t.mu.Lock()
	defer t.mu.Unlock()
	inst := t.instances[key]
	if inst == nil {
		if minted != nil {
			*minted = rand.Text()
			key = *minted
		}
		inst = &rawInstance{k: rawkernel.New()}
		t.instances[key] = inst
	}
	return inst
}

// run calls the guest of inst with the tool call's name and arguments as
// the servlet interface's input, and decodes its output as the result.
// A call the guest failed (its export returned non-zero) is the tool's
// error, an isError result with the guest's message, as wasmtools
// reports it (host's failureResult); a trap is the handler's error.
func (t *rawTool) run(ctx context.Context, inst *rawInstance, name string, arguments json.RawMessage) (*mcp.CallToolResult, error) {
	input := rawInput(name, arguments)
	inst.mu.Lock()
	defer inst.mu.Unlock()
	ctx = context.WithValue(ctx, rawKernelKey{}, inst.k)
	if inst.m == nil {
		var err error
		if inst.m, err = t.r.instantiate(experimental.WithMemoryAllocator(ctx, mmapAllocator{})); err != nil {
			return nil, fmt.Errorf("instantiate: %w", err)
		}
		inst.f = inst.m.ExportedFunction("call")
	}
	out, err := t.r.callOn(ctx, inst.k, inst.f, inst.stack[:], input)
	if err != nil {
		var ge *rawGuestError
		if errors.As(err, &ge) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("tool %q failed: %s", name, ge.msg)}}, IsError: true}, nil
		}
		return nil, err
	}
	return rawResult(out)
}

// rawInput is the servlet interface's input for a call of tool name with
// arguments, appended in one allocation as a handler that knows its
// input's shape writes it; json.Marshal paid its reflection and
// compacted the arguments again (TestRawCallAllocates). name is one of
// the floor's own tools, which need no escape (rawToolServer checks);
// arguments are a JSON value the go-sdk's decoder read from the request,
// passed as they are (wasmtools also checks them, and falls back to
// json.Marshal for what it would write otherwise). None are omitted, as
// wasmtools omits them. TestRawInputIsTheServlets holds it to
// json.Marshal's bytes for what clients send.
func rawInput(name string, arguments json.RawMessage) []byte {
	const head, args = `{"params":{"name":"`, `","arguments":`
	b := make([]byte, 0, len(head)+len(name)+len(args)+len(arguments)+2)
	b = append(append(b, head...), name...)
	if len(arguments) > 0 {
		b = append(append(b, args...), arguments...)
	} else {
		b = append(b, '"')
	}
	return append(b, "}}"...)
}

// rawResult decodes the guest's output as a handler on plain wazero
// that knows what its guest returns would: one text block, as
// encoding/json writes it, its text needing no unescaping, is read
// without a decoder, as wasmtools reads it (plugins' textResult and
// host's plainText); anything else goes through the go-sdk's decoder,
// which knows every content type but costs 15 to 20 µs and a 32 KiB
// buffer a call, which wasmtools does not pay for a text result. Both
// benchmark plugins' results take the first way (TestRawCallAllocates).
func rawResult(out []byte) (*mcp.CallToolResult, error) {
	if text, ok := rawText(out); ok {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("the guest's result: %w", err)
	}
	return &res, nil
}

// rawText returns the text of out when out is a result of one text
// block and nothing else, written as encoding/json writes it, its text
// without escapes.
func rawText(out []byte) (string, bool) {
	const head, tail = `{"content":[{"type":"text","text":"`, `"}]}`
	text, ok := bytes.CutPrefix(out, []byte(head))
	if text, ok2 := bytes.CutSuffix(text, []byte(tail)); ok && ok2 && utf8.Valid(text) &&
		!slices.ContainsFunc(text, func(c byte) bool { return c < 0x20 || c == '"' || c == '\\' }) {
		return string(text), true
	}
	return "", false
}

// closeInstances closes every session's instance, so that the memory of
// one benchmark's instances does not stay for the next (plain wazero
// keeps a guest's memory on the Go heap).
func (t *rawTool) closeInstances(ctx context.Context) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for s, inst := range t.instances {
		if inst.m != nil {
			inst.m.Close(ctx)
		}
		delete(t.instances, s)
	}
}

// servletInput is the servlet interface's input to the export "call".
type servletInput struct {
	Params servletParams `json:"params"`
}

type servletParams struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// mmapAllocator makes raw-wazero-tool's guest memories outside the Go
// heap, in a reservation of their maximum size, as wasmtools makes its
// own. Plain wazero's default allocation puts each memory (4.5 MiB for
// the Go plugin) on the Go heap, where it would raise the collector's
// next target by that much per session: the floor would then collect
// less often than native and wasmtools, and look faster than the guest's
// own work allows.
type mmapAllocator struct{}

func (mmapAllocator) Allocate(_, max uint64) experimental.LinearMemory {
	b, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return nil
	}
	return &mmapMemory{b: b}
}

type mmapMemory struct{ b []byte }

func (m *mmapMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.b)) {
		return nil
	}
	return m.b[:size]
}

func (m *mmapMemory) Free() { syscall.Munmap(m.b) }

// TestRawCallAllocates pins what a warm call of the floor allocates in
// rawTool.run: the guest's input (rawInput's one allocation), its
// output's copy and the result made from it, and nothing of wazero's.
// Its input made by json.Marshal was one allocation and about 50 bytes
// more, and its reflection's time, which wasmtools does not pay. Looking the export up
// at each call (ExportedFunction, a new call engine whose stack the call
// allocates and grows afresh) was 64 KiB and about 11 µs of CPU a call on
// the Go plugin; the go-sdk's decoder of the result, a 32 KiB buffer and
// 15 to 20 µs; f.Call, its result's room: each charged to the floor and
// not to wasmtools, which keeps its function, reads a text result itself
// and calls with a stack of its own.
func TestRawCallAllocates(t *testing.T) {
	ctx := context.Background()
	for _, p := range benchPlugins {
		t.Run(p.name, func(t *testing.T) {
			rt := &rawTool{r: newRawRuntime(ctx, t, testplugins.Bytes(t, p.path(t))), instances: map[any]*rawInstance{}}
			defer rt.closeInstances(ctx)
			inst := rt.instance("session", nil)
			args, err := json.Marshal(p.args)
			if err != nil {
				t.Fatal(err)
			}
			call := func() {
				if _, err := rt.run(ctx, inst, p.tool, args); err != nil {
					t.Fatal(err)
				}
			}
			call() // instantiates
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			allocs := testing.AllocsPerRun(50, call)
			runtime.ReadMemStats(&after)
			perCall := (after.TotalAlloc - before.TotalAlloc) / 51 // AllocsPerRun's warm-up too
			t.Logf("%s: %.0f allocations, %d bytes a call", p.name, allocs, perCall)
			// 6 and 7 allocations, 306 and 480 bytes; with json.Marshal's
			// input, 7 and 8, 353 and 528 bytes; with the go-sdk's
			// decoder and f.Call too, 18 and 19, 34 KB (the decoder's
			// buffer: a result rawText does not take); with the export
			// looked up at each call too, 20 and 22, 46 and 68 KB.
			if want := map[string]float64{"small": 6, "go": 7}[p.name]; allocs > want {
				t.Errorf("a warm call allocates %.0f times, want at most %.0f", allocs, want)
			}
			if perCall > 1<<10 {
				t.Errorf("a warm call allocates %d bytes, want at most %d", perCall, 1<<10)
			}
		})
	}
}

// TestRawCallFails: an export that returns non-zero fails the floor's
// call, as it fails wasmtools' (sandbox.GuestError): the message the
// guest set with error_set is the tool's error, an isError result, as
// wasmtools' failureResult words it, and whatever output the kernel
// holds is not the call's result.
func TestRawCallFails(t *testing.T) {
	ctx := context.Background()
	p := benchPlugins[1] // the servlet, whose "fail" sets an error and returns 1
	rt := &rawTool{r: newRawRuntime(ctx, t, testplugins.Bytes(t, p.path(t))), instances: map[any]*rawInstance{}}
	defer rt.closeInstances(ctx)
	inst := rt.instance("session", nil)
	if _, err := rt.run(ctx, inst, p.tool, json.RawMessage(`{"text":"x"}`)); err != nil {
		t.Fatal(err) // an output the failing call must not return
	}
	res, err := rt.run(ctx, inst, "fail", json.RawMessage(`{}`))
	if err != nil {
		t.Fatalf("a failing export: %v, want an isError result", err)
	}
	want := `tool "fail" failed: failed on purpose`
	if tc, ok := res.Content[0].(*mcp.TextContent); !res.IsError || len(res.Content) != 1 || !ok || tc.Text != want {
		t.Errorf("a failing export: %+v, want the isError result %q", res, want)
	}

	// The baselines' call of the export (raw-wazero) is an error.
	m, err := rt.r.instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close(ctx)
	if out, err := rt.r.call(ctx, m, []byte(`{"params":{"name":"fail","arguments":{}}}`)); err == nil || !strings.Contains(err.Error(), "failed on purpose") {
		t.Errorf("call of a failing export: %q, %v; want its message as the error", out, err)
	}
}

// TestRawInputIsTheServlets: the floor's input to the guest is what
// json.Marshal writes for the servlet interface's input, byte for byte,
// for the arguments the go-sdk hands a handler (compact, as its
// clients send them) and for none.
func TestRawInputIsTheServlets(t *testing.T) {
	for _, args := range []string{`{}`, `{"text":"` + echoText + `"}`, `{"a":[1,{"b":null}],"c":"\u00e9 ✓"}`, ``} {
		want := []byte(`{"params":{"name":"echo"}}`) // none: omitted, as wasmtools omits them
		if args != "" {
			var err error
			if want, err = json.Marshal(servletInput{Params: servletParams{Name: "echo", Arguments: json.RawMessage(args)}}); err != nil {
				t.Fatal(err)
			}
		}
		if got := rawInput("echo", json.RawMessage(args)); !bytes.Equal(got, want) {
			t.Errorf("rawInput(%s) = %s, want %s", args, got, want)
		}
	}
}

// TestRawTextIsTheSDKs: what rawText takes, the go-sdk's decoder reads as
// the same one text block; what needs more (an escape, a second block,
// isError, another type) it leaves to the decoder.
func TestRawTextIsTheSDKs(t *testing.T) {
	for _, out := range []string{
		`{"content":[{"type":"text","text":"1"}]}`,
		`{"content":[{"type":"text","text":"` + echoText + `"}]}`,
		`{"content":[{"type":"text","text":"é ✓"}]}`,
		`{"content":[{"type":"text","text":""}]}`,
		`{"content":[{"type":"text","text":"a\"b"}]}`,
		`{"content":[{"type":"text","text":"a\nb"}]}`,
		`{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`,
		`{"content":[{"type":"text","text":"a"}],"isError":true}`,
		`{"content":[{"type":"image","data":"","mimeType":"image/png"}]}`,
	} {
		var want mcp.CallToolResult
		if err := json.Unmarshal([]byte(out), &want); err != nil {
			t.Fatalf("%s: %v", out, err)
		}
		text, ok := rawText([]byte(out))
		if !ok {
			if !strings.Contains(out, `\`) && strings.Count(out, `"type"`) == 1 && !strings.Contains(out, "isError") && strings.Contains(out, `"text"`) {
				t.Errorf("rawText does not take %s", out)
			}
			continue
		}
		if tc, isText := want.Content[0].(*mcp.TextContent); len(want.Content) != 1 || !isText || tc.Text != text || want.IsError {
			t.Errorf("rawText(%s) = %q; the go-sdk reads %+v", out, text, want)
		}
	}
}
