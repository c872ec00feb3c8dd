package host_test

import (
	"context"
	"log/slog"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// maxCallDepth is the most stack the host's frames may take during a
// warm tools/call, from its outermost middleware down to a guest's call
// of the Extism kernel, the deepest point of a call that does not
// checkpoint. The go-sdk starts a request's goroutine with a small stack,
// which its own JSON decoding (in memory) or the outermost middleware
// (growCallStack) grows to 8 KiB; a call that needs more is copied to a
// 16 KiB stack every time, some 10 µs a call
// (docs/DESIGN.md, "The Go guest inside the server"). Of those 8 KiB the
// runtime keeps 928 bytes as a guard, the go-sdk's frames above the
// middlewares take about 450 and a kernel function's own calls about
// 150: 6,600 are the host's. Measured 6,120 (Go 1.26, amd64) once the
// frames on the way were made small, against 8,856 before.
const maxCallDepth = 6600

// TestCallStackDepth measures how much stack the host's frames take
// during a warm call, from the outermost middleware to a guest's kernel
// call (log_info, less what slog's Log takes), and fails when it passes
// maxCallDepth: a frame on the way has grown. The fix is to move what
// only some calls do into a function of its own, as callTool's helpers
// do.
func TestCallStackDepth(t *testing.T) {
	skipUnlessFramesMeasured(t)
	ctx := context.Background()
	p := &depthProbe{}
	h := logcallHost(t, p)
	h.Server().AddReceivingMiddleware(p.middleware) // the outermost
	cs := host.ConnectInMemory(t, h)
	for range 2 { // the first makes the instance
		p.reset()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "log", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("call: %v %v", err, res)
		}
	}
	d := p.depth()
	if d == 0 {
		t.Fatal("the probe saw no guest log below the middleware on the request's goroutine")
	}
	logging := p.logDepth()
	t.Logf("%d bytes of stack from the outermost middleware to the guest's log, %d of them slog's", d, logging)
	d -= logging
	if d > maxCallDepth {
		t.Errorf("a warm call takes %d bytes of stack from the outermost middleware to a guest's kernel call, over the %d-byte budget (see maxCallDepth)", d, maxCallDepth)
	}
}

// skipUnlessFramesMeasured skips a test of stack frames' sizes where
// they are not what the budgets were measured on.
func skipUnlessFramesMeasured(t *testing.T) {
	t.Helper()
	if host.RaceEnabled {
		t.Skip("the race detector's instrumentation changes the frames")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the budget is measured on amd64; other architectures' frames differ")
	}
}

// logcallHost is a host serving the logcall test plugin ("log"), whose
// guest logs to handler.
func logcallHost(t *testing.T, handler slog.Handler) *host.Host {
	t.Helper()
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	dir := testplugins.Folder(t, map[string]string{"logcall.wasm": testplugins.Test(t, "logcall")})
	cat, errs := plugins.LoadAll(ctx, rt, []string{dir}, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithLogger(slog.New(handler)) // the guest's log_info
		return plugins.Options{Policy: &pol}
	})
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	h := host.New(plugins.NewStatic(cat), nil)
	t.Cleanup(func() { h.Close(ctx) })
	return h
}

// depthProbe is a receiving middleware and a slog handler: the
// middleware notes where a tools/call's stack starts, and the handler,
// which the host calls with a plugin's log message from inside the
// guest's call, how deep it has gone.
type depthProbe struct {
	mu        sync.Mutex
	top, deep uintptr
}

func (p *depthProbe) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		// Grown once, here, so that nothing below copies the stack
		// and moves the addresses compared.
		growStack(0)
		var here byte
		p.mu.Lock()
		p.top = uintptr(unsafe.Pointer(&here))
		p.mu.Unlock()
		return next(ctx, method, req)
	}
}

func (p *depthProbe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.top, p.deep = 0, 0
}

// depth is how far below the middleware's frame the log's handler ran.
func (p *depthProbe) depth() uintptr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.top == 0 || p.deep == 0 || p.deep > p.top {
		return 0
	}
	return p.top - p.deep
}

// logDepth is how deep slog's Log goes to its handler, measured the same
// way outside any call.
func (p *depthProbe) logDepth() uintptr {
	growStack(0)
	var here byte
	p.mu.Lock()
	p.top = uintptr(unsafe.Pointer(&here))
	p.mu.Unlock()
	slog.New(p).Log(context.Background(), slog.LevelInfo, "guest log", "message", "deep")
	return p.depth()
}

func (p *depthProbe) Enabled(context.Context, slog.Level) bool { return true }

func (p *depthProbe) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "guest log" {
		return nil
	}
	var here byte
	p.mu.Lock()
	p.deep = uintptr(unsafe.Pointer(&here))
	p.mu.Unlock()
	return nil
}

func (p *depthProbe) WithAttrs([]slog.Attr) slog.Handler { return p }
func (p *depthProbe) WithGroup(string) slog.Handler      { return p }

// growStack needs 32 KiB of stack, so that its caller's goroutine has
// room for a call below it without growing again.
//
//go:noinline
func growStack(i int) byte {
	var b [32 << 10]byte
	b[i] = 1
	return b[i/2]
}
