package host

// Replicas: routable IDs, taking stateful HTTP sessions over from the
// state store, readiness and drain. See docs/DESIGN.md, "Durable sessions
// across replicas", and docs/DEPLOY.md.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// ValidReplica reports whether name can be a replica's name: 1 to 32
// letters, digits, '-' or '_' (it begins IDs that proxies match on, and
// IDs split on '.').
func ValidReplica(name string) bool { return replicaName.MatchString(name) }

var replicaName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// replicaPrefix is what this replica's IDs begin with: its name and a
// dot, or "" for one process.
func (h *Host) replicaPrefix() string {
	if h.opts.Replica == "" {
		return ""
	}
	return h.opts.Replica + "."
}

// process names this process: its replica and a boot tag, new at each
// start.
func (h *Host) process() string {
	return cmpOr(h.opts.Replica, "-") + "/" + h.boot
}

// newSessionID is the go-sdk's GetSessionID: the replica's prefix and 128
// random bits, or, while a session is taken over, that session's ID.
func (h *Host) newSessionID() string {
	if h.adoptID != "" { // only while adoptMu is held for writing
		return h.adoptID
	}
	return h.replicaPrefix() + rand.Text()
}

// keepNewSession claims each new stateful session in the store, with its
// MCP state, before its initialize is answered (a receiving middleware),
// so that another replica can take it over: a session whose ID a client
// holds is in the store, even if its replica dies before the client's
// next request (notifications/initialized, which it once waited for).
// The session is its authenticated user's, as the go-sdk binds it.
//
// The claim is in a function of its own (keepInitialized), so that this
// middleware's frame, under every call's, stays small (see
// traceMiddleware).
func (h *Host) keepNewSession(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if method == "initialize" && err == nil && h.dur != nil {
			h.keepInitialized(ctx, req)
		}
		return res, err
	}
}

// keepInitialized is keepNewSession's claim of the session of req, an
// initialize just answered.
func (h *Host) keepInitialized(ctx context.Context, req mcp.Request) {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss.ID() == "" || ss.ID() == h.adoptID {
		// No session, or one being taken over (adopt's replay, under
		// adoptMu): its record holds these parameters and this user
		// already, and the request served after the replay claims it,
		// outside the lock that every new session waits on.
		return
	}
	user := ""
	if ex := req.GetExtra(); ex != nil && ex.TokenInfo != nil {
		user = ex.TokenInfo.UserID
	}
	h.storeBytes.attribute(durable.StoreID(h.connKey(ss)), h.tenantOf(user))
	if _, err := h.dur.Ensure(ctx, h.connKey(ss), newSession(ss, h.subjectTag(user))); err != nil {
		// Answered all the same, as before the store: the session
		// lives here, and its first call claims it again.
		h.log.Error("state store: new session not kept", "session", sessionLabel(ss.ID()), "error", err)
	}
}

// drainState is where a drain is.
type drainState struct {
	draining atomic.Bool // readiness fails, new sessions are refused
	closing  atomic.Bool // every request is refused: the replica is about to exit (set under mu)
	mu       sync.Mutex
	streams  map[*context.CancelFunc]struct{} // open streams: sessions' GETs, 2026-07-28 listens (trackStream)
	// gets holds the GET serving each session's stream, or the POST
	// holding its call's stream (by session ID and stream ID), which a
	// newer GET of it ends (supersede, holdStreams).
	gets map[string]*standingGet
	// posts counts the POSTs being served (enter), and answered gets a
	// token when it falls to zero: a drain waits for them to write their
	// answers before it closes the sessions (waitPosts). Under mu.
	posts    int
	answered chan struct{}
	once     sync.Once
	done     chan struct{}
}

// enter counts a POST in, unless the host is closing (false). The caller
// calls leave once the POST is answered (a method, not a closure
// returned: one allocation less per POST).
func (d *drainState) enter() (ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing.Load() {
		return false
	}
	d.posts++
	return true
}

// leave counts out a POST that enter counted in.
func (d *drainState) leave() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.posts--; d.posts == 0 && d.answered != nil {
		select {
		case d.answered <- struct{}{}:
		default:
		}
	}
}

// close refuses every request from now on.
func (d *drainState) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closing.Store(true)
	if d.answered == nil {
		d.answered = make(chan struct{}, 1)
	}
}

// waitPosts waits until no POST is being served, or ctx ends. A call's
// answer is written after its handler returns, by the go-sdk on the
// POST's stream: a drain that closed the sessions as soon as the calls
// ended could close a stream before its answer was on it, and the client,
// resuming the stream, met the closing replica's 503 and failed a call
// whose effect was saved.
func (d *drainState) waitPosts(ctx context.Context) error {
	for {
		d.mu.Lock()
		n, answered := d.posts, d.answered
		d.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-answered:
		case <-ctx.Done():
			return fmt.Errorf("%d requests unanswered: %w", n, ctx.Err())
		}
	}
}

// Ready reports whether the host takes new sessions: not before the
// plugins' first load ([Options.Loaded]), nor once it drains.
func (h *Host) Ready() bool {
	if h.drain.draining.Load() || h.keyMismatch() != "" {
		return false
	}
	if h.opts.Loaded != nil {
		select {
		case <-h.opts.Loaded:
		default:
			return false
		}
	}
	return true
}

// ReadyHandler serves /readyz: 200 "ready" (and the replica's name), or 503 while the plugins'
// first load runs and once the host drains, so that a proxy or Kubernetes
// sends it work only when it can take it.
func (h *Host) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !h.Ready() {
			w.WriteHeader(http.StatusServiceUnavailable)
			if why := h.keyMismatch(); why != "" {
				io.WriteString(w, "state key mismatch: "+why+"\n")
			} else if h.drain.draining.Load() {
				io.WriteString(w, "draining\n")
			} else {
				io.WriteString(w, "loading\n")
			}
			return
		}
		// With the replica's name, so a probe through a proxy can tell
		// which replica answered.
		io.WriteString(w, strings.TrimSpace("ready "+h.opts.Replica)+"\n")
	})
}

// keyMismatch says why the state store's values do not open with this
// replica's state key, or "" (no store, or they do, or not known yet).
func (h *Host) keyMismatch() string {
	if h.dur == nil {
		return ""
	}
	return h.dur.KeyMismatch()
}

// DrainOptions configures [Host.Drain].
type DrainOptions struct {
	// Delay is how long the host goes on serving its sessions' requests
	// after readiness fails, for proxies to notice (a health check
	// interval or two); 0 means none.
	Delay time.Duration
}

// Drain takes the host out of service without losing a session: readiness
// fails and new sessions are refused at once (HTTP 503, which a proxy
// retries elsewhere), open SSE streams are closed (their clients reconnect
// through the proxy); after opts.Delay every request is refused; calls in
// flight finish and their answers are written on their streams (until
// ctx ends); every instance's state is written to the state store and the
// host's claims are released, so other replicas take its sessions over at
// once (after ctx ends too: a call still running then keeps only its own
// session's claim, never every other session's save). The host is then
// closed. Without a state store, sessions end with the host. Drain is for
// a process about to exit.
func (h *Host) Drain(ctx context.Context, opts DrainOptions) error {
	var err error
	h.drain.once.Do(func() {
		h.log.Info("draining", "delay", opts.Delay)
		// Before readiness fails: a proxy then sends the sessions'
		// requests to other replicas at once, which must find every
		// session's record (a session made while the store was away
		// has none yet).
		h.dur.KeepPending(ctx)
		h.drain.draining.Store(true)
		h.closeStreams()
		if opts.Delay > 0 {
			select {
			case <-time.After(opts.Delay):
			case <-ctx.Done():
			}
		}
		h.drain.close()
		// Questions waiting for a person end now, with a clear answer:
		// their calls then finish and are saved like any other.
		h.asks.withdraw()
		if werr := h.ses.WaitIdle(ctx); werr != nil {
			h.log.Warn("drain: calls still running", "error", werr)
		}
		// Before the claims go: a POST let in before the host closed
		// may not have reached its call yet, and would claim its
		// session again after the release.
		if werr := h.drain.waitPosts(ctx); werr != nil {
			h.log.Warn("drain: answers not written", "error", werr)
		}
		if h.dur != nil {
			err = h.dur.Drain(ctx)
		}
		if cerr := h.Close(ctx); err == nil {
			err = cerr
		}
	})
	return err
}

// closeStreams ends every open stream (trackStream's): a
// stream would otherwise hold the replica until the client leaves.
func (h *Host) closeStreams() {
	h.drain.mu.Lock()
	defer h.drain.mu.Unlock()
	for cancel := range h.drain.streams {
		(*cancel)()
	}
}

// trackStream returns r on a context that a drain ends (closeStreams),
// for a stream open until its client leaves (a session's GET stream, a
// 2026-07-28 client's list changes); end, deferred by the caller,
// unregisters it.
func (h *Host) trackStream(r *http.Request) (_ *http.Request, end func()) {
	ctx, cancel := context.WithCancel(r.Context())
	h.drain.mu.Lock()
	defer h.drain.mu.Unlock()
	if h.drain.streams == nil {
		h.drain.streams = map[*context.CancelFunc]struct{}{}
	}
	h.drain.streams[&cancel] = struct{}{}
	return r.WithContext(ctx), func() {
		h.drain.mu.Lock()
		delete(h.drain.streams, &cancel)
		h.drain.mu.Unlock()
		cancel()
	}
}

// standingGet is a GET serving a session's stream, or a POST holding
// its call's stream (holdStreams): cancel ends it, and its handler's
// return (endLocked) is what a newer GET of the stream waits for (the
// go-sdk then holds the stream no more). Its fields are under
// h.drain.mu.
type standingGet struct {
	cancel context.CancelFunc
	// done is made by the first GET that waits for this one (doneLocked),
	// not by every POST: most are never waited for.
	done  chan struct{}
	ended bool // its handler has returned
}

// closedChan is what doneLocked returns once the handler has returned.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// doneLocked returns a channel closed once g's handler has returned.
// h.drain.mu is held.
func (g *standingGet) doneLocked() <-chan struct{} {
	if g.ended {
		return closedChan
	}
	if g.done == nil {
		g.done = make(chan struct{})
	}
	return g.done
}

// endLocked says g's handler has returned. h.drain.mu is held.
func (g *standingGet) endLocked() {
	g.ended = true
	if g.done != nil {
		close(g.done)
	}
}

// supersede makes r the GET of session id's stream (the go-sdk's, by the
// Last-Event-ID the host translated: the standing stream without one):
// an earlier GET of it still open here, or the POST whose call opened it
// (holdStreams), is ended, and waited for (until r's client leaves),
// before r is served. A client has one GET of a
// stream at a time, so the earlier one's connection is gone, and only
// the replica has not seen it yet: it was stopped (SIGSTOP, a frozen VM)
// past the proxy's read timeout, which closed the stream, and the
// client's new GET reached it as it was continued, before it read the
// close. The go-sdk answers a second GET of a stream it serves 409, and
// its client then ends the session (the fault suite's
// sigstop-past-proxy behind nginx; TestNewStandingStreamEndsTheStaleOne).
// Only the session's own user gets here (serveStateful): another
// user's GET ends nothing of it. The returned func unregisters r.
func (h *Host) supersede(r *http.Request, id string) (*http.Request, func()) {
	stream, _, _ := strings.Cut(r.Header.Get("Last-Event-ID"), "_")
	key := id + "\x00" + stream
	ctx, cancel := context.WithCancel(r.Context())
	g := &standingGet{cancel: cancel}
	h.drain.mu.Lock()
	if h.drain.gets == nil {
		h.drain.gets = map[string]*standingGet{}
	}
	old := h.drain.gets[key]
	h.drain.gets[key] = g
	var oldDone <-chan struct{}
	if old != nil {
		oldDone = old.doneLocked()
	}
	h.drain.mu.Unlock()
	if old != nil {
		old.cancel()
		select {
		case <-oldDone:
		case <-ctx.Done():
		}
	}
	return r.WithContext(ctx), func() {
		cancel()
		h.drain.mu.Lock()
		if h.drain.gets[key] == g {
			delete(h.drain.gets, key)
		}
		g.endLocked()
		h.drain.mu.Unlock()
	}
}

// streamOpenedKey is the context key of the *heldPost that a session's
// POST puts on its request's context (holdStreams), which the event
// store tells as the go-sdk opens the stream of the POST's call
// (streamOpened, from replayStore.Open with the POST's context).
type streamOpenedKey struct{}

// heldPost is a session POST's hold on its call's stream (holdStreams):
// at once the request's context (the POST's, made cancellable), the
// value the event store finds in it, and the entry a GET resuming the
// stream ends; one object, not a value context, a closure and an entry
// per POST.
type heldPost struct {
	context.Context
	standingGet
	h    *Host
	id   string
	keys []string // of the streams registered for it, under h.drain.mu
	key  [1]string
}

// Value gives the event store p itself (streamOpenedKey).
func (p *heldPost) Value(key any) any {
	if _, ok := key.(streamOpenedKey); ok {
		return p
	}
	return p.Context.Value(key)
}

// streamOpened registers the stream the go-sdk opens, with ctx, for the
// call of a session POST that holds its streams (holdStreams); for any
// other request, or the standalone stream (""), it does nothing.
func streamOpened(ctx context.Context, stream string) {
	p, ok := ctx.Value(streamOpenedKey{}).(*heldPost)
	if !ok || stream == "" {
		return
	}
	key := p.id + "\x00" + stream
	h := p.h
	h.drain.mu.Lock()
	defer h.drain.mu.Unlock()
	if h.drain.gets == nil {
		h.drain.gets = map[string]*standingGet{}
	}
	if h.drain.gets[key] == nil {
		h.drain.gets[key] = &p.standingGet
		if p.keys == nil {
			p.keys = p.key[:0]
		}
		p.keys = append(p.keys, key)
	}
}

// holdStreams registers the stream the go-sdk opens for r's call, a POST
// of session id, as a GET's is registered (supersede): a GET resuming it
// (Last-Event-ID) while r's handler still holds it ends r and waits for
// its handler to return (until the GET's client leaves), and is then
// served, replaying from the event store what r's client missed. That
// client has given the POST's stream up, and only the replica has not
// seen it close: it was stopped past the proxy's read timeout, which
// closed the stream, and the client's GET reached it as it was
// continued. The go-sdk answers a GET of a stream a POST holds 409,
// which ends the session at its client (the fault suite's
// sigstop-past-proxy behind nginx;
// TestResumedCallStreamEndsThePostHoldingIt). Ending r's context ends
// its hanging response alone: the call runs on the session's context,
// and whether its client is gone (postGone) is asked of the request's
// own. The caller defers the hold's release, which unregisters r.
func (h *Host) holdStreams(r *http.Request, id string) (*http.Request, *heldPost) {
	ctx, cancel := context.WithCancel(r.Context())
	p := &heldPost{Context: ctx, standingGet: standingGet{cancel: cancel}, h: h, id: id}
	return r.WithContext(p), p
}

// release unregisters p's streams once its handler has returned.
func (p *heldPost) release() {
	p.cancel()
	h := p.h
	h.drain.mu.Lock()
	for _, key := range p.keys {
		if h.drain.gets[key] == &p.standingGet {
			delete(h.drain.gets, key)
		}
	}
	p.endLocked()
	h.drain.mu.Unlock()
}

// storeAwayHere is why a replica cut off from the state store refuses a
// call of a session it holds (durable.Keeper.ServeElsewhere): the proxy
// sends it to another replica, which may reach the store.
const storeAwayHere = "the state store does not answer this replica: another replica may serve the session"

// errStoreUnanswered is a session that could not be taken over because
// the state store did not answer: not a session unknown.
var errStoreUnanswered = errors.New("the state store did not answer")

// errLostLately is a session the store does not hold while it came back
// empty lately: the replica that held it may be cut off from the store
// alone, and write it back (durable.Keeper.LostLately).
var errLostLately = errors.New("the state store came back empty lately: the session's replica may still hold it; retry")

// refuse answers a request the draining host will not serve: 503 with
// Retry-After, which a proxy retries on another replica.
func refuse(w http.ResponseWriter, why string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, "wasmtools: "+why, http.StatusServiceUnavailable)
}

// notNow answers a request of a session that this replica cannot take
// over for the moment (the store did not answer, or the takeovers of
// its tenant are paced). A POST is refused (503, Retry-After), which a proxy retries on another
// replica and a client retries later. A GET gets an event stream that
// only says when to reconnect, and ends: the go-sdk's client (v1.8.0)
// takes a 503 on its standing stream (reopened at once whenever it
// drops, as at a failover) for the connection's end, and lost a session
// the store holds, while a stream ended it reopens after its retry:
// delay. The standing stream's answer carries a priming event
// (standing.go) that keeps the client's resume point: the client gives
// up after MaxRetries (5 by default) streams in a row with no event ID
// of their own, and with it never does. The delay is past a 10 s outage
// of the store (the fault suite's redis-down-10s, partition-store) and
// go-redis's redial in two or three answers. A GET resuming a call's
// stream (Last-Event-ID) fails that call alone, as a stream ended
// without its response. Neither proxy in deploy/ retries this on
// another replica as it did the 503: one that reaches the store would
// serve the stream sooner, but where none does, the last 503 reached the
// client and ended the session (docs/DESIGN.md).
func notNow(w http.ResponseWriter, r *http.Request, why string) {
	reconnectLater(w, r, why, reopenAfter+mathrand.N(reopenSpread))
}

// reconnectLater refuses a POST (503), and answers a GET with an event stream
// that asks its client to reconnect after retry, primed (standing.go)
// when it is the standing stream, and ends.
func reconnectLater(w http.ResponseWriter, r *http.Request, why string, retry time.Duration) {
	if r.Method != http.MethodGet {
		refuse(w, why)
		return
	}
	if p, ok := w.(*primer); ok && !p.written {
		w = p.ResponseWriter // primed here, with the retry
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache, no-store")
	w.WriteHeader(http.StatusOK)
	fmt.Fprintf(w, ": %s\n", strings.ReplaceAll(why, "\n", " "))
	writePrime(w, standingPrime(r), retry.Milliseconds())
}

// drainedGet answers a GET of a session's stream at a draining replica:
// back in 1 to 2 s (the go-sdk client's own first delay), by which time
// a proxy may have seen the drain, at the latest when the replica has
// exited (a client without a proxy then has nowhere to go). A 503 ended
// the session at the go-sdk client (v1.8.0), and the priming event lets
// it come back as often as the drain lasts.
func drainedGet(w http.ResponseWriter, r *http.Request, why string) {
	reconnectLater(w, r, why, time.Second+mathrand.N(time.Second))
}

// reopenAfter and reopenSpread bound the delay notNow asks of a client
// before it reopens its standing stream.
const (
	reopenAfter  = 4 * time.Second
	reopenSpread = time.Second
)

// serveStateful serves a request of the stateful HTTP transport, taking
// its session over from the state store when this replica does not have
// it, and refusing what a draining host no longer takes.
func (h *Host) serveStateful(stateful http.Handler, events mcp.EventStore, w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Mcp-Session-Id")
	if r.Method == http.MethodGet && id != "" {
		// The host's priming event's ID, back to the go-sdk's, before
		// anything reads it (standing.go).
		sdk, _, ok := standingResume(r.Header.Get("Last-Event-ID"))
		if !ok {
			http.Error(w, "malformed Last-Event-ID", http.StatusBadRequest)
			return
		}
		if r.Header.Del("Last-Event-ID"); sdk != "" {
			r.Header.Set("Last-Event-ID", sdk)
		}
	}
	switch {
	case h.drain.closing.Load() && r.Method == http.MethodGet && id != "":
		// Not 503, which ends the session at the go-sdk client: back in
		// a second or two, to another replica when there is a proxy.
		drainedGet(w, r, "this replica is shutting down")
		return
	case h.drain.closing.Load():
		refuse(w, "this replica is shutting down")
		return
	case id == "" && h.drain.draining.Load():
		refuse(w, "this replica is draining and takes no new sessions")
		return
	case id == "":
		// The body is read before the lock: a client sending it slowly
		// (the guard allows 30 s) would hold every takeover here on
		// the write lock, and every new session behind it.
		if _, ok := readBody(w, r); !ok {
			return
		}
		h.adoptMu.RLock()
		defer h.adoptMu.RUnlock()
		stateful.ServeHTTP(w, r)
		return
	case r.Method == http.MethodGet:
		if h.drain.draining.Load() {
			drainedGet(w, r, "this replica is draining")
			return
		}
		var end func()
		r, end = h.trackStream(r)
		defer end()
		if !h.book.others(id, userOf(r)) {
			var done func()
			r, done = h.supersede(r, id)
			defer done()
		}
		ctx := r.Context()
		if eid := r.Header.Get("Last-Event-ID"); eid != "" && (h.book.others(id, userOf(r)) || !h.canReplay(ctx, events, id, eid)) {
			// Events of another replica (the session moved here) or
			// purged: the stream cannot be resumed. An empty stream,
			// ended at once, tells a go-sdk client that the call it
			// waited for ended without a response (that one call fails,
			// the session goes on; a standalone stream just reconnects,
			// from nothing it reached here: its priming event says so).
			// Neither a refusal (the client takes it for a broken
			// connection) nor a second standalone stream (409 when the
			// client has one, and the client closes the session).
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("Cache-Control", "no-cache, no-store")
			w.WriteHeader(http.StatusOK)
			if standingPrime(r) != "" {
				writePrime(w, primeID(""), 0)
			}
			return
		}
		if id := standingPrime(r); id != "" {
			w = &primer{ResponseWriter: w, id: id}
		}
	}
	if r.Method == http.MethodDelete {
		h.book.deleting(id, userOf(r))
	}
	// The POST's own context, which its client's leaving ends: holdStreams'
	// is ended by a GET resuming its stream too.
	live := r.Context()
	if r.Method == http.MethodPost {
		var held *heldPost
		r, held = h.holdStreams(r, id)
		defer held.release()
	}
	// Another user's session is answered as none, as at a replica that
	// does not hold it (the go-sdk's 403 said it is live here).
	nf := &notFound{ResponseWriter: w, book: h.book, id: id, r: r}
	if h.dur == nil {
		stateful.ServeHTTP(nf, r)
		if nf.missing {
			http.Error(w, "session not found", http.StatusNotFound)
		}
		return
	}
	// The body is read here (the guard bounds it) so that the request
	// can be served again once the session is taken over.
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	if r.Method == http.MethodPost && isToolCall(body) {
		setResend(r, "", body)
		// The call learns through this whether its client is still
		// there: a stateful session's handler runs on the session's
		// context, which a client that gave up does not end.
		token := rand.Text()
		h.posts.Store(token, live)
		defer h.posts.Delete(token)
		r.Header.Set(liveHeader, token)
	}
	if r.Method == http.MethodPost && isToolCall(body) && h.dur.ServeElsewhere(r.Context(), durable.StoreID(sessions.Conn(nil, id, ""))) {
		refuse(w, storeAwayHere)
		return
	}
	stateful.ServeHTTP(nf, r)
	if !nf.missing {
		return
	}
	if err := h.adopt(r.Context(), stateful, r, id); err != nil {
		if errors.Is(err, errStoreUnanswered) {
			// Not a session unknown: 404 would end it at the client.
			// Another replica may reach the store, and this one may
			// again in a moment.
			h.log.Warn("session not taken over: the state store does not answer", "method", r.Method, "session", sessionLabel(id), "error", err)
			notNow(w, r, "the state store does not answer: the session cannot be taken over now")
			return
		}
		if errors.Is(err, errLostLately) {
			// Not a session unknown, maybe: its replica, cut off
			// from the store, may write it back (durable.Keeper.
			// LostLately). Counted, not logged: a made-up ID gets
			// this too. Said without err's cause, which would tell
			// another user's session from none.
			h.metrics.refusals.WithLabelValues("store_lost_lately", tenantLabel(r)).Inc()
			notNow(w, r, errLostLately.Error())
			return
		}
		if errors.Is(err, errTakeoversPaced) {
			// Not logged: a line a request, unpaced, is what the
			// bucket spares the store. Counted, so that an operator
			// sees the pace at work.
			h.metrics.refusals.WithLabelValues("takeovers_paced", tenantLabel(r)).Inc()
			notNow(w, r, err.Error()+": the session cannot be taken over now")
			return
		}
		if !errors.Is(err, statestore.ErrNotFound) {
			h.log.Warn("session not taken over", "session", sessionLabel(id), "error", err)
		}
		http.Error(w, "session not found", http.StatusNotFound)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	stateful.ServeHTTP(w, r)
}

// readBody reads r's body whole (the guard bounds it) and puts it back
// to be read again; on failure it answers r (413 past the bound) and
// returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	if r.Body == nil {
		return nil, true
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return nil, false
		}
		http.Error(w, "reading the request: "+err.Error(), http.StatusBadRequest)
		return nil, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, true
}

// canReplay reports whether events holds what a client resuming session
// id's stream after event eid ("STREAM_INDEX", the go-sdk's format) needs.
func (h *Host) canReplay(ctx context.Context, events mcp.EventStore, id, eid string) bool {
	stream, idx, ok := strings.Cut(eid, "_")
	n, err := strconv.Atoi(idx)
	if !ok || err != nil || n < 0 {
		return true // malformed: the go-sdk says so
	}
	for _, err := range events.After(ctx, id, stream, n) {
		return err == nil
	}
	return true
}

// notFound passes a response through unless it is the go-sdk's "session
// not found" (a 404 before anything was written), or its "session user
// mismatch" (a 403 of a session others reports another user's), which
// it swallows and reports.
type notFound struct {
	http.ResponseWriter
	// book, id and r say whether a 403 is of another user's session
	// (book.others); book is nil where none can be. Fields rather than a
	// closure: one allocation less per request.
	book    *sessionBook
	id      string
	r       *http.Request
	missing bool
	wrote   bool
}

func (n *notFound) WriteHeader(code int) {
	if !n.wrote && (code == http.StatusNotFound || code == http.StatusForbidden && n.book != nil && n.book.others(n.id, userOf(n.r))) {
		n.missing = true
	}
	n.wrote = true
	if !n.missing {
		n.ResponseWriter.WriteHeader(code)
	}
}

func (n *notFound) Write(b []byte) (int, error) {
	if !n.wrote {
		n.WriteHeader(http.StatusOK)
	}
	if n.missing {
		return len(b), nil
	}
	return n.ResponseWriter.Write(b)
}

func (n *notFound) Flush() {
	if f, ok := n.ResponseWriter.(http.Flusher); ok && !n.missing {
		f.Flush()
	}
}

func (n *notFound) Unwrap() http.ResponseWriter { return n.ResponseWriter }

// adopt takes stateful session id over from the state store: it makes the
// go-sdk session again, under the same ID, by replaying the client's
// initialize (its recorded parameters) and initialized notification
// through the stateful handler. The instances' states follow on the
// session's first call (durable.Keeper.Ensure). It fails with
// statestore.ErrNotFound when the store does not know the session (with
// errLostLately instead while the store came back empty lately), and
// with errTakeoversPaced, the store not asked, past the pace of the
// request's tenant's reads of sessions it does not have (takeovers.go).
func (h *Host) adopt(ctx context.Context, stateful http.Handler, orig *http.Request, id string) (err error) {
	if len(id) > 128 {
		return statestore.ErrNotFound
	}
	tenant := h.shareTenant(userOf(orig))
	if !h.takeovers.take(tenant) {
		return errTakeoversPaced
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	defer func() {
		// A record missing and one of another user's alike, so that
		// the answer tells nothing of another's session.
		if errors.Is(err, statestore.ErrNotFound) {
			err = h.lostLately(ctx, err)
		}
	}()
	rec, err := h.dur.ReadSession(ctx, id)
	if err != nil {
		if durable.Unanswered(err) {
			return fmt.Errorf("%w: %w", errStoreUnanswered, err)
		}
		return err
	}
	var sr struct {
		Initialize *mcp.InitializeParams
		Subject    string
	}
	sr.Subject = rec.Subject
	if rec.Initialize != nil {
		if err := json.Unmarshal(rec.Initialize, &sr.Initialize); err != nil {
			return fmt.Errorf("session record: %w", err)
		}
	}
	if sr.Initialize == nil {
		return fmt.Errorf("%w: the session's record has no initialize parameters", statestore.ErrNotFound)
	}
	// The session is its authenticated user's, as the go-sdk holds it on
	// the replica that made it: another user's request does not find it.
	if !hmac.Equal([]byte(sr.Subject), []byte(h.subjectTag(userOf(orig)))) {
		return fmt.Errorf("%w: the session belongs to another user", statestore.ErrNotFound)
	}
	h.takeovers.give(tenant) // the tenant's own session: not paced
	h.adoptMu.Lock()
	defer h.adoptMu.Unlock()
	h.adoptID = id
	defer func() { h.adoptID = "" }()
	// Another request of the session may have taken it over meanwhile.
	if h.hasSession(ctx, stateful, orig, id) {
		return nil
	}
	// The replayed initialize does not write the record
	// (keepNewSession): the request served next claims the session.
	h.dur.AdoptedHere(id)
	init, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": sr.Initialize})
	if err != nil {
		return err
	}
	res := h.replay(ctx, stateful, orig, "", init, "")
	if res.Code != http.StatusOK {
		return fmt.Errorf("replaying initialize: HTTP %d: %s", res.Code, strings.TrimSpace(res.Body.String()))
	}
	if got := res.Header().Get("Mcp-Session-Id"); got != id {
		return fmt.Errorf("replaying initialize: the session got another ID (%s)", sessionLabel(got))
	}
	res = h.replay(ctx, stateful, orig, id, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`), sr.Initialize.ProtocolVersion)
	if res.Code/100 != 2 {
		return fmt.Errorf("replaying initialized: HTTP %d", res.Code)
	}
	h.log.Info("session taken over from the state store", "session", sessionLabel(id))
	return nil
}

// lostLately is err, a session not found in the store, as
// errLostLately while the store came back empty lately, or as
// errStoreUnanswered when the store did not answer the epoch read.
func (h *Host) lostLately(ctx context.Context, err error) error {
	lost, lerr := h.dur.LostLately(ctx)
	switch {
	case lerr != nil && durable.Unanswered(lerr):
		return fmt.Errorf("%w: %w", errStoreUnanswered, lerr)
	case lost:
		return fmt.Errorf("%w: %w", errLostLately, err)
	}
	return err
}

// hasSession reports whether the stateful handler has session id, by a
// ping in it (404 when it has not).
func (h *Host) hasSession(ctx context.Context, stateful http.Handler, orig *http.Request, id string) bool {
	res := h.replay(ctx, stateful, orig, id, []byte(`{"jsonrpc":"2.0","method":"ping","id":0}`), "")
	return res.Code == http.StatusOK
}

// replay serves one JSON-RPC message through the stateful handler, as a
// client of session id ("" for none) would send it, from where orig
// came.
func (h *Host) replay(ctx context.Context, stateful http.Handler, orig *http.Request, id string, msg []byte, version string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, orig.URL.Path, bytes.NewReader(msg))
	// As the client's own request: the go-sdk checks Host and Origin.
	req.Host, req.RemoteAddr = orig.Host, orig.RemoteAddr
	if o := orig.Header.Get("Origin"); o != "" {
		req.Header.Set("Origin", o)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if id != "" {
		req.Header.Set("Mcp-Session-Id", id)
	}
	if version != "" {
		req.Header.Set("Mcp-Protocol-Version", version)
	}
	rec := httptest.NewRecorder()
	stateful.ServeHTTP(rec, req)
	return rec
}

// tenantLabel is the tenant label of r's refusals counted: "subject" or
// "anonymous".
func tenantLabel(r *http.Request) string {
	if userOf(r) != "" {
		return "subject"
	}
	return "anonymous"
}

// userOf is the authenticated user of r ("" for none).
func userOf(r *http.Request) string {
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		return ti.UserID
	}
	return ""
}

// RequestIDHeader names the header a proxy in front of the replicas sets
// on every request it passes on to one, to an ID of the client's request
// that stays the same across the proxy's own resends of it (nginx's
// $request_id, HAProxy's unique-id: deploy/). A 2026-07-28 tools/call
// carrying it is answered at most once per ID and body (markProxyResend).
const RequestIDHeader = "X-Request-Id"

// setResend gives a tools/call POST its resend digest (resendHeader), of
// its body and, when a proxy named it, the client request's ID: a proxy's
// resend of the same POST is answered with the first result.
func setResend(r *http.Request, requestID string, body []byte) {
	d := sha256.New()
	if requestID != "" {
		// A header value holds no NUL: the ID ends where the body begins.
		d.Write([]byte(requestID))
		d.Write([]byte{0})
	}
	d.Write(body)
	r.Header.Set(resendHeader, hex.EncodeToString(d.Sum(nil)[:16]))
}

// markProxyResend gives a 2026-07-28 tools/call POST that carries a
// proxy's request ID (RequestIDHeader) its resend digest, of the ID and the
// body: a proxy's resend of a call whose replica stopped between its
// checkpoint and its answer (nginx's 504 → @fallback, HAProxy's
// retry-on response-timeout) is answered at the fallback with the first
// result rather than run again (TestHandleCallResentByProxyAppliedOnce).
// Not the body alone, as a 2025-11-25 session's POST is (serveStateful): a
// handle outlives its client's connections, whose JSON-RPC ids start over,
// so an identical later call (a no-argument tool at the same id after a
// reconnect) would get an old result; a new client request has a new ID.
// Without the header nothing is marked: a keyless handle call is not
// deduplicated (its client's idempotency key is). It reports false when
// the body could not be read (answered).
func (h *Host) markProxyResend(w http.ResponseWriter, r *http.Request) bool {
	id := r.Header.Get(RequestIDHeader)
	if h.dur == nil || id == "" || r.Header.Get("Mcp-Method") != "tools/call" {
		return true
	}
	body, ok := readBody(w, r)
	if ok && isToolCall(body) {
		setResend(r, id, body)
	}
	return ok
}

// isToolCall reports whether body is one JSON-RPC tools/call request.
func isToolCall(body []byte) bool {
	if !bytes.Contains(body, []byte(`tools/call`)) {
		return false // cheap: most POSTs are not
	}
	var m struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
	}
	return json.Unmarshal(body, &m) == nil && m.Method == "tools/call" && len(m.ID) > 0
}
