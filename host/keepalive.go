package host

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
// stream has no deadline. The long-lived streams' writes are queued
// besides (see [beatWriter]): with the deadline alone, each stuck stream
// still held every later one up to the bound.
const DefaultStreamWriteTimeout = 10 * time.Second

// streamWritePiece is how much of a Write has StreamWriteTimeout to go
// through: a large event to a slow reader (6.4 KiB/s at the defaults) is
// not cut for its size.
const streamWritePiece = 64 << 10

// StreamQueueBytes bounds the bytes queued for the long-lived streams
// (a 2025-11-25 session's GET streams, a 2026-07-28 client's
// subscriptions/listen) and not yet written to their clients, in all;
// with tenants each tenant holds at most a quarter. It is at least the
// events a resumption replays at once (StreamReplayBytes, or with
// tenants a tenant's quarter of them), which go through the same queue.
const StreamQueueBytes = 32 << 20

// queuedOverhead is what one queued write is counted at besides its
// bytes.
const queuedOverhead = 64

// errStreamQueueFull ends a long-lived stream whose client reads too
// slowly: its queue would pass its tenant's share of StreamQueueBytes.
var errStreamQueueFull = errors.New("stream ended: its client reads too slowly (the bytes queued for it passed its share)")

// streamQueues bounds what the long-lived streams' queues hold (see
// [beatWriter]), in all and for each tenant. It is safe for concurrent
// use.
type streamQueues struct {
	total, share int // share 0: none (no tenants)
	// tenant names the tenant a request's stream counts against.
	tenant func(*http.Request) string
	held   byteShares
}

// newStreamQueues bounds the queues to total bytes, never less than
// replay (the replay store's bound: what one resumption writes at once
// at most), each tenant to a quarter if tenants. A tenant's resumption
// replays at most its quarter of replay, which a quarter of the total
// holds: a share of the whole replay bound, as until stop 74, let one
// tenant hold every byte of the total once replay passed a quarter of
// it, and each other tenant's next write then ended its stream
// (TestStreamQueueShareWithLargeReplay).
func newStreamQueues(total, replay int, tenants bool, tenant func(*http.Request) string) *streamQueues {
	q := &streamQueues{total: max(total, replay), tenant: tenant}
	if tenants {
		q.share = q.total / 4
	}
	return q
}

func (q *streamQueues) take(tenant string, n int) bool {
	q.held.mu.Lock()
	defer q.held.mu.Unlock()
	return q.held.tryLocked(tenant, n, q.total, q.share)
}

// longLived reports whether r opens a stream that stays open until its
// client leaves, and is written to by whoever has something to tell it:
// a 2025-11-25 session's GET (its standing stream, or one it resumes)
// and a 2026-07-28 subscriptions/listen. A call's POST stream is not: it
// is written by its own call alone, and its writes stay synchronous (the
// per-call path).
func longLived(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet:
		return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
	case http.MethodPost:
		return listenRequest(r)
	}
	return false
}

// listenRequest reports whether r is a 2026-07-28 client's
// subscriptions/listen: by its Mcp-Method header, which the go-sdk holds
// to the body's method from that revision on, and only there. A
// 2025-11-25 session's POST naming it was taken for one: out of the
// drain's count and into a stream's queue (the client's own session's
// loss alone, but not what its header is for).
func listenRequest(r *http.Request) bool {
	return r.Method == http.MethodPost && r.Header.Get("Mcp-Method") == "subscriptions/listen" &&
		r.Header.Get("Mcp-Session-Id") == "" && r.Header.Get("Mcp-Protocol-Version") >= sessionlessProtocol
}

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
//
// With q, a long-lived stream's writes are queued (see [beatWriter]):
// a writer does not wait for its client to read.
func keepAlive(every, writeTimeout time.Duration, q *streamQueues, next http.Handler) http.Handler {
	if every <= 0 && writeTimeout <= 0 && q == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := &beatWriter{w: w, hdr: w.Header().Clone(), every: every, timeout: writeTimeout,
			early: strings.Contains(r.Header.Get("Accept"), "text/event-stream")}
		ctx := r.Context()
		if q != nil && longLived(r) {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(ctx)
			defer cancel(nil)
			b.q, b.tenant, b.cancel = q, q.tenant(r), cancel
			b.wake = sync.NewCond(&b.mu)
			b.ended = make(chan struct{})
			go b.run()
		}
		if every > 0 {
			b.mu.Lock()
			b.t = startBeats(b)
			b.mu.Unlock()
		}
		defer b.stop()
		// A copy of r: handlers change a request's fields (the go-sdk
		// bounds its Body), which net/http reads when a beat sends the
		// headers from the timer's goroutine.
		next.ServeHTTP(b, r.WithContext(ctx))
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
	t         *beatTimer
	done      bool
	committed bool // w's status is sent
	ours      bool // by a beat: the handler's status and type are past
	stream    bool // the response is an event stream: beats go on
	asEvents  bool // ours, and the handler's body is JSON: sent as events
	dropBody  bool // ours, and the handler's body is neither: dropped

	// A long-lived stream's (q != nil) header, writes and flushes are
	// queued, under mu, and done in order by one goroutine of its own
	// (run), each under the timeout: whoever writes (the go-sdk sends a
	// list change to every session from one goroutine, a resource update
	// from a guest's call) never waits for the client to read. A write
	// that would take the queue past its tenant's share of q ends the
	// stream at once; so does a write that does not go through. Either
	// way the request's context is cancelled, and every later write
	// fails: a 2025-11-25 client resumes from its Last-Event-ID, the
	// event store having kept what it missed.
	q       *streamQueues
	tenant  string
	cancel  context.CancelCauseFunc
	wake    *sync.Cond // on mu: ops queued, or the stream ends
	ops     []streamOp
	err     error         // the stream ended: later writes fail with it
	closing bool          // the handler returned: run drains ops, then returns
	ended   chan struct{} // closed when run returns

	// dmu orders run's write deadlines with an end's (abort): an ended
	// stream's deadline stays in the past. It is never held with mu
	// taken after it.
	dmu     sync.Mutex
	aborted bool
	drainBy time.Time // the handler returned: no write deadline past it
}

// streamOp is one queued step of a long-lived stream.
type streamOp struct {
	code  int         // > 0: send the header hdr with status code
	hdr   http.Header //
	data  []byte      // write data
	flush bool        // flush
	cost  int         // counted in the stream's streamQueues
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
	b.sendHeaderLocked(code, b.hdr)
	b.committed = true
	b.stream = code == http.StatusOK && strings.HasPrefix(ct, "text/event-stream")
}

// sendHeaderLocked sends hdr and code as w's, or queues them.
func (b *beatWriter) sendHeaderLocked(code int, hdr http.Header) {
	if b.q != nil {
		b.queueLocked(streamOp{code: code, hdr: hdr.Clone()})
		return
	}
	sendHeader(b.w, code, hdr)
}

func sendHeader(w http.ResponseWriter, code int, hdr http.Header) {
	dst := w.Header()
	clear(dst)
	maps.Copy(dst, hdr)
	w.WriteHeader(code)
}

func (b *beatWriter) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return 0, b.err
	}
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

// writeLocked writes p to w (writeTimed), or queues a copy of it.
func (b *beatWriter) writeLocked(p []byte) (int, error) {
	if b.q == nil {
		return b.writeTimed(p)
	}
	if err := b.queueLocked(streamOp{data: append([]byte(nil), p...)}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeTimed writes p to w, each streamWritePiece of it within the
// timeout. The deadline is cleared after, so that an idle stream is never
// cut: on HTTP/2 it is a timer that resets the stream whether or not a
// write is under way, and on HTTP/1 net/http sends what is buffered when
// the handler returns under whatever deadline is left.
func (b *beatWriter) writeTimed(p []byte) (int, error) {
	if b.timeout <= 0 && b.q == nil {
		return b.w.Write(p)
	}
	rc := http.NewResponseController(b.w)
	defer b.clearDeadline(rc)
	n := 0
	for {
		piece := p[n:min(len(p), n+streamWritePiece)]
		b.setDeadline(rc)
		m, err := b.w.Write(piece)
		n += m
		if err != nil || n == len(p) {
			return n, err
		}
	}
}

// setDeadline gives the write or flush about to be done the timeout, or
// what is left of a long-lived stream's drain, or a past deadline once
// that stream has ended; none with no timeout before a drain. Not
// supported by w: written without one.
func (b *beatWriter) setDeadline(rc *http.ResponseController) {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	var d time.Time
	if b.timeout > 0 {
		d = time.Now().Add(b.timeout)
	}
	switch {
	case b.aborted:
		d = time.Unix(1, 0)
	case !b.drainBy.IsZero() && (d.IsZero() || b.drainBy.Before(d)):
		d = b.drainBy
	case d.IsZero():
		return
	}
	_ = rc.SetWriteDeadline(d)
}

// clearDeadline clears the deadline, unless the stream has ended.
func (b *beatWriter) clearDeadline(rc *http.ResponseController) {
	b.dmu.Lock()
	defer b.dmu.Unlock()
	if !b.aborted {
		_ = rc.SetWriteDeadline(time.Time{})
	}
}

// FlushError flushes w; http.ResponseController.Flush calls it.
func (b *beatWriter) FlushError() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return b.err
	}
	return b.flushLocked()
}

func (b *beatWriter) Flush() { _ = b.FlushError() }

func (b *beatWriter) flushLocked() error {
	if !b.committed {
		return nil
	}
	if b.q != nil {
		if n := len(b.ops); n > 0 && b.ops[n-1].flush {
			return nil
		}
		return b.queueLocked(streamOp{flush: true})
	}
	return b.flushTimed()
}

func (b *beatWriter) flushTimed() error {
	rc := http.NewResponseController(b.w)
	if b.timeout > 0 || b.q != nil {
		b.setDeadline(rc)
		defer b.clearDeadline(rc)
	}
	return rc.Flush()
}

// beat runs on the timer: a comment on a stream, committing it first if
// the handler has not and the client accepts one.
func (b *beatWriter) beat() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || b.err != nil {
		return
	}
	if !b.committed {
		if !b.early {
			return
		}
		// w's own, which only this commit or run's, never both, touch.
		h := b.w.Header().Clone()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache, no-transform")
		b.sendHeaderLocked(http.StatusOK, h)
		b.committed, b.ours, b.stream = true, true, true
	}
	if !b.stream || b.dropBody {
		return
	}
	if len(b.ops) > 0 {
		// The stream is not silent: what it was given is still being
		// written.
		b.t.Reset(b.every)
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

// beatTimer is a beatWriter's timer, kept in beatTimers for the next
// request once its own stops before it fires (most calls end well before
// their first comment): a timer and its func are not made per POST.
type beatTimer struct {
	t *time.Timer
	b atomic.Pointer[beatWriter] // whose beats it times
}

var beatTimers sync.Pool // of *beatTimer, stopped

// startBeats gives b its first beat in b.every. b.mu is held.
func startBeats(b *beatWriter) *beatTimer {
	if bt, ok := beatTimers.Get().(*beatTimer); ok {
		bt.b.Store(b)
		bt.t.Reset(b.every)
		return bt
	}
	bt := &beatTimer{}
	bt.b.Store(b)
	bt.t = time.AfterFunc(b.every, bt.fire)
	return bt
}

func (bt *beatTimer) fire() { bt.b.Load().beat() }

// Reset times b's next beat. b.mu is held.
func (bt *beatTimer) Reset(d time.Duration) { bt.t.Reset(d) }

// release stops bt for good, and keeps it for another request if its
// func will not run: a beat under way (it fired) may still use its
// writer, which then stays bt's. b.mu is held, so that a beat that fired
// before has done its Reset, if any, and is past its use of b.
func (bt *beatTimer) release() {
	if bt.t.Stop() {
		bt.b.Store(nil)
		beatTimers.Put(bt)
	}
}

// stop ends the beats: the handler has returned, and w is no longer ours
// to write.
//
// A long-lived stream's queue is written out first, within the timeout
// in all from now: w goes when the handler's return does. With no
// timeout, within DefaultStreamWriteTimeout all the same: nothing more
// comes on the stream, and a client that stopped reading would hold
// the handler, run and the queue's bytes, which count against every
// client's StreamQueueBytes, for as long as it holds the connection
// (TestLongLivedStreamNoWriteTimeoutEnds).
func (b *beatWriter) stop() {
	b.mu.Lock()
	b.done = true
	if b.t != nil {
		b.t.release()
	}
	if b.q == nil {
		b.mu.Unlock()
		return
	}
	b.closing = true
	b.wake.Broadcast()
	b.mu.Unlock()
	drain := b.timeout
	if drain <= 0 {
		drain = DefaultStreamWriteTimeout
	}
	b.dmu.Lock()
	b.drainBy = time.Now().Add(drain)
	if b.timeout <= 0 && !b.aborted {
		// run's write under way, if any, has no deadline of its own.
		_ = http.NewResponseController(b.w).SetWriteDeadline(b.drainBy)
	}
	b.dmu.Unlock()
	<-b.ended
}

// queueLocked queues op for run, counting its bytes against the stream's
// tenant's share, or ends the stream if they would pass it. b.mu is held.
func (b *beatWriter) queueLocked(op streamOp) error {
	if b.err != nil {
		return b.err
	}
	op.cost = len(op.data) + queuedOverhead
	if !b.q.take(b.tenant, op.cost) {
		b.endLocked(errStreamQueueFull)
		return b.err
	}
	b.ops = append(b.ops, op)
	b.wake.Signal()
	return nil
}

// endLocked ends a long-lived stream with err: what is queued is
// dropped, the write under way fails now, and the handler's request
// context is cancelled. b.mu is held.
func (b *beatWriter) endLocked(err error) {
	if b.err != nil {
		return
	}
	b.err = err
	for _, op := range b.ops {
		b.q.held.give(b.tenant, op.cost)
	}
	b.ops = nil
	b.cancel(err)
	b.wake.Broadcast()
	b.dmu.Lock()
	b.aborted = true
	b.dmu.Unlock()
	// A deadline in the past fails the write under way (run's), and what
	// net/http would send of the response once the handler returns. From
	// this goroutine: run may be blocked in that write.
	_ = http.NewResponseController(b.w).SetWriteDeadline(time.Unix(1, 0))
}

// run does a long-lived stream's queued ops in order until the stream
// ends, or the handler has returned and they are done.
func (b *beatWriter) run() {
	defer close(b.ended)
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		for len(b.ops) == 0 && !b.closing && b.err == nil {
			b.wake.Wait()
		}
		if b.err != nil || len(b.ops) == 0 {
			return
		}
		op := b.ops[0]
		b.ops[0] = streamOp{}
		b.ops = b.ops[1:]
		b.mu.Unlock()
		var err error
		switch {
		case op.code > 0:
			sendHeader(b.w, op.code, op.hdr)
		case op.flush:
			err = b.flushTimed()
		default:
			_, err = b.writeTimed(op.data)
		}
		b.mu.Lock()
		b.q.held.give(b.tenant, op.cost)
		if err != nil {
			b.endLocked(err)
		}
	}
}
