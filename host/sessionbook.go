package host

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// DefaultMaxSessions bounds the open stateful HTTP sessions when
// [Options.MaxSessions] is 0. An idle session costs the go-sdk's session
// and transport (tens of KiB) until the session timeout, and a client
// opens one with a single request; 4,096 of them are some 200 MiB at most.
const DefaultMaxSessions = 4096

// SessionParamsBytes bounds what the open stateful HTTP sessions keep of
// their clients' initialize parameters, in all (with tenants, each
// tenant a quarter), each session counted at what its parameters cost
// decoded ([paramsCost]). The go-sdk keeps them for the session's life:
// a typical client's cost a few KiB, but nothing bounded them but the
// request body (4 MiB), and one initialize of 1.6 MB, a capability of
// 60 000 small objects, kept 38 MiB of heap.
const SessionParamsBytes = 64 << 20

// sessionBook bounds the open stateful HTTP sessions (Mcp-Session-Id): in
// all, [Options.MaxSessions] and [SessionParamsBytes] of their initialize
// parameters, and with tenants, each tenant's share of them,
// [Options.MaxSessionsPerSubject] and a quarter of the bytes. An
// initialize whose parameters alone are over the tenant's share of the
// bytes is refused. An initialize past a bound ends
// an idle session to make room: one of the same tenant's (those that made
// no request after they opened first, then the least recently used), or,
// past the total alone, one of the tenant holding the most (else of the
// next largest with one idle); never another tenant's to fit a tenant
// over its share. A second initialize of a live session stays booked. With none idle the initialize
// is refused (CodeBusy), and the go-sdk drops the session it made for it.
//
// A session is idle while none of its requests is being served; an open
// GET stream does not make it busy (a go-sdk client keeps one open for
// the session's life). It is safe for concurrent use; the per-request
// work is a map load and two atomic adds.
type sessionBook struct {
	max, share           int
	maxBytes, bytesShare int
	tenants              bool

	mu       sync.Mutex
	open     int
	bytesAll int
	bytes    map[string]int // the tenants' sessions' costs
	byTenant map[string]map[*bookEntry]struct{}
	byID     map[string]*bookEntry
	// entries is read by every request of a stateful session (enter),
	// without mu. A session ended to make room stays in it (busy -1, so
	// its requests are refused) until the go-sdk's close of it, which
	// runs apart, has ended it: else a request arriving meanwhile would
	// find it unbooked and be served.
	entries sync.Map // *mcp.ServerSession -> *bookEntry
}

type bookEntry struct {
	ss     *mcp.ServerSession
	tenant string
	user   string // the authenticated subject, "" for none
	// reqs holds the cancels of the session's requests being served,
	// which end calls when the session's client deletes it: the go-sdk's
	// close waits for the session's requests, and a guest would otherwise
	// run to its deadline for a client that is gone. Once gone is set, a
	// request entering is cancelled at once. A map the entry keeps rather
	// than a context.AfterFunc per request: that cost every request two
	// allocations and a closure (issue 27, item 2).
	reqMu sync.Mutex
	reqs  map[context.Context]context.CancelFunc
	gone  bool
	// busy counts the session's requests being served; -1 once the
	// session was chosen to be ended, so that no request enters it then.
	busy atomic.Int32
	// last is when the session's last request ended (or it opened), in
	// Unix nanoseconds; used says it made a request after it opened.
	last atomic.Int64
	used atomic.Bool
	// dropped says the book no longer counts it (under mu).
	dropped bool
	// cost is what its initialize parameters cost kept (paramsCost).
	cost int
}

func newSessionBook(o *Options) *sessionBook {
	b := &sessionBook{
		max:      DefaultMaxSessions,
		tenants:  o.Tenants,
		byTenant: map[string]map[*bookEntry]struct{}{},
		byID:     map[string]*bookEntry{},
		bytes:    map[string]int{},
		maxBytes: cmp.Or(o.MaxSessionParamsBytes, SessionParamsBytes),
	}
	if o.MaxSessions > 0 {
		b.max = o.MaxSessions
	}
	b.share, b.bytesShare = b.max, b.maxBytes
	if o.Tenants {
		b.share = max(cmp.Or(o.MaxSessionsPerSubject, b.max/4), 1)
		b.bytesShare = b.maxBytes / 4
	}
	return b
}

// paramsCost is what initialize parameters cost kept: keptCost, and 1
// KiB for the session around them.
func paramsCost(params any) int { return keptCost(params) + 1024 }

// keptCost is what a value decoded from a client's JSON costs kept: its
// JSON's bytes, and 128 for each value in it (decoded generically, a map
// entry, a slice element or a boxed number is some 100 bytes of heap:
// 60 000 objects of 27 bytes of JSON and 6 values each kept 38 MiB).
func keptCost(v any) int {
	b, err := json.Marshal(v)
	if err != nil {
		return SessionParamsBytes // refused wherever it is counted
	}
	values := 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case escaped:
			escaped = false
		case inString:
			escaped = c == '\\'
			inString = c != '"'
		case c == '"':
			inString = true
		case c == '{' || c == '[' || c == ',' || c == ':':
			values++
		}
	}
	return len(b) + 128*values
}

// count is the number of sessions open now, for the metrics.
func (b *sessionBook) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.open
}

// openSession books ss, which an initialize of tenant's is opening, its
// parameters costing cost (paramsCost). It returns the sessions to end
// to make room (none, but for a large initialize one), or an error when
// no idle session may be ended; booked is false for a session booked
// already (a second initialize, which the go-sdk refuses and which must
// not unbook the live session).
func (b *sessionBook) openSession(ss *mcp.ServerSession, user, tenant string, cost int) (victims []*mcp.ServerSession, booked bool, err error) {
	if !b.tenants {
		tenant = ""
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.entries.Load(ss); ok {
		return nil, false, nil
	}
	if cost > b.bytesShare {
		return nil, false, fmt.Errorf("%w: the session's initialize parameters cost %d bytes kept, over this client's share of %d", errSessionsBusy, cost, b.bytesShare)
	}
	own := b.byTenant[tenant]
	for {
		var end *bookEntry
		switch {
		case len(own) >= b.share || b.bytes[tenant]+cost > b.bytesShare:
			switch end = idlest(own); {
			case end != nil:
			case pooled(tenant):
				return victims, false, fmt.Errorf("%w: the HTTP sessions of the clients without a subject, together, hold their share (%d, and %d bytes of initialize parameters), all serving requests; end one (HTTP DELETE) or retry later", errSessionsBusy, b.share, b.bytesShare)
			default:
				return victims, false, fmt.Errorf("%w: this client's %d HTTP sessions are all serving requests, its share (of %d, and %d bytes of initialize parameters); end one (HTTP DELETE) or retry later", errSessionsBusy, len(own), b.share, b.bytesShare)
			}
		case b.open >= b.max || b.bytesAll+cost > b.maxBytes:
			if end = idlest(own); end == nil {
				end = b.idlestOfLargestLocked()
			}
			if end == nil {
				return victims, false, sessions.ServerFull(errSessionsBusy, "the HTTP sessions, all serving requests,")
			}
		}
		if end == nil {
			break
		}
		b.dropLocked(end)
		b.entries.Store(end.ss, end) // refusing its requests until closed
		victims = append(victims, end.ss)
		own = b.byTenant[tenant] // gone if end was its last
	}
	e := &bookEntry{ss: ss, tenant: tenant, user: user, cost: cost}
	e.last.Store(time.Now().UnixNano())
	if own == nil {
		own = map[*bookEntry]struct{}{}
		b.byTenant[tenant] = own
	}
	own[e] = struct{}{}
	b.open++
	b.bytes[tenant] += cost
	b.bytesAll += cost
	b.entries.Store(ss, e)
	b.byID[ss.ID()] = e
	return victims, true, nil
}

// errSessionsBusy is matched by the refusal of an initialize past the
// session bounds with no idle session to end.
var errSessionsBusy = errors.New("no new HTTP session")

// idlest claims (busy 0 → -1) and returns the entry of set most fit to
// end: one unused since it opened first, then the least recently used;
// nil when every one is serving a request. The caller holds mu.
func idlest(set map[*bookEntry]struct{}) *bookEntry {
	for {
		var best *bookEntry
		for e := range set {
			if e.busy.Load() != 0 {
				continue
			}
			if best == nil || better(e, best) {
				best = e
			}
		}
		if best == nil || best.busy.CompareAndSwap(0, -1) {
			return best
		}
		// A request entered it meanwhile: choose again.
	}
}

func better(e, than *bookEntry) bool {
	if eu, tu := e.used.Load(), than.used.Load(); eu != tu {
		return !eu
	}
	return e.last.Load() < than.last.Load()
}

// idlestOfLargestLocked claims the idle session to end past MaxSessions
// when the tenant opening one has none idle: of the tenant holding the
// most, else of the next largest, and so on (nil when every session is
// busy). The caller holds mu.
func (b *sessionBook) idlestOfLargestLocked() *bookEntry {
	sets := make([]map[*bookEntry]struct{}, 0, len(b.byTenant))
	for _, set := range b.byTenant {
		sets = append(sets, set)
	}
	slices.SortFunc(sets, func(x, y map[*bookEntry]struct{}) int { return len(y) - len(x) })
	for _, set := range sets {
		if e := idlest(set); e != nil {
			return e
		}
	}
	return nil
}

// dropLocked forgets e. The caller holds mu.
func (b *sessionBook) dropLocked(e *bookEntry) {
	if cur, ok := b.entries.Load(e.ss); !ok || cur != e {
		return
	}
	b.entries.Delete(e.ss)
	if e.dropped {
		return // ended to make room, and now closed
	}
	e.dropped = true
	if b.byID[e.ss.ID()] == e {
		delete(b.byID, e.ss.ID())
	}
	e.end()
	set := b.byTenant[e.tenant]
	delete(set, e)
	if len(set) == 0 {
		delete(b.byTenant, e.tenant)
	}
	b.open--
	b.bytesAll -= e.cost
	if b.bytes[e.tenant] -= e.cost; b.bytes[e.tenant] <= 0 {
		delete(b.bytes, e.tenant)
	}
}

// closed forgets ss, which ended (or whose initialize failed).
func (b *sessionBook) closed(ss *mcp.ServerSession) {
	// Under mu: openSession takes a session it ends out of entries and
	// puts it back, and a load between the two would miss it for good.
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.entries.Load(ss)
	if !ok {
		return
	}
	b.dropLocked(v.(*bookEntry))
}

// others reports whether session id is open here for another user than
// user ("" for none), which the go-sdk refuses (403): a session of no
// user is anyone's who has its ID, as the go-sdk has it.
func (b *sessionBook) others(id, user string) bool {
	b.mu.Lock()
	e := b.byID[id]
	b.mu.Unlock()
	return e != nil && e.user != "" && e.user != user
}

// deleting cancels the requests being served in session id, which its
// client (user, "" for none) is deleting: the go-sdk closes the session
// only once they are done. Another user's DELETE cancels nothing (the
// go-sdk refuses it).
func (b *sessionBook) deleting(id, user string) {
	b.mu.Lock()
	e := b.byID[id]
	b.mu.Unlock()
	if e != nil && e.user == user {
		e.end()
	}
}

// end cancels the session's requests being served, and every request
// that enters it from now on.
func (e *bookEntry) end() {
	e.reqMu.Lock()
	defer e.reqMu.Unlock()
	e.gone = true
	for _, cancel := range e.reqs {
		cancel()
	}
}

// enter counts a request of ss in, and returns its context, ended too if
// the session's client deletes it, and the ticket whose leave counts it
// out; ok is false when ss is being ended to make room (its request would
// find it gone a moment later).
func (b *sessionBook) enter(ctx context.Context, ss *mcp.ServerSession) (_ context.Context, _ bookTicket, ok bool) {
	v, found := b.entries.Load(ss)
	if !found {
		return ctx, bookTicket{}, true // not booked: a session of no ID, or one opening
	}
	e := v.(*bookEntry)
	for {
		n := e.busy.Load()
		if n < 0 {
			return nil, bookTicket{}, false
		}
		if e.busy.CompareAndSwap(n, n+1) {
			break
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	e.reqMu.Lock()
	if e.gone {
		cancel()
	} else {
		if e.reqs == nil {
			e.reqs = map[context.Context]context.CancelFunc{}
		}
		e.reqs[ctx] = cancel
	}
	e.reqMu.Unlock()
	return ctx, bookTicket{e: e, ctx: ctx, cancel: cancel}, true
}

// bookTicket is a request entered in a booked session ([sessionBook.enter]);
// the zero ticket, of a request not booked, leaves nothing.
type bookTicket struct {
	e      *bookEntry
	ctx    context.Context
	cancel context.CancelFunc
}

// leave counts the request out.
func (t bookTicket) leave() {
	e := t.e
	if e == nil {
		return
	}
	e.reqMu.Lock()
	delete(e.reqs, t.ctx)
	e.reqMu.Unlock()
	t.cancel()
	e.used.Store(true)
	e.last.Store(time.Now().UnixNano())
	e.busy.Add(-1)
}

// bookSessions is the receiving middleware of [sessionBook]: it books the
// stateful HTTP session an initialize opens, ending another to make room
// or refusing it, and counts each later request in and out.
func (h *Host) bookSessions(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if !ok || ss.ID() == "" {
			return next(ctx, method, req) // stdio, in-memory, sessionless
		}
		if method == "notifications/initialized" {
			// The handshake's end, not a use: a client that opens
			// sessions and leaves them is the first to make room.
			return next(ctx, method, req)
		}
		if method != "initialize" {
			ctx, ticket, ok := h.book.enter(ctx, ss)
			if !ok {
				return nil, endedForRoom()
			}
			defer ticket.leave()
			return next(ctx, method, req)
		}
		return h.bookInitialize(ctx, method, req, ss, next)
	}
}

// endedForRoom is the refusal of a request of a session ended to make
// room.
//
//go:noinline
func endedForRoom() error {
	return protocolError(fmt.Errorf("%w: this session was ended to make room for a new one", ErrSessionEnded))
}

// bookInitialize is bookSessions' for an initialize. A function of its
// own, not inlined, as the refusal above: the middleware's frame is under
// every tool call's, whose goroutine stack must fit in 8 KiB (see
// traceMiddleware).
//
//go:noinline
func (h *Host) bookInitialize(ctx context.Context, method string, req mcp.Request, ss *mcp.ServerSession, next mcp.MethodHandler) (mcp.Result, error) {
	user := subjectOf(req.GetExtra())
	victims, booked, err := h.book.openSession(ss, user, h.tenantOf(user), paramsCost(req.GetParams()))
	for _, victim := range victims {
		h.log.Info("idle HTTP session ended to make room", "session", sessionLabel(victim.ID()), "for", sessionLabel(ss.ID()))
		h.metrics.sessionsEvicted.Inc()
		go victim.Close()
	}
	if err != nil {
		h.log.Warn("new HTTP session refused", "session", sessionLabel(ss.ID()), "error", err)
		// The go-sdk closes a session whose initialize failed.
		return nil, &jsonrpc.Error{Code: CodeBusy, Message: err.Error(), Data: []byte(`{"reason":"too_many_sessions","retry":true}`)}
	}
	res, err := next(ctx, method, req)
	if err != nil {
		if booked { // not a second initialize of a live session
			h.book.closed(ss)
		}
		return res, err
	}
	h.connKey(ss) // watched: the book forgets it when it ends
	return res, err
}
