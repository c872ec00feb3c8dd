package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/wasmtools/wasmtools/internal/rawkernel"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// rawToolServer returns the floor of any Wasm tool host on the go-sdk
// (raw-wazero-tool in BenchmarkWarmCall and BenchmarkConcurrentSessions):
// a go-sdk server whose one tool, p's, runs p's export "call" on plain
// wazero, with none of what wasmtools adds. Each session gets its own
// instance and kernel, made on its first call; the tool's arguments go to
// the guest as the servlet interface's input, unvalidated, and its output
// is decoded as the call's result. Its guest memories are outside the Go
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
	t := &rawTool{r: newRawRuntime(ctx, b, testplugins.Bytes(b, p.path(b))), instances: map[*mcp.ServerSession]*rawInstance{}}
	t.srv = mcp.NewServer(&mcp.Implementation{Name: "raw-wazero-tool", Version: "1"}, nil)
	t.srv.AddTool(&mcp.Tool{Name: p.tool, InputSchema: json.RawMessage(`{"type":"object"}`)}, t.call)
	return t
}

// rawTool is the server of rawToolServer and its sessions' instances.
type rawTool struct {
	srv *mcp.Server
	r   *rawRuntime

	mu        sync.Mutex
	instances map[*mcp.ServerSession]*rawInstance
}

// rawInstance is one session's instance in rawToolServer.
type rawInstance struct {
	mu sync.Mutex // a session's calls take turns on its instance
	k  *rawkernel.Kernel
	m  api.Module
}

// call is the tool's handler.
func (t *rawTool) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	input, err := json.Marshal(servletInput{Params: servletParams{Name: req.Params.Name, Arguments: req.Params.Arguments}})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	inst := t.instances[req.Session]
	if inst == nil {
		inst = &rawInstance{k: rawkernel.New()}
		t.instances[req.Session] = inst
	}
	t.mu.Unlock()
	inst.mu.Lock()
	defer inst.mu.Unlock()
	ctx = context.WithValue(ctx, rawKernelKey{}, inst.k)
	if inst.m == nil {
		if inst.m, err = t.r.instantiate(experimental.WithMemoryAllocator(ctx, mmapAllocator{})); err != nil {
			return nil, fmt.Errorf("instantiate: %w", err)
		}
	}
	out, err := t.r.callOn(ctx, inst.k, inst.m, input)
	if err != nil {
		return nil, err
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("the guest's result: %w", err)
	}
	return &res, nil
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
