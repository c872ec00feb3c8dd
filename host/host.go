// Package host serves a catalogue of Wasm plugins over MCP: it registers
// their tools on a go-sdk server, keeps one instance of each plugin per MCP
// session, runs calls through them, and shapes their results.
//
// Only this package imports the MCP SDK. A Host serves over any go-sdk
// transport: [Host.Server] for stdio or in-memory, [Host.HTTPHandler] for
// streamable HTTP.
package host

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/grantstore"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
)

// Defaults of [Options].
const (
	// DefaultMaxResultRunes caps a result, counted in runes across what
	// the guest put in it: its blocks (with their JSON), structured
	// content, its own _meta keys and the call's records. A model reads
	// results into a bounded context.
	DefaultMaxResultRunes = 50_000
	// MaxResultBlocks bounds the content blocks of a result, whatever
	// MaxResultRunes says: past it they are dropped, and a note says how
	// many. A model gains nothing from more, and a client renders each.
	MaxResultBlocks = 1000
	// DefaultQueueLimit bounds the calls one session may have waiting for
	// one plugin instance, the running one included.
	DefaultQueueLimit = sessions.DefaultQueueLimit
	// DefaultSessionTimeout closes a streamable HTTP session that sent no
	// request for this long.
	DefaultSessionTimeout = 30 * time.Minute
)

// MetaPrefix namespaces the keys wasmtools adds to a result's _meta.
const MetaPrefix = "dev.wasmtools/"

// MetaStateReset is the _meta key of a result served by a fresh instance
// because the session's previous one was discarded. Its value is an object
// with "reason": "trap", "timeout", "cancelled", "upgrade", "evicted" or
// "replica-lost" (the session moved from a replica that is gone, and this
// plugin's state could not move with it), and "detail".
const MetaStateReset = MetaPrefix + "stateReset"

// MetaNotSaved is the _meta key of a call result whose state change was
// not durably saved in the state store (with [CheckpointAfterCall]): a
// replica lost now would lose it. Its value is an object with "reason":
// "store-unavailable", "too-large" (the state is over the store's bound),
// "over-budget" (a byte budget refused the write, [ErrStoreBudget]: the
// store is up, and the state is saved again once the budget has room),
// "moved" (another replica took the session over while the call ran: the
// call is also an error), "unverified" (the store did not answer and the
// session's claim was verified too long ago to trust the instance: the
// call is also an error, its effect not kept) or "cannot-snapshot".
const MetaNotSaved = MetaPrefix + "notSaved"

// MetaFailed is the _meta key of an error result whose guest produced no
// result: it trapped, crashed, overran its deadline or was cancelled (and
// its instance was reset). Its value is "trap", "timeout" or "cancelled".
// A task whose call ends so is "failed", with a JSON-RPC error, not
// "completed" with the error result.
const MetaFailed = MetaPrefix + "failed"

// Options configures a [Host]. The zero value gives the documented defaults;
// nil and zero fields are never written back.
type Options struct {
	// Name and Version are what the server reports to clients. Defaults:
	// "wasmtools" and "dev".
	Name, Version string
	// Logger receives the host's structured log. nil discards it.
	Logger *slog.Logger
	// MaxResultRunes caps each result; 0 means [DefaultMaxResultRunes],
	// negative means no cap.
	MaxResultRunes int
	// QueueLimit bounds a session's waiting calls per plugin; 0 means
	// [DefaultQueueLimit]. A call past it is refused at once.
	QueueLimit int
	// SessionTimeout closes idle streamable HTTP sessions, and frees the
	// instances of idle client keys; 0 means [DefaultSessionTimeout],
	// negative means never.
	SessionTimeout time.Duration
	// StreamKeepAlive is how often an event stream with nothing to say
	// carries an SSE comment, so that a proxy's read timeout can tell a
	// hung replica from a long call; 0 means [DefaultStreamKeepAlive],
	// negative means never.
	StreamKeepAlive time.Duration
	// StreamWriteTimeout bounds each write to an HTTP response (each
	// 64 KiB of a large one): past it the response, a client's stream
	// that stopped reading, ends; 0 means [DefaultStreamWriteTimeout],
	// negative means never. (A long-lived stream's writes are queued,
	// within [StreamQueueBytes], so that it holds up no one's list
	// changes and resource updates meanwhile; once its handler has
	// returned, what is left goes within the timeout in all, or
	// [DefaultStreamWriteTimeout] when negative.)
	StreamWriteTimeout time.Duration
	// MaxInstances bounds the live instances of all plugins, and
	// MaxInstancesPerPlugin those of any one plugin; 0 means no bound.
	// At a bound, the least recently used idle instance is evicted (its
	// session's next call starts afresh, told so in _meta); when none is
	// idle, the call is refused with [ErrAtCapacity].
	MaxInstances, MaxInstancesPerPlugin int
	// InstanceLimits overrides MaxInstancesPerPlugin for the plugins it
	// names, and its key "" for every other plugin. [Host.SetInstanceLimits]
	// replaces it.
	InstanceLimits map[string]int
	// MemoryBudget bounds the memory of all live instances, each counted
	// at its plugin's memory limit (what it may grow to); 0 means no
	// bound. Past it, idle instances are evicted as for MaxInstances, and
	// with none idle a new instance is refused with [ErrAtCapacity].
	MemoryBudget uint64
	// MaxConcurrentCalls bounds the guest calls running at once across
	// all sessions; 0 means no bound. Further calls wait their turn.
	MaxConcurrentCalls int
	// MaxCallsPerSubject bounds the calls over HTTP one subject has in
	// flight (parked ones included), and those of all clients without a
	// subject together; 0 means a quarter of the smaller of MaxInstances
	// and MaxConcurrentCalls, or no bound when neither is set. A call is
	// any request that runs a guest: tools/call, prompts/get,
	// resources/read of a plugin's resource, completion/complete. Past it
	// a call is refused with CodeBusy (retry), so that one tenant's busy
	// calls never hold every instance.
	MaxCallsPerSubject int
	// CallsPerSecondPerSubject bounds the rate of one subject's calls
	// over HTTP (as MaxCallsPerSubject counts them), and of all clients
	// without a subject together, with a burst of as many; 0 means no
	// bound. Past it a call is refused with CodeBusy (retry).
	CallsPerSecondPerSubject float64
	// StoreBytesPerRecord, StoreBytesPerTenant and StoreBytesTotal bound
	// the bytes the state store holds for one session, for one subject's
	// sessions (and all sessions without a subject together), and for
	// all; 0 means [DefaultStoreBytesPerRecord] (64 MiB),
	// [DefaultStoreBytesPerTenant] (128 MiB) and [DefaultStoreBytesTotal]
	// (768 MiB). A session's MCP record (its initialize parameters) is
	// bounded to 256 KiB. A write past a budget is refused
	// ([ErrStoreBudget]): the state stays in this replica's memory only.
	// With a store that replicas share (Redis), the per-subject and total
	// budgets are counted in the store, over every replica's writes, and
	// must be the same on every replica.
	StoreBytesPerRecord, StoreBytesPerTenant, StoreBytesTotal int
	// Tenants says that requests carry authenticated subjects (per-subject
	// tokens or OAuth are configured): each subject, and all clients
	// without one together, then get the shares of the bounds that
	// MaxHandlesPerSubject, MaxParkedPerSubject, MaxCallsPerSubject,
	// MaxAnonymousTasks and StoreBytesPerTenant describe. Without it every
	// client is the same one tenant and no share applies: the bounds are
	// all everyone's.
	Tenants bool
	// PluginAccess says, per plugin name, who may list and use its tools,
	// prompts and resources (see [AccessRule]); a plugin it does not name
	// is everyone's. With any rule, list results go out with cacheScope
	// "private". [Host.SetPluginAccess] replaces them.
	PluginAccess map[string]AccessRule
	// PoolSize bounds the warm instances kept per stateless plugin; 0
	// means twice GOMAXPROCS.
	PoolSize int
	// ClientKeyHeader names an HTTP request header that identifies a
	// client on sessionless requests (protocol 2026-07-28 over HTTP has no
	// session): requests with the same value share instances, as a session
	// does, and no session handle is minted. Without it, sessionless
	// requests are keyed by session handles (see [SessionArgument]). The
	// header is not authentication: anyone who sends the same value gets
	// the same guest state.
	ClientKeyHeader string
	// DeriveSessionHeader fills in a 2026-07-28 tools/call's missing
	// Mcp-Param-Wasmtools-Session header from its session argument before
	// the transport checks headers against the body (see
	// deriveSessionHeader). Off by default: MCP 2026-07-28 has a server
	// refuse a request without a header its tool's schema requires (the
	// conformance suite's http-custom-header-server-validation). On, a
	// go-sdk v1.8.0 client whose tool cache a list_changed dropped still
	// reaches its handle's state instead of an HTTP 400 it does not
	// recover from; a header that is present is still checked.
	DeriveSessionHeader bool
	// MaxHandles bounds the open session handles; 0 means
	// [sessions.DefaultMaxHandles] (1,000). Minting one past it ends an
	// idle handle, those never passed back first (its next call is told
	// it expired). A handle also ends after SessionTimeout unused. It
	// bounds the clients of ClientKeyHeader values too, counted apart:
	// a new value past it ends the least recently used idle one.
	MaxHandles int
	// MaxHandlesPerSubject is each subject's share of MaxHandles, and
	// that of all clients without a subject together; 0 means a quarter
	// of MaxHandles. Past its share, or past MaxHandles, a new handle ends
	// one of the same subject's idle handles, never another subject's;
	// with none idle it is refused. The clients of ClientKeyHeader values
	// have the same share, counted apart.
	MaxHandlesPerSubject int
	// MaxSessions bounds the open stateful HTTP sessions (Mcp-Session-Id,
	// protocols up to 2025-11-25); 0 means [DefaultMaxSessions] (4,096).
	// An initialize past it ends an idle session (one that made no
	// request since it opened first, then the least recently used), and
	// with none idle is refused with [CodeBusy]. A session also ends
	// after SessionTimeout idle, or when its client DELETEs it.
	MaxSessions int
	// MaxSessionsPerSubject is each tenant's share of MaxSessions (with
	// Tenants); 0 means a quarter of MaxSessions. Past its share a new
	// session ends one of the same tenant's idle sessions, never
	// another's; with none idle it is refused. Past MaxSessions alone,
	// the idle session ended is the tenant's own, else one of the tenant
	// holding the most (or the next largest with one idle).
	MaxSessionsPerSubject int
	// MaxSessionParamsBytes bounds what the open stateful HTTP sessions
	// keep of their initialize parameters, in all, each tenant a quarter
	// (with Tenants); 0 means [SessionParamsBytes].
	MaxSessionParamsBytes int
	// MaxStreamReplayBytes bounds the messages kept so that a client can
	// resume a lost stream, in all, each tenant a quarter (with
	// Tenants); 0 means [StreamReplayBytes].
	MaxStreamReplayBytes int
	// QuietHandles leaves out of every result the note that tells the
	// model the session handle it was given; QuietPlugins overrides it for
	// the plugins it names (true: no note; false: the note). The handle
	// is in the result's _meta either way, and a request that carries
	// _meta[MetaSession] (a client that passes handles itself) never gets
	// the note. [Host.SetHandleNotes] replaces both.
	QuietHandles bool
	QuietPlugins map[string]bool
	// AllowedOrigins are browser origins, besides the server's own, whose
	// cross-origin requests the HTTP handler accepts; others are refused.
	// Requests arriving on a loopback address with a non-loopback Host
	// header are refused whatever this says (DNS rebinding protection).
	AllowedOrigins []string
	// RecordLog, if set, receives one JSON line per tool call: time,
	// session, plugin name and sha256, tool, duration, isError and the
	// records the call wrote, one Write per line; and one line per
	// run-time grant asked for, given or refused ({"time", "session",
	// "plugin", "sha256", "tool", "grant": {"kind", "target", "mode"?,
	// "event", "how"}}). It is written under a
	// lock; the caller opens it (append-only), bounds its size (wasmtools
	// serve rotates it, see --record-log-max) and closes it after the
	// host.
	RecordLog io.Writer
	// StateKey signs the request state of calls parked for an answer and,
	// through keys derived from it, session handles (protocol
	// 2026-07-28). nil means a random key per host, so neither survives a
	// restart, which parked calls and guest state do not either.
	StateKey []byte
	// AbandonAfter stops a parked call whose client has not answered in
	// this long, and withdraws a question (elicitation, sampling, roots)
	// that a client before 2026-07-28 has not answered in this long (the
	// guest gets "cancel"); 0 means [DefaultAbandonAfter].
	AbandonAfter time.Duration
	// Loaded, if set, is closed once the plugins' first load is done: the
	// host serves at once, and until then a request that reads the
	// catalogue (a list, a call, a prompt, a resource) waits for it, up
	// to LoadWait (0 means [DefaultLoadWait]); a call of a tool not
	// served yet waits, within the same bound, until it is.
	Loaded   <-chan struct{}
	LoadWait time.Duration
	// Settled, if set, is closed once the first load has settled: every
	// plugin loaded, failed, or found slow (a start function or list
	// that spins; plugins.ReloaderOptions.SlowLoad). A list waits for
	// Loaded or Settled, whichever comes first, so that slow plugins
	// never hold a client's first list; they follow with list_changed. A
	// call of a tool not served yet still waits up to LoadWait for it.
	Settled <-chan struct{}
	// MaxParked bounds the calls parked for a 2026-07-28 client's answer
	// across all clients, and MaxParkedPerClient one client's; 0 means
	// 256 and 4. A question past either is answered "cancel" at once. At
	// the instance limits, the call that has waited longest for a person
	// is evicted (stopped, its instance reset) before a call is refused.
	MaxParked, MaxParkedPerClient int
	// MaxParkedPerSubject is each subject's share of MaxParked, and that
	// of all clients without a subject together; 0 means a quarter of
	// MaxParked. Past it a call that asks is refused as past MaxParked.
	MaxParkedPerSubject int
	// MaxParkedBytes bounds what the parked calls keep of their requests
	// across all clients: their arguments' bytes (a prompt's arguments, a
	// resource's URI) and their _meta at what it costs kept decoded (as
	// MaxMetaCost counts it), the request that started a call and the
	// retry it was last served on; 0 means DefaultMaxParkedBytes.
	// MaxParkedBytesPerSubject is each subject's share, and that of all
	// clients without a subject together; 0 means a quarter of
	// MaxParkedBytes. A question past either is answered "cancel" at
	// once, as past MaxParked; the bytes are given back when the call is
	// resumed, abandoned or evicted.
	MaxParkedBytes, MaxParkedBytesPerSubject int
	// MaxQuestions bounds the questions one call may ask a 2026-07-28
	// client; 0 means 9, since the go-sdk client makes at most 10 requests
	// of a call. A further question is answered "cancel" at once, with an
	// error the guest sees.
	MaxQuestions int
	// MaxGrantQuestions bounds the run-time grant questions one session
	// may be asked, across its plugins; 0 means DefaultMaxGrantQuestions.
	// [Host.SetMaxGrantQuestions] replaces it.
	MaxGrantQuestions int
	// MaxGrantSessions bounds the sessions whose run-time grant answers
	// are remembered, each tenant's a quarter of them (with Tenants);
	// past either, the oldest of the tenant holding the most are
	// forgotten, and that session is asked again. 0 means 4,096.
	MaxGrantSessions int
	// GrantFile, if set, keeps answers per subject across sessions and
	// restarts: the person is offered "always allow" besides the other
	// choices, and "deny" is kept there too, until revoked (`wasmtools
	// grants revoke`). A subject is the request's authenticated subject,
	// or "local" for a stdio (or in-memory) session; an HTTP session with
	// no subject is offered nothing that outlives it.
	GrantFile *grantstore.File
	// MaxTasksPerClient bounds the tasks (the Tasks extension, SEP-2663)
	// one client holds, running or finished, and MaxTasks those of all
	// clients; 0 means [DefaultMaxTasksPerClient] and [DefaultMaxTasks].
	// Past a bound the client's oldest finished task is forgotten, and
	// with none a new task is refused (CodeBusy). A client is its
	// authenticated subject, else its session, else its
	// ClientKeyHeader value; unauthenticated 2026-07-28 clients without
	// that header cannot be told apart and share one bound.
	//
	// Clients without a subject (no token, or the shared one) also share
	// one small pool, MaxAnonymousTasks (0: 2 × MaxTasksPerClient), so
	// that however many sessions they open they never fill MaxTasks for
	// the subjects; and a finished task is forgotten only to make room
	// for a task of the same client (the anonymous pool is one client
	// here).
	MaxTasksPerClient, MaxTasks int
	MaxAnonymousTasks           int
	// MaxTaskBytesPerClient bounds the bytes one client's tasks hold (a
	// running task its call's arguments and _meta, a finished one its
	// result); 0
	// means [DefaultMaxTaskBytesPerClient]. All clients' tasks hold at
	// most 128 MiB. Past either, as past a count, a new task is refused.
	MaxTaskBytesPerClient int
	// TaskTTL is how long a task is kept from its creation; 0 means
	// [DefaultTaskTTL]. A task still running then is cancelled (its guest
	// stopped, its instance reset) and forgotten.
	TaskTTL time.Duration
	// Replica names this process among replicas behind one proxy: session
	// IDs, session handles, request states and task IDs begin with
	// Replica + ".", so that a static proxy rule routes them. "" (the
	// default) means one process: no prefix. A name is 1 to 32 letters,
	// digits, '-' or '_'.
	Replica string
	// Store keeps sessions beyond this process: a stateful HTTP session,
	// a session handle or a client header's client, with its instances'
	// states, is taken over by whichever replica receives its next
	// request. nil (the default): sessions live in this process only.
	// Every replica sharing a store must share StateKey.
	Store statestore.Store
	// Checkpoint is when instances' states are written to Store:
	// [CheckpointAfterCall] (the default) or [CheckpointOnDrain].
	Checkpoint string
	// StoreTimeout bounds each exchange with Store; 0 means
	// [DefaultStoreTimeout] (1s). After an exchange that got no answer,
	// the store is not asked for 2s: calls go on from what this replica
	// holds, their results marked not saved ([MetaNotSaved]).
	StoreTimeout time.Duration
}

// Host serves plugins over MCP. It is safe for concurrent use. Close it to
// free every instance.
type Host struct {
	opts Options
	// access holds the access rules in force (Options.PluginAccess, then
	// SetPluginAccess's), read by every request.
	access atomic.Pointer[map[string]AccessRule]
	// notes and grantCap hold the handle note settings and the cap of
	// grant questions (plus one: 0 is unset) set by SetHandleNotes and
	// SetMaxGrantQuestions, once set (till then, Options').
	notes    atomic.Pointer[handleNotes]
	grantCap atomic.Int64
	// swapping is held by each swap of the catalogue, and by Close for a
	// moment, so that no swap retires into a session layer closing.
	swapping sync.Mutex
	log      *slog.Logger
	server   *mcp.Server // stdio, in-memory and stateful HTTP sessions
	modern   *mcp.Server // sessionless HTTP (2026-07-28): tools take a session handle
	metrics  *metrics
	src      *plugins.Reloader // the one writer of the catalogue
	ses      *sessions.Manager // every client's instances
	conns    sync.Map          // *mcp.ServerSession -> sessions.Key, for sessions watched until they end
	book     *sessionBook      // the stateful HTTP sessions open, bounded
	listens  *listenBook       // the 2026-07-28 listen streams open, bounded
	posts    sync.Map          // liveHeader token -> the HTTP request's context, while a tools/call POST is served
	bodies   sync.Map          // listenHeader token -> the listen's *heldBody, while its stream is open
	connID   atomic.Uint64     // labels of sessions with no ID
	// requests numbers the requests handed to v2 guests (their context's
	// id): the go-sdk keeps the JSON-RPC id to itself.
	requests atomic.Int64
	tokens   tokenCache // OAuth access tokens of plugins (hyper.go)
	// rootsPending has an entry while a roots notification is delivered
	// to a client's plugin; true when one more is due (hyper.go).
	rootsMu      sync.Mutex
	rootsPending map[rootsDelivery]bool

	// watchers holds the token of each session's resource
	// subscriptions, until the session ends (access.go).
	watchers sync.Map // *mcp.ServerSession -> *authInfo
	// subs is what each session subscribed to (subscriptions.go).
	subs subscriptions

	mu sync.Mutex
	// catalogue is what is registered on server: stored under mu, read
	// without it (Catalogue), as every request's access check reads it
	// and under many sessions mu was the host's most contended lock.
	catalogue  atomic.Pointer[plugins.Catalogue]
	registered *plugins.Catalogue // catalogue once its tools are registered
	// catChanged is closed and replaced when registered changes: stored
	// under mu, and read without it by a call's acquire.
	catChanged atomic.Pointer[chan struct{}]
	closed     bool
	stateKey   []byte
	// The keys derived from stateKey for session handles (handles.go).
	macs     *handleMACs
	auditMu  sync.Mutex
	budgetMu sync.Mutex
	budgets  map[budgetKey]*pluginBudget // budgetOf's
	// budgetSwept is when budgetOf last forgot the idle budgets.
	budgetSwept time.Time
	tasks       *taskStore
	wg          sync.WaitGroup  // session watchers
	dur         *durable.Keeper // nil without a state store
	drain       drainState
	stopBG      context.CancelFunc // stops the heartbeat
	// adoptMu: held for writing while a stateful session is taken over
	// (adopt.go), for reading while a new one is made, so that the
	// session ID of a takeover goes to it alone.
	adoptMu sync.RWMutex
	adoptID string // guarded by adoptMu
	boot    string // random at each start: names this process (replicas.go)
	grants  grantBook
	// takeovers paces each tenant's store reads of session IDs this
	// replica does not hold (takeovers.go).
	takeovers takeoverPace

	// parkedShares counts each tenant's parked calls (elicit.go),
	// callShares its calls in flight, rates its calls per second
	// (shares.go).
	parkedShares, callShares shares
	// parkedBytes counts the bytes parked calls keep, in all and by
	// tenant (elicit.go).
	parkedBytes byteShares
	// held the instances its calls in flight hold, and their memory
	// (pluginShares).
	held heldInstances
	// storeBytes counts the state store's bytes by tenant (shares.go);
	// nil without a store.
	storeBytes *storeBudget
	rateMu     sync.Mutex
	rates      map[string]*rate.Limiter
	// urls are the URL elicitations issued, for their completions
	// (urlelicit.go).
	urls issuedURLs
	// asks are the questions asked of clients before 2026-07-28 and not
	// answered yet: Close and Drain withdraw them (see asking).
	asks asking
}

// New returns a host serving the catalogue of src, and following its
// changes: src's reloads and its guests' relists (see
// [plugins.Reloader.Relist]) are applied in the order src makes them. The
// host takes src's OnSwap, and with it the plugins a swap retires; src
// keeps the plugins it serves, and the caller closes src after the host.
// For a fixed catalogue, pass [plugins.NewStatic].
func New(src *plugins.Reloader, opts *Options) *Host {
	h := &Host{
		src:     src,
		metrics: newMetrics(),
	}
	h.catChanged.Store(new(make(chan struct{})))
	if opts != nil {
		h.opts = *opts
	}
	if len(h.opts.PluginAccess) > 0 {
		h.SetPluginAccess(h.opts.PluginAccess)
	}
	h.stateKey = h.opts.StateKey
	if len(h.stateKey) == 0 {
		h.stateKey = make([]byte, 32)
		rand.Read(h.stateKey)
	}
	h.macs = newHandleMACs(h.stateKey)
	h.grants.max = h.opts.MaxGrantSessions
	h.log = h.opts.Logger
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	var idle time.Duration
	if t := h.sessionTimeout(); t > 0 {
		idle = t
	}
	h.ses = sessions.New(&sessions.Options{
		Logger: h.log, Observer: h.metrics,
		QueueLimit:   h.opts.QueueLimit,
		MaxInstances: h.opts.MaxInstances, MaxInstancesPerPlugin: h.opts.MaxInstancesPerPlugin,
		InstanceLimits: h.opts.InstanceLimits, MemoryBudget: h.opts.MemoryBudget,
		MaxConcurrentCalls: h.opts.MaxConcurrentCalls, PoolSize: h.opts.PoolSize, Tenant: requestTenant,
		Waits:       waitsForPerson,
		IdleTimeout: idle,
		MaxParked:   h.opts.MaxParked, MaxParkedPerClient: h.opts.MaxParkedPerClient,
		MaxHandles: h.opts.MaxHandles, MaxClients: cmp.Or(h.opts.MaxHandles, sessions.DefaultMaxHandles), MaxClientsPerGroup: h.handleShare(),
		Saved: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, bool) {
			return h.dur.Saved(ctx, key, p)
		},
		Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
			return h.dur.Stored(ctx, key, p)
		},
		StoredAfterCancel: h.opts.Store != nil && cmp.Or(h.opts.Checkpoint, CheckpointAfterCall) == CheckpointAfterCall,
		Ended:             h.clientEnded,
	})
	h.grants.clientOf = h.ses.ClientNumber
	h.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wasmtools_session_handles", Help: "Session handles of 2026-07-28 clients open now.",
	}, func() float64 { return float64(h.ses.Stats().Handles) }))
	h.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wasmtools_parked_calls", Help: "Calls parked for a 2026-07-28 client's answer now.",
	}, func() float64 { return float64(h.ses.Stats().Parked) }))
	h.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wasmtools_parked_bytes", Help: "What the parked calls keep of their requests now, in bytes (the bound is Options.MaxParkedBytes).",
	}, func() float64 { return float64(h.parkedBytes.sum()) }))
	h.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wasmtools_tasks", Help: "Tasks held now (running, waiting for input, or finished and not yet forgotten).",
	}, func() float64 {
		if h.tasks == nil {
			return 0
		}
		return float64(h.tasks.count())
	}))
	name, version := h.opts.Name, h.opts.Version
	if name == "" {
		name = "wasmtools"
	}
	if version == "" {
		version = "dev"
	}
	h.tasks = newTaskStore(h)
	h.boot = h.tasks.boot
	var bg context.Context
	bg, h.stopBG = context.WithCancel(context.Background())
	if h.opts.Store != nil {
		h.storeBytes = newStoreBudget(h.opts.StoreBytesPerRecord, h.opts.StoreBytesPerTenant, h.opts.StoreBytesTotal, h.opts.Tenants)
		h.storeBytes.shared = statestore.Counts(h.opts.Store)
		h.dur = newDurable(h)
		h.grants.onChange = h.dur.GrantsChanged
		h.wg.Add(1)
		go func() { defer h.wg.Done(); h.dur.Heartbeat(bg) }()
	}
	h.book = newSessionBook(&h.opts)
	h.listens = newListenBook(&h.opts)
	h.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wasmtools_http_sessions", Help: "Stateful HTTP sessions (Mcp-Session-Id) open now.",
	}, func() float64 { return float64(h.book.count()) }))
	h.server = h.newServer(name, version)
	h.modern = h.newServer(name, version)
	// The catalogue served now, then every change, in src's order.
	src.Follow(func(_ context.Context, s plugins.Swap) { h.swap(s) })
	return h
}

// newServer makes an MCP server of the host. The host runs two, which
// serve the same catalogue and differ only in the tools' input schemas:
// the one for sessionless requests adds the session argument to the tools
// of plugins that keep state (see [SessionArgument]); the other serves
// clients that have a session, for which a handle would be noise in the
// model's context.
func (h *Host) newServer(name, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: name, Version: version}, &mcp.ServerOptions{
		// Tools are advertised with listChanged even when no plugin is
		// loaded yet: the catalogue can change under a live session.
		Capabilities: &mcp.ServerCapabilities{
			Tools:       &mcp.ToolCapabilities{ListChanged: true},
			Prompts:     &mcp.PromptCapabilities{ListChanged: true},
			Resources:   &mcp.ResourceCapabilities{ListChanged: true, Subscribe: true},
			Completions: &mcp.CompletionCapabilities{},
			Logging:     &mcp.LoggingCapabilities{},
			Extensions:  map[string]any{TasksExtension: map[string]any{}},
		},
		CompletionHandler: func(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
			return h.complete(ctx, req)
		},
		// The SDK keeps the subscriptions; plugins say what changed with
		// notify_resource_updated. subscriptionsMiddleware bounds them
		// and undoes a session's at its end. With access rules,
		// accessMiddleware refuses what a subject may not watch, and
		// watchFilter drops what it may no longer.
		SubscribeHandler:   func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler: func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		RootsListChangedHandler: func(_ context.Context, req *mcp.RootsListChangedRequest) {
			h.rootsChanged(req)
		},
		Logger:       h.sdkLogger("mcp"),
		GetSessionID: h.newSessionID,
		SetCacheable: h.setCacheable,
	})
	// Innermost, so that its next is the go-sdk's own handler, which it
	// calls again to unsubscribe a session that ended.
	s.AddReceivingMiddleware(h.subscriptionsMiddleware)
	s.AddReceivingMiddleware(keepEmptyText)
	// Inside every check (waitForLoad, access, tasks): only an initialize
	// they let through makes a record.
	s.AddReceivingMiddleware(h.keepNewSession)
	// Outside keepNewSession: an initialize past the session bounds is
	// refused before it makes a record.
	s.AddReceivingMiddleware(h.bookSessions)
	s.AddReceivingMiddleware(h.taskMiddleware)
	s.AddReceivingMiddleware(h.accessMiddleware)
	// Outside the access check: a request that arrived before the first
	// load is checked against the catalogue it waited for, not the empty
	// one, which knows no tool to refuse.
	if h.opts.Loaded != nil {
		s.AddReceivingMiddleware(h.waitForLoad)
	}
	// Outside the checks and tasks: nothing of a request over it is kept.
	s.AddReceivingMiddleware(metaBound)
	// The trace span last: each middleware added wraps those before it,
	// so this one is outermost and its span covers the rest.
	s.AddReceivingMiddleware(h.traceMiddleware)
	s.AddSendingMiddleware(traceSending)
	s.AddSendingMiddleware(h.watchFilter)
	h.addTaskMethods(s)
	return s
}

// servers are both MCP servers, for what they share.
func (h *Host) servers() [2]*mcp.Server { return [2]*mcp.Server{h.server, h.modern} }

func (h *Host) sessionTimeout() time.Duration {
	switch t := h.opts.SessionTimeout; {
	case t == 0:
		return DefaultSessionTimeout
	case t < 0:
		return 0
	default:
		return t
	}
}

// Server returns the MCP server, to run on a transport:
//
//	err := h.Server().Run(ctx, &mcp.StdioTransport{})
func (h *Host) Server() *mcp.Server { return h.server }

// Catalogue returns the catalogue being served.
func (h *Host) Catalogue() *plugins.Catalogue {
	return h.catalogue.Load()
}

// setCatalogue registers cat on the MCP server and returns the catalogue
// it replaces. Tools that are gone are removed, new and changed ones are
// (re)registered, and the SDK tells clients with list_changed
// notifications. Only src's swaps call it, in order.
func (h *Host) setCatalogue(cat *plugins.Catalogue) *plugins.Catalogue {
	h.mu.Lock()
	old := h.catalogue.Swap(cat)
	h.mu.Unlock()
	// Waiters (see waitForLoad) look again once the server serves cat.
	defer func() {
		h.mu.Lock()
		h.registered = cat
		close(*h.catChanged.Load())
		h.catChanged.Store(new(make(chan struct{})))
		h.mu.Unlock()
	}()
	var gone []string
	if old != nil {
		for _, t := range old.Tools() {
			if cat == nil {
				gone = append(gone, t.Name)
			} else if _, ok := cat.Tool(t.Name); !ok {
				gone = append(gone, t.Name)
			}
		}
	}
	if len(gone) > 0 {
		for _, s := range h.servers() {
			s.RemoveTools(gone...)
		}
	}
	h.setPrompts(old, cat)
	if cat != nil {
		for _, t := range cat.Tools() {
			if old != nil {
				if prev, ok := old.Tool(t.Name); ok && prev == t {
					continue
				}
			}
			handler := h.handler(t)
			h.server.AddTool(mcpTool(t), handler)
			h.modern.AddTool(h.modernTool(t), handler)
		}
	}
	return old
}

// modernTool is t as served to sessionless clients: with the session
// argument in its input schema when its plugin keeps state, or may ask
// the person for grants (whose answers are the session's: toolClient).
func (h *Host) modernTool(t *plugins.Tool) *mcp.Tool {
	mt := mcpTool(t)
	if t.Plugin().Stateless() && !t.Plugin().Asks() {
		return mt
	}
	schema, err := withSessionArgument(t.Def.InputSchema)
	if err != nil {
		// Not an object schema (the plugin's load checked it compiles):
		// served as it is, so its calls get a new handle each.
		h.log.Warn("tool served without the session argument", "tool", t.Name, "error", err)
		return mt
	}
	mt.InputSchema = schema
	return mt
}

func mcpTool(t *plugins.Tool) *mcp.Tool {
	mt := &mcp.Tool{
		Name:        t.Name,
		Title:       t.Def.Title,
		Description: t.Def.Description,
		InputSchema: t.Def.InputSchema,
	}
	if len(t.Def.OutputSchema) > 0 {
		mt.OutputSchema = t.Def.OutputSchema
	}
	if len(t.Def.Annotations) > 0 {
		var a mcp.ToolAnnotations
		if json.Unmarshal(t.Def.Annotations, &a) == nil {
			mt.Annotations = &a
		}
	}
	return mt
}

// HTTPHandler returns a streamable HTTP handler for the host, to mount at
// the MCP endpoint (wasmtools mounts it at /mcp). It serves both protocol
// eras on one endpoint: requests of protocol 2026-07-28 or later (by their
// Mcp-Protocol-Version header) go to the go-sdk's stateless transport,
// which that era requires, and the rest to its stateful transport, where
// each session (Mcp-Session-Id) gets its own plugin instances. Sessionless
// requests are keyed by session handles (see [SessionArgument]), or by
// [Options.ClientKeyHeader].
func (h *Host) HTTPHandler() http.Handler {
	legacy := func(*http.Request) *mcp.Server { return h.server }
	modern := func(*http.Request) *mcp.Server { return h.modern }
	cop := http.NewCrossOriginProtection()
	for _, o := range h.opts.AllowedOrigins {
		if err := cop.AddTrustedOrigin(o); err != nil {
			h.log.Error("allowed origin ignored", "origin", o, "error", err)
		}
	}
	// Sessions' streams (protocols up to 2025-11-25) are resumable: each
	// SSE stream opens with a priming event, and a client that lost one
	// (or whose guest closed it, close_stream) reconnects with
	// Last-Event-ID and gets what it missed. The store is bounded in
	// total and, with tenants, per tenant (replayStore): a flood costs
	// its tenant's resumption first, never memory.
	events := newReplayStore(cmp.Or(h.opts.MaxStreamReplayBytes, StreamReplayBytes), h.opts.Tenants, func(ctx context.Context) string {
		if ti := auth.TokenInfoFromContext(ctx); ti != nil {
			return h.shareTenant(ti.UserID)
		}
		return h.shareTenant("")
	})
	stateful := mcp.NewStreamableHTTPHandler(legacy, &mcp.StreamableHTTPOptions{
		EventStore:            events,
		SessionTimeout:        h.sessionTimeout(),
		Logger:                h.sdkLogger("mcp-http"),
		CrossOriginProtection: cop,
	})
	stateless := mcp.NewStreamableHTTPHandler(modern, &mcp.StreamableHTTPOptions{
		Stateless: true,
		// A 2026-07-28 client cancels a request by closing its stream,
		// which the specification says a server must treat as
		// cancellation: the guest is stopped and its instance reset, as
		// notifications/cancelled does in the other era.
		PropagateRequestCancellation: true,
		Logger:                       h.sdkLogger("mcp-http"),
		CrossOriginProtection:        cop,
	})
	every := h.opts.StreamKeepAlive
	if every == 0 {
		every = DefaultStreamKeepAlive
	}
	// The long-lived streams' writes are queued, so that no client that
	// stops reading holds up whoever writes to it (keepAlive).
	queues := newStreamQueues(StreamQueueBytes, cmp.Or(h.opts.MaxStreamReplayBytes, StreamReplayBytes), h.opts.Tenants, func(r *http.Request) string {
		if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
			return h.shareTenant(ti.UserID)
		}
		return h.shareTenant("")
	})
	return keepAlive(every, cmp.Or(h.opts.StreamWriteTimeout, DefaultStreamWriteTimeout), queues, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The host's own headers, never a client's, whichever way the
		// request is served (serveStateful sets them on a stateful
		// session's tools/call): a client's resend digest was its
		// call's at-most-once key, of any length.
		r.Header.Del(resendHeader)
		r.Header.Del(liveHeader)
		r.Header.Del(listenHeader)
		switch {
		case listenRequest(r):
			// A 2026-07-28 client's stream of list changes, open until
			// it leaves: closed at a drain like a session's GET stream,
			// never waited for. (The go-sdk holds the header to the
			// body's method.)
			if h.drain.closing.Load() {
				refuse(w, "this replica is shutting down")
				return
			}
			var end func()
			r, end = h.trackStream(r)
			defer end()
			// The listen gives its body's count under the bound on
			// request bodies back once it is booked (listenBody).
			if held, ok := r.Context().Value(heldBodyKey{}).(*heldBody); ok {
				token := rand.Text()
				h.bodies.Store(token, held)
				defer h.bodies.Delete(token)
				r.Header.Set(listenHeader, token)
			}
		case r.Method == http.MethodPost:
			if !h.drain.enter() {
				refuse(w, "this replica is shutting down")
				return
			}
			defer h.drain.leave()
		}
		if v := r.Header.Get("Mcp-Protocol-Version"); v >= sessionlessProtocol && r.Header.Get("Mcp-Session-Id") == "" {
			if h.opts.DeriveSessionHeader {
				r = deriveSessionHeader(r)
			}
			switch {
			case h.drain.closing.Load():
				refuse(w, "this replica is shutting down")
			case h.drain.draining.Load() && r.Header.Get("Mcp-Param-"+SessionHeader) == "":
				refuse(w, "this replica is draining and takes no new sessions")
			case r.Method == http.MethodPost && h.handleElsewhere(r):
				refuse(w, storeAwayHere)
			default:
				if r.Method == http.MethodPost && !h.markProxyResend(w, r) {
					return
				}
				stateless.ServeHTTP(w, r)
			}
			return
		}
		h.serveStateful(stateful, events, w, r)
	}))
}

// StreamReplayBytes bounds the messages kept, across all HTTP sessions,
// so that a client that lost a stream can resume it (SEP-1699); with
// tenants each holds a quarter. Past it the oldest are dropped, the
// tenant's own first: a client resuming later than that misses them, and
// is told so.
const StreamReplayBytes = 8 << 20

// sessionlessProtocol is the first MCP revision without sessions.
const sessionlessProtocol = "2026-07-28"

// ErrClosed is returned for calls that arrive after [Host.Close].
var ErrClosed = sessions.ErrClosed

// Close frees every instance, waiting for calls in flight to finish until
// ctx ends; calls still running then free their instances when they end.
// Calls parked for a 2026-07-28 client's answer are stopped, and the MCP
// sessions still open are closed. New calls fail with [ErrClosed]. It is
// idempotent.
func (h *Host) Close(ctx context.Context) error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	h.mu.Unlock()
	// A swap under way finishes before the session layer closes; those
	// after see closed (see swap).
	h.swapping.Lock()
	h.swapping.Unlock()
	h.asks.withdraw()
	h.stopBG()
	h.tasks.closeAll()
	err := h.ses.Close(ctx)
	h.conns.Range(func(ss, _ any) bool {
		// Close waits for the session's handlers: a call still running
		// would hold this Close past ctx.
		go ss.(*mcp.ServerSession).Close()
		return true
	})
	done := make(chan struct{})
	go func() { h.wg.Wait(); h.dur.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		err = cmp.Or(err, fmt.Errorf("host: close: sessions still open: %w", ctx.Err()))
	}
	return err
}

// LiveInstancesByPlugin reports the live instances of each plugin name.
func (h *Host) LiveInstancesByPlugin() map[string]int { return h.ses.Stats().PerPlugin }

// LiveInstances reports how many plugin instances are live across all
// sessions.
func (h *Host) LiveInstances() int { return h.ses.Stats().Live }

// BusyInstances reports how many instances a call holds now (running a
// guest, or waiting for a person).
func (h *Host) BusyInstances() int { return h.ses.Stats().Leases }

// QueuedCalls reports how many calls wait for an instance that another
// call of their session holds.
func (h *Host) QueuedCalls() int { return h.ses.Stats().Queued }

// WaitStore waits until the host asks its state store again after the
// store failed to answer (its breaker, 2 s after the last such failure,
// refuses requests that need the store meanwhile), or until ctx ends. It
// returns at once when the breaker is closed or there is no store.
func (h *Host) WaitStore(ctx context.Context) error {
	if h.dur == nil {
		return nil
	}
	return h.dur.WaitStore(ctx)
}
