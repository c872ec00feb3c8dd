//go:build !race

package host

import (
	"context"
	"runtime"
	"runtime/debug"
	rmetrics "runtime/metrics"
	"testing"
	"unsafe"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCallStackGrownAtTheTop: the outermost middleware grows a
// tools/call's goroutine, started with a small stack, to room for the
// whole call (6 KiB below it, TestCallStackDepth's measure) at once,
// so that the one copy of its stack comes with few frames on it rather
// than deep in the call, where moving each frame costs (growCallStack).
// Any other method's goroutine is left as it starts: the same probe
// then sees its stack copied, which shows that it would see the copy.
func TestCallStackGrownAtTheTop(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the frames are measured on amd64")
	}
	// No collection meanwhile: it may shrink a stack, which moves it,
	// and changes the starting size of a goroutine's stack.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	s := []rmetrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	rmetrics.Read(s)
	if n := s[0].Value.Uint64(); n > 4<<10 {
		t.Skipf("goroutines start with %d bytes of stack: nothing to grow", n)
	}
	h := &Host{}
	moved := func(method string) bool {
		var moved bool
		mw := h.traceMiddleware(func(context.Context, string, mcp.Request) (mcp.Result, error) {
			moved = deepCallMoves(0)
			return nil, nil
		})
		done := make(chan struct{})
		go func() {
			defer close(done)
			mw(context.Background(), method, &mcp.CallToolRequest{})
		}()
		<-done
		return moved
	}
	if moved("tools/call") {
		t.Error("a tools/call's stack was copied below the outermost middleware: growCallStack did not make room for the call")
	}
	if !moved("tools/list") {
		t.Error("the probe saw no copy of a tools/list's stack, which starts small: it cannot see one")
	}
}

// deepCallMoves takes 6 KiB of stack below its frame, about what a warm
// call's frames take below the outermost middleware, and reports whether
// its goroutine's stack was copied meanwhile: a local's address moved.
//
//go:noinline
func deepCallMoves(i int) bool {
	var here byte
	before := uintptr(unsafe.Pointer(&here))
	takeStack(i)
	return uintptr(unsafe.Pointer(&here)) != before
}

//go:noinline
func takeStack(i int) byte {
	var b [6 << 10]byte
	b[i] = 1
	return b[i/2]
}
