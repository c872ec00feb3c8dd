package host

// callStackFrame is the frame growCallStack takes: with the go-sdk's and
// the outermost middleware's frames above it and the runtime's guard of
// 928 bytes, more than a 4 KiB stack holds and less than 8 KiB, so that
// a goroutine started with 2 or 4 KiB is grown to 8 KiB, the most a
// warm call takes (TestCallStackDepth, maxCallDepth), in one copy.
const callStackFrame = 3584

// growCallStack grows the calling goroutine's stack to 8 KiB if it is
// smaller, while few frames are on it. The go-sdk runs each request on
// a goroutine of its own, started with the runtime's average stack (4
// KiB where the benchmarks run), and a warm tools/call needs about 6
// KiB: it is copied once whatever we do. In memory the go-sdk's own
// decoding of the request's _meta grows it first; over HTTP nothing
// does, and the copy came deep in the call (missingCapabilities, 25
// frames on the stack), where walking each frame to move it cost about
// 10 µs a call against some 3 µs at the outermost middleware
// (docs/DESIGN.md, "The HTTP path's own cost"). A goroutine already
// grown pays for clearing the frame (about 4 KiB) and nothing else.
//
//go:noinline
func growCallStack(i int) byte {
	var room [callStackFrame]byte
	room[i] = 1
	return room[i/2]
}
