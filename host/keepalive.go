package host

import (
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DefaultStreamKeepAlive is how often an MCP event stream that has
// nothing to say carries a comment (": keepalive"), so that the stream is
// never silent for long while its replica is alive. A proxy's read timeout
// of a few times this (deploy/nginx.conf: 15 s) then tells a hung replica
// (stopped, deadlocked, swapping: alive to TCP, writing nothing) from a
// call that is rightly long, a guest working or a person answering, and
// fails the request over (docs/DEPLOY.md, "A hung replica").
const DefaultStreamKeepAlive = 5 * time.Second

// DefaultStreamWriteTimeout bounds each write to an HTTP response, an
// event or a comment (a large one: each 64 KiB of it, streamWritePiece),
// so that a client that stops reading holds up no one else. The go-sdk
// (v1.8.0) sends a list change to its sessions one after another from one
// goroutine, and a resource update from the guest's call: a write with no
// deadline to a stream whose buffers were full blocked them all forever.
// A write past the bound ends its stream (a client resumes a session's
// stream from its Last-Event-ID and is given what it missed); an idle
// stream has no deadline.
const DefaultStreamWriteTimeout = 10 * time.Second

// streamWritePiece is how much of a Write has StreamWriteTimeout to go
// through: a large event to a slow reader (6.4 KiB/s at the defaults) is
// not cut for its size.
const streamWritePiece = 64 << 10

// keepAlive wraps next so that each response that is, or is about to be,
// an SSE stream gets a comment every interval it is otherwise silent.
//
// A response whose headers the handler has not sent when the first
// comment is due (a 2026-07-28 call's stream is committed with its first
// event, which may be its result, long after) is committed by the comment:
// status 200 and text/event-stream, what the go-sdk sends for every stream.
// What the handler does later is kept in that form: its own status is
// past, and a JSON body (the go-sdk writes a protocol error of a
// 2026-07-28 request as a bare JSON-RPC response with an HTTP status, SEP-
// 2575) is sent as the stream's message event instead, which a client
// reads the same way. Only requests that accept an event stream are
// committed early: the rest get no comment unless their handler made them
// a stream itself. every <= 0 sends no comments.
//
// Each write, the handler's or a comment, and each flush must go through
// within writeTimeout (if positive; see [DefaultStreamWriteTimeout]), or
// the response ends: its connection is closed (HTTP/1) or its stream
// reset (HTTP/2), and the handler's request context is done.
func keepAlive(every, writeTimeout time.Duration, next http.Handler) http.Handler {
	if every <= 0 && writeTimeout <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := &beatWriter{w: w, hdr: w.Header().Clone(), every: every, timeout: writeTimeout,
			early: strings.Contains(r.Header.Get("Accept"), "text/event-stream")}
		if every > 0 {
			b.mu.Lock()
			b.t = time.AfterFunc(every, b.beat)
			b.mu.Unlock()
		}
		defer b.stop()
		// A copy of r: handlers change a request's fields (the go-sdk
		// bounds its Body), which net/http reads when a beat sends the
		// headers from the timer's goroutine.
		next.ServeHTTP(b, r.WithContext(r.Context()))
	})
}

// beatWriter is the ResponseWriter keepAlive gives the handler. Writes
// from the handler (the go-sdk writes each event with one Write, from
// whichever goroutine delivers it) and the timer's comments are serialised
// by mu, so that a comment only ever falls between two writes, that is
// between two events.
type beatWriter struct {
	w       http.ResponseWriter
	every   time.Duration
	timeout time.Duration // of each write and flush; 0: none
	early   bool          // the request accepts an event stream: a beat may commit it

	// hdr is the handler's header map until it commits: the handler sets
	// it from its own goroutine(s) unsynchronised, so the timer never
	// reads it; it is copied to w's when the handler commits.
	hdr http.Header

	mu        sync.Mutex
	t         *time.Timer
	done      bool
	committed bool // w's status is sent
	ours      bool // by a beat: the handler's status and type are past
	stream    bool // the response is an event stream: beats go on
	asEvents  bool // ours, and the handler's body is JSON: sent as events
	dropBody  bool // ours, and the handler's body is neither: dropped
}

func (b *beatWriter) Header() http.Header { return b.hdr }

// Unwrap lets http.ResponseController reach w for what beatWriter does
// not do itself (deadlines); flushing it does itself, under mu.
func (b *beatWriter) Unwrap() http.ResponseWriter { return b.w }

func (b *beatWriter) WriteHeader(code int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.commitLocked(code)
}

// commitLocked is the handler committing its response with code.
func (b *beatWriter) commitLocked(code int) {
	ct := b.hdr.Get("Content-Type")
	if b.committed {
		if b.ours && !b.asEvents && !b.dropBody {
			switch {
			case strings.HasPrefix(ct, "text/event-stream"):
			case strings.HasPrefix(ct, "application/json"):
				b.asEvents = true
			default:
				b.dropBody = true
			}
		}
		return
	}
	dst := b.w.Header()
	clear(dst)
	maps.Copy(dst, b.hdr)
	b.w.WriteHeader(code)
	b.committed = true
	b.stream = code == http.StatusOK && strings.HasPrefix(ct, "text/event-stream")
}

func (b *beatWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.committed || b.ours {
		b.commitLocked(http.StatusOK)
	}
	switch {
	case b.dropBody:
		return len(p), nil
	case b.asEvents:
		// One JSON-RPC message per Write, on one line (encoding/json
		// escapes newlines in strings).
		buf := make([]byte, 0, len(p)+len("event: message\ndata: \n\n"))
		buf = append(buf, "event: message\ndata: "...)
		buf = append(buf, strings.TrimRight(string(p), "\n")...)
		buf = append(buf, "\n\n"...)
		if _, err := b.writeLocked(buf); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return b.writeLocked(p)
}

// writeLocked writes p to w, each streamWritePiece of it within the
// timeout. The deadline is cleared after, so that an idle stream is never
// cut: on HTTP/2 it is a timer that resets the stream whether or not a
// write is under way, and on HTTP/1 net/http sends what is buffered when
// the handler returns under whatever deadline is left.
func (b *beatWriter) writeLocked(p []byte) (int, error) {
	if b.timeout <= 0 {
		return b.w.Write(p)
	}
	rc := http.NewResponseController(b.w)
	defer rc.SetWriteDeadline(time.Time{})
	n := 0
	for {
		piece := p[n:min(len(p), n+streamWritePiece)]
		// Not supported by w: written without one, as before.
		_ = rc.SetWriteDeadline(time.Now().Add(b.timeout))
		m, err := b.w.Write(piece)
		n += m
		if err != nil || n == len(p) {
			return n, err
		}
	}
}

// FlushError flushes w; http.ResponseController.Flush calls it.
func (b *beatWriter) FlushError() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.flushLocked()
}

func (b *beatWriter) Flush() { _ = b.FlushError() }

func (b *beatWriter) flushLocked() error {
	if !b.committed {
		return nil
	}
	rc := http.NewResponseController(b.w)
	if b.timeout > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(b.timeout))
		defer rc.SetWriteDeadline(time.Time{})
	}
	return rc.Flush()
}

// beat runs on the timer: a comment on a stream, committing it first if
// the handler has not and the client accepts one.
func (b *beatWriter) beat() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return
	}
	if !b.committed {
		if !b.early {
			return
		}
		h := b.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache, no-transform")
		b.w.WriteHeader(http.StatusOK)
		b.committed, b.ours, b.stream = true, true, true
	}
	if !b.stream || b.dropBody {
		return
	}
	if _, err := b.writeLocked([]byte(": keepalive\n\n")); err != nil {
		return
	}
	if b.flushLocked() != nil {
		return
	}
	b.t.Reset(b.every)
}

// stop ends the beats: the handler has returned, and w is no longer ours
// to write.
func (b *beatWriter) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.done = true
	if b.t != nil {
		b.t.Stop()
	}
}
