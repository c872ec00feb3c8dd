package host_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"unsafe"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// callStackBudget is the stack a call's goroutine may use, all of it:
// a request's goroutine is grown to 8 KiB before the call (by the
// go-sdk's JSON decoding, or the outermost middleware's growCallStack),
// and a call that needs more is copied to 16 KiB every time
// (docs/DESIGN.md, "The HTTP path's own cost").
const callStackBudget = 8 << 10

// goSDKFrames is what the go-sdk's frames above the outermost receiving
// middleware take of a call's goroutine (about 450 bytes measured, with
// a margin): the probe's goroutine keeps it unused.
const goSDKFrames = 640

// TestCallStackNotCopied: a warm tools/call over HTTP (a 2025-11-25
// session, so that the session book's and the lease's booked paths are
// taken), and a call that waits in the lease for its session's slot
// (acquireSlot's slow path) while another call holds it, run in
// callStackBudget less goSDKFrames of stack without a copy of their
// goroutine's stack, anywhere below the outermost middleware: where
// TestCallStackDepth measures the depth at one point (the guest's kernel
// call), this sees every frame's peak, the lease's and the HTTP path's
// middlewares' included. The probe runs each call on a goroutine of its
// own whose stack it grew to 8 KiB, and compares a local's address
// before and after: a copy moves it.
func TestCallStackNotCopied(t *testing.T) {
	skipUnlessFramesMeasured(t)
	// No collection meanwhile: it may shrink a stack, which moves it too,
	// and changes the starting size of a goroutine's stack.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	if s := startingStack(); s > callStackBudget {
		t.Skipf("goroutines start with %d bytes of stack: a call would not grow past the budget", s)
	}
	ctx := context.Background()
	logs := &heldLog{entered: make(chan struct{}, 1)}
	h := logcallHost(t, logs)
	probe := &copyProbe{}
	h.Server().AddReceivingMiddleware(probe.middleware) // the outermost
	mux := http.NewServeMux()
	mux.Handle("/mcp", h.HTTPHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx,
		&mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	call := func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "log", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Errorf("call: %v %v", err, res)
		}
	}
	call() // makes the instance
	probe.reset()
	call()
	if n, moved := probe.result(); n != 1 || moved != 0 {
		t.Errorf("a warm call over HTTP: %d of %d calls had their stack copied past %d bytes; want none", moved, n, callStackBudget)
	}

	// One call held in its guest's log, a second waiting for the slot.
	probe.reset()
	logs.hold()
	var wg sync.WaitGroup
	wg.Go(call)
	<-logs.entered
	wg.Go(call)
	probe.waitCalls(2)
	logs.release()
	wg.Wait()
	// The holder's own copy is the test's: its log's handler blocks,
	// runtime frames a real handler's level check does not take.
	if n, moved := probe.result(); n != 2 || probe.movedAt[1] {
		t.Errorf("a call waiting for its session's slot: its stack copied past %d bytes (%d of %d calls copied, the one holding the slot included)", callStackBudget, moved, n)
	}
}

// copyProbe is a receiving middleware that runs each tools/call in
// callStackBudget less goSDKFrames of a goroutine's stack and counts the
// calls whose stack was copied meanwhile.
type copyProbe struct {
	mu           sync.Mutex
	cond         *sync.Cond
	calls, moved int
	started      int
	movedAt      map[int]bool // by the order the calls started in
}

func (p *copyProbe) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls, p.moved, p.started, p.movedAt = 0, 0, 0, map[int]bool{}
}

func (p *copyProbe) result() (calls, moved int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, p.moved
}

// waitCalls waits until n calls have entered the middleware.
func (p *copyProbe) waitCalls(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.started < n {
		p.waitLocked()
	}
}

func (p *copyProbe) waitLocked() {
	if p.cond == nil {
		p.cond = sync.NewCond(&p.mu)
	}
	p.cond.Wait()
}

func (p *copyProbe) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "tools/call" {
			return next(ctx, method, req)
		}
		p.mu.Lock()
		nth := p.started
		p.started++
		if p.cond != nil {
			p.cond.Broadcast()
		}
		p.mu.Unlock()
		var (
			res   mcp.Result
			err   error
			moved bool
			done  = make(chan struct{})
		)
		go func() {
			defer close(done)
			growTo8K(0)
			moved = runPadded(func() { res, err = next(ctx, method, req) })
		}()
		<-done
		p.mu.Lock()
		p.calls++
		if moved {
			p.moved++
			if p.movedAt == nil {
				p.movedAt = map[int]bool{}
			}
			p.movedAt[nth] = true
		}
		p.mu.Unlock()
		return res, err
	}
}

// growTo8K takes a goroutine that starts with a smaller stack to 8 KiB
// (the runtime doubles it until the frame fits).
//
//go:noinline
func growTo8K(i int) byte {
	var b [5 << 10]byte
	b[i] = 1
	return b[i/2]
}

// runPadded runs f below goSDKFrames of its own frame and reports
// whether the stack was copied meanwhile: a local's address moved.
//
//go:noinline
func runPadded(f func()) (moved bool) {
	var pad [goSDKFrames]byte
	var here byte
	before := uintptr(unsafe.Pointer(&here))
	f()
	pad[here] = 1
	return uintptr(unsafe.Pointer(&here)) != before || pad[0] == 2
}

// heldLog is a slog handler that can hold the guest's log call (the
// call then holds its session's slot), and logs nothing.
type heldLog struct {
	mu      sync.Mutex
	gate    chan struct{} // non-nil: a log waits for it
	entered chan struct{}
}

func (l *heldLog) hold() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gate = make(chan struct{})
}

func (l *heldLog) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	close(l.gate)
	l.gate = nil
}

// Enabled holds the log if asked to, and says no: the guest's log is
// then only slog's check of its level, as a host that logs only warnings
// makes of a plugin's info (slog's record and handler take about 1 KiB
// more, which TestCallStackDepth leaves out too).
func (l *heldLog) Enabled(context.Context, slog.Level) bool {
	l.mu.Lock()
	gate := l.gate
	l.mu.Unlock()
	if gate != nil {
		select {
		case l.entered <- struct{}{}:
		default:
		}
		<-gate
	}
	return false
}

func (l *heldLog) Handle(context.Context, slog.Record) error { return nil }

func (l *heldLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *heldLog) WithGroup(string) slog.Handler      { return l }

// startingStack is the size a new goroutine's stack starts at.
func startingStack() uint64 {
	s := []metrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
