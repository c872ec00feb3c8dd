package host

// Durable sessions: with a state store ([Options.Store]), a client's
// session outlives the replica that served it. See docs/DESIGN.md,
// "Durable sessions across replicas", and docs/DEPLOY.md.
//
// A session's record in the store, under its store ID ("s.<Mcp-Session-Id>",
// "h.<handle id>" or "c.<digest of the client header>"), holds the
// session's MCP state (field "mcp": what a replica needs to take a stateful
// HTTP session over) and one field per plugin the client used ("p/NAME":
// the instance's saved state, or why it could not be saved). The replica
// that serves a session claims it; every write carries the claim's fence,
// so a replica that lost the session can no longer write (see package
// statestore).

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/plugins"
)

// Checkpoint policies ([Options.Checkpoint]).
const (
	// CheckpointAfterCall saves an instance's state after each call that
	// changed it, before the result is sent: a replica killed at any
	// moment loses no call a client was told succeeded.
	CheckpointAfterCall = "after-call"
	// CheckpointOnDrain saves states only when a replica drains (and when
	// a session's instance is idle at drain): cheaper per call, but a
	// replica killed without a drain loses what its clients did since.
	CheckpointOnDrain = "drain"
)

// MetaMoved-style refusals: the error of a call whose session another
// replica took over while it ran.
var errMoved = errors.New("the session moved to another replica while this call ran, and its effect was not kept: call the tool again")

// Heartbeat timing: a replica says it is alive every heartbeatEvery, for
// heartbeatTTL.
const (
	heartbeatTTL   = 6 * time.Second
	heartbeatEvery = 2 * time.Second
)

// durable keeps sessions in the store. It owns the claims of this
// replica: which sessions it serves, under which fence.
type durable struct {
	h      *Host
	store  statestore.Store
	owner  statestore.Owner
	policy string
	log    *slog.Logger

	downUntil atomic.Int64 // the breaker: Unix ns until which the store is not asked
	// keyChecked: the store's key check passed; keyBad: it failed (why),
	// and the replica is not ready.
	keyChecked atomic.Bool
	keyBad     atomic.Pointer[string]
	renewing   atomic.Bool // a renewAll round runs

	mu     sync.Mutex
	claims map[sessions.Key]*claim
	// users are the authenticated users of stateful sessions made and
	// not yet initialized, by session ID (at most maxPendingUsers).
	users map[string]string
	// adopted are the stateful sessions this replica took over from the
	// store (at most maxPendingUsers): never served afresh from memory.
	adopted map[string]bool
}

// adoptedHere notes that stateful session id was taken over from the
// store: it has a state there, so it is never served from memory before
// this replica's claim on it succeeded.
func (d *durable) adoptedHere(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.adopted) >= maxPendingUsers {
		for k := range d.adopted {
			delete(d.adopted, k)
			break
		}
	}
	d.adopted[id] = true
}

// wasAdopted reports whether key's stateful session was taken over here.
func (d *durable) wasAdopted(key sessions.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.adopted[key.ID()]
}

// maxPendingUsers bounds the sessions whose initialize was answered and
// whose initialized has not come: past it one is forgotten for each new one (its
// record names no user, and no one can take it over).
const maxPendingUsers = 4096

// madeBy records the user that made stateful session id.
func (d *durable) madeBy(id, user string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.users) >= maxPendingUsers {
		for k := range d.users { // map order: some entry, a cheap bound
			delete(d.users, k)
			break
		}
	}
	d.users[id] = user
}

// madeFor returns, once, the user that made session id.
func (d *durable) madeFor(id string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	user, ok := d.users[id]
	delete(d.users, id)
	return user, ok
}

// claim is this replica's claim on one session. Its writes take turns
// under mu; each names the fence it writes with (fence), and writes only
// the state of an instance started under the fence the session's
// instances were last seeded with (seeded): another holder served the
// session since an instance started under another, and what it holds is
// not the session's state any more.
type claim struct {
	id    string
	ready chan struct{} // closed once claimed (or failed)
	err   error

	mu     sync.Mutex // serialises the session's writes
	fence  uint64     // the fence to write with now
	seeded uint64     // the fence the session's instances are current under
	// dirty: a write failed without an answer (it may still land): the
	// fence is bumped before the next write, so that it never does.
	dirty bool
	saved map[string][sha256.Size]byte // digest of each field as last written
	// mcp is the "mcp" field as last written: written back when the
	// store lost the record.
	mcp []byte
	// unsaved says, by plugin name, why the last checkpoint of its
	// instance failed: its stored state is older than what the client
	// was told.
	unsaved map[string]string
	// done are the results kept for at-most-once calls, by plugin name
	// (see pluginRecord.Done).
	done map[string][]once
	// renewed is when the record's TTL was last renewed by this replica.
	renewed time.Time
	// stale: another replica served the session since this one's
	// instances started, and the record has not been read since.
	stale bool
	// verified is when this replica's claim was last confirmed by the
	// store (monotonic).
	verified time.Time
}

// memoryGrace is how long after its last verified claim a session may be
// served from what this replica holds when the store does not answer:
// long enough to ride out a blip, short enough that a replica that was
// stopped (SIGSTOP, a long GC pause, a frozen VM) or cut off from the
// store alone does not serve a session another replica took over
// meanwhile. Past it, the request is refused with -32053 until the store
// answers.
const memoryGrace = 2 * time.Second

// fresh reports whether c may be served from memory: its claim was
// verified within memoryGrace, and nothing since says it is stale.
func (c *claim) fresh() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.stale && !c.verified.IsZero() && time.Since(c.verified) < memoryGrace
}

func newDurable(h *Host) *durable {
	var boot [6]byte
	rand.Read(boot[:])
	d := &durable{
		h:       h,
		store:   bounded{Store: observed{Store: h.opts.Store, m: h.metrics}, d: cmp.Or(h.opts.StoreTimeout, DefaultStoreTimeout)},
		owner:   statestore.Owner{Replica: cmpOr(h.opts.Replica, "-"), Boot: hex.EncodeToString(boot[:])},
		policy:  cmpOr(h.opts.Checkpoint, CheckpointAfterCall),
		log:     h.log.With("component", "durable"),
		claims:  map[sessions.Key]*claim{},
		users:   map[string]string{},
		adopted: map[string]bool{},
	}
	return d
}

func newClaim(id string) *claim {
	return &claim{id: id, ready: make(chan struct{}), saved: map[string][sha256.Size]byte{}, unsaved: map[string]string{}, done: map[string][]once{}}
}

// Store bounds (see [Options.StoreTimeout]).
const (
	// DefaultStoreTimeout bounds one exchange with the store.
	DefaultStoreTimeout = time.Second
	// breakerWindow is how long the store is not asked after an exchange
	// failed for want of an answer: calls go on from memory meanwhile,
	// their results marked not saved, instead of each waiting out the
	// timeout.
	breakerWindow = 2 * time.Second
)

// timeout bounds one exchange with the store.
func (d *durable) timeout() time.Duration {
	return cmp.Or(d.h.opts.StoreTimeout, DefaultStoreTimeout)
}

// bounded is a store whose every exchange is bounded by a timeout
// (Options.StoreTimeout), whatever its caller's context allows.
type bounded struct {
	statestore.Store
	d time.Duration
}

func (b bounded) Heartbeat(ctx context.Context, o statestore.Owner, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Heartbeat(ctx, o, ttl)
}

func (b bounded) Leave(ctx context.Context, o statestore.Owner) error {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Leave(ctx, o)
}

func (b bounded) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Claim(ctx, id, o, ttl, steal)
}

func (b bounded) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Put(ctx, id, field, v, fence, ttl)
}

func (b bounded) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Renew(ctx, id, fence, ttl, bump)
}

func (b bounded) Get(ctx context.Context, id string) (map[string][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Get(ctx, id)
}

func (b bounded) Release(ctx context.Context, id string, fence uint64) error {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Release(ctx, id, fence)
}

func (b bounded) Delete(ctx context.Context, id string, fence uint64) error {
	ctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	return b.Store.Delete(ctx, id, fence)
}

// errStoreDown is the breaker's refusal: the store failed to answer a
// moment ago.
var errStoreDown = errors.New("state store unavailable (failing fast after a timeout)")

// open reports whether the breaker is open: the store is not asked.
func (d *durable) open() bool { return time.Now().UnixNano() < d.downUntil.Load() }

// observe trips the breaker on an error that says the store did not
// answer (not a refusal the store made).
func (d *durable) observe(err error) error {
	// A caller that went away (its client cancelled) says nothing of the
	// store.
	if err != nil && unanswered(err) && !errors.Is(err, context.Canceled) {
		d.downUntil.Store(time.Now().Add(breakerWindow).UnixNano())
	}
	return err
}

// unanswered reports whether err is a store that did not answer, rather
// than one that refused.
func unanswered(err error) bool {
	switch {
	case err == nil, errors.Is(err, statestore.ErrFenced), statestore.Lost(err),
		errors.Is(err, statestore.ErrNotFound), errors.Is(err, statestore.ErrTooLarge),
		errors.Is(err, statestore.ErrSeal), errors.Is(err, statestore.ErrHeld):
		return false
	}
	return true
}

// ttl is how long a session's record lives unused: the session timeout,
// or a day when sessions never time out.
func (d *durable) ttl() time.Duration {
	if t := d.h.sessionTimeout(); t > 0 {
		return t
	}
	return 24 * time.Hour
}

// heartbeat says this replica is alive until ctx ends, and drops the
// claims of clients the session layer no longer has.
func (d *durable) heartbeat(ctx context.Context) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		hctx, cancel := context.WithTimeout(ctx, heartbeatEvery)
		if err := d.store.Heartbeat(hctx, d.owner, heartbeatTTL); err != nil && ctx.Err() == nil {
			d.log.Warn("state store heartbeat", "error", err)
		}
		if !d.keyChecked.Load() && d.keyBad.Load() == nil {
			d.checkKey(hctx)
		}
		cancel()
		d.sweep()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkKey checks that this replica's state key opens what the store
// holds (see statestore.CheckKey). A mismatch makes the replica not ready
// for good, saying why in /readyz and the log; a store that cannot tell
// now is asked again at the next heartbeat.
func (d *durable) checkKey(ctx context.Context) {
	err := statestore.CheckKey(ctx, d.store)
	switch {
	case err == nil:
		d.keyChecked.Store(true)
		d.log.Info("state key checked: the store's values open with it")
	case errors.Is(err, statestore.ErrKeyMismatch):
		why := "the state store's values are sealed with another WASMTOOLS_STATE_KEY than this replica's: every replica sharing a store must share its state key"
		d.keyBad.Store(&why)
		d.log.Error("state key mismatch: this replica is not ready", "why", why)
	default:
		d.log.Warn("state store: key check", "error", err)
	}
}

// sweep forgets the claims of clients that ended in the session layer
// (handles ended idle or evicted: their records expire in the store).
func (d *durable) sweep() {
	live := map[sessions.Key]bool{}
	for _, k := range d.h.ses.Keys() {
		live[k] = true
	}
	var stale []*claimOf
	d.mu.Lock()
	for k, c := range d.claims {
		select {
		case <-c.ready:
			if !live[k] {
				delete(d.claims, k)
			} else if c.err == nil {
				stale = append(stale, &claimOf{k, c})
			}
		default:
		}
	}
	d.mu.Unlock()
	// Live sessions keep their records, whatever keeps them alive (pings,
	// a person answering, a task): renewed every third of their TTL. A
	// session whose last checkpoint failed is saved again. Off the
	// heartbeat's goroutine (it may wait for a busy instance), one round
	// at a time.
	if len(stale) == 0 || !d.renewing.CompareAndSwap(false, true) {
		return
	}
	d.h.wg.Add(1)
	go func() {
		defer d.h.wg.Done()
		defer d.renewing.Store(false)
		d.renewAll(stale)
	}()
}

// renewAll renews the records of live sessions whose TTL is a third
// gone, and saves again what failed to save.
func (d *durable) renewAll(stale []*claimOf) {
	now := time.Now()
	for _, kc := range stale {
		c := kc.c
		c.mu.Lock()
		due := now.Sub(c.renewed) > d.ttl()/3
		unsaved := len(c.unsaved) > 0
		c.mu.Unlock()
		if due {
			d.renew(c)
		}
		if unsaved && !d.open() {
			d.resave(kc.key, c)
		}
	}
}

// claimOf is a claim and its key.
type claimOf struct {
	key sessions.Key
	c   *claim
}

// resave writes again the states of key's instances whose last
// checkpoint failed.
func (d *durable) resave(key sessions.Key, c *claim) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*d.timeout())
	defer cancel()
	d.h.ses.Instances(ctx, key, func(name string, inst *plugins.Instance, fence uint64) error {
		c.mu.Lock()
		why := c.unsaved[name]
		c.mu.Unlock()
		if why == "" || why == notSavedTooLarge || why == notSavedUnsnapshot {
			return nil
		}
		if _, err := d.checkpoint(ctx, c, inst.Plugin(), inst, fence, nil); err != nil {
			return err
		}
		d.log.Info("state saved again after a failed checkpoint", "session", key.String(), "plugin", name)
		return nil
	})
}

// storeID is key's ID in the store, "" for a key that cannot outlive its
// process (stdio and in-memory sessions, sessionless requests without a
// handle).
func storeID(key sessions.Key) string {
	switch key.Kind() {
	case sessions.KindConn:
		if id := key.ID(); id != "" && !strings.HasPrefix(id, localPrefix) {
			return "s." + id
		}
	case sessions.KindHandle:
		return "h." + key.ID()
	case sessions.KindClient:
		sum := sha256.Sum256([]byte(key.ID()))
		return "c." + hex.EncodeToString(sum[:16])
	}
	return ""
}

// sessionRecord is the "mcp" field: what a replica needs to take over a
// stateful HTTP session.
type sessionRecord struct {
	Initialize *mcp.InitializeParams `json:"initialize,omitempty"`
	// Subject is the keyed digest of the authenticated user the session
	// is bound to ("-" for none, as in handles): only that user's
	// requests take it over.
	Subject string `json:"subject,omitempty"`
}

// newSession is a stateful session being made, whose record ensure
// writes.
type newSession struct {
	ss      *mcp.ServerSession
	subject string // subjectTag of its authenticated user
}

// pluginRecord is a "p/NAME" field.
type pluginRecord struct {
	// Host, SHA256 and Data are a plugins.State.
	Host   bool   `json:"host,omitempty"`
	SHA256 string `json:"sha256"`
	Data   []byte `json:"data,omitempty"`
	// Lost says why the state could not be saved (the plugin cannot be
	// snapshotted): a replica that takes the session over tells the
	// client its state was reset.
	Lost string `json:"lost,omitempty"`
	// Done are the results of the plugin's last calls that carried an
	// at-most-once key, oldest first (at most maxOnce, maxOnceBytes).
	Done []once `json:"done,omitempty"`
}

// once is a call's first result, under its at-most-once key.
type once struct {
	Key    string          `json:"key"`
	Result json.RawMessage `json:"result"`
}

// Bounds of the results kept per plugin for at-most-once calls.
const (
	maxOnce      = 8
	maxOnceBytes = 32 << 10
	maxResends   = 2
)

// remember adds first to the results kept for plugin, within the bounds
// (a result over maxOnceBytes is kept as a refusal to run again). c.mu is
// held.
func (c *claim) remember(plugin string, first *once) {
	if first == nil {
		return
	}
	if len(first.Result) > maxOnceBytes {
		b, _ := json.Marshal(errorResult("this call completed before, and its result was too large to keep: it was not run again"))
		first = &once{Key: first.Key, Result: b}
	}
	list := append(c.done[plugin], *first)
	// Newest first: within the bounds, and at most maxResends results of
	// resends (a proxy resends only the calls in flight when a replica
	// died: the last ones), so that keyless calls cost little.
	kept := make([]once, 0, len(list))
	size, resends := 0, 0
	for i := len(list) - 1; i >= 0 && len(kept) < maxOnce; i-- {
		o := list[i]
		if strings.HasPrefix(o.Key, "r:") {
			if resends == maxResends {
				continue
			}
			resends++
		}
		if size += len(o.Result); size > maxOnceBytes {
			break
		}
		kept = append(kept, o)
	}
	slices.Reverse(kept)
	c.done[plugin] = kept
}

// replay returns the first result of the call with at-most-once key k
// in c's session, or nil.
func (d *durable) replay(c *claim, k string) *mcp.CallToolResult {
	if d == nil || c == nil || k == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, list := range c.done {
		for _, o := range list {
			if o.Key == k {
				var res mcp.CallToolResult
				if json.Unmarshal(o.Result, &res) != nil {
					return nil
				}
				if res.Content == nil {
					res.Content = []mcp.Content{}
				}
				return &res
			}
		}
	}
	return nil
}

// ensure claims key's session for this replica before a request runs on
// it (ns: the stateful session being made, whose record is written). The
// first time this replica serves the session, or when another replica
// served it since (the claim's fence moved), the store's record (if any)
// is read after the claim and seeds the key's client: its instances'
// states, and a handle's client is opened; instances of the old fence are
// retired. It returns nil for a key that is not kept, and for a handle
// the store does not know either (the caller refuses it). An error
// matching ErrStateUnavailable means the session's state could not be
// read or verified now: the request is refused, to be retried.
func (d *durable) ensure(ctx context.Context, key sessions.Key, ns *newSession) (*claim, error) {
	if d == nil {
		return nil, nil
	}
	id := storeID(key)
	if id == "" {
		return nil, nil
	}
	// A claim, a read, a write: a few exchanges, each bounded by the
	// store's client too.
	ctx, cancel := context.WithTimeout(ctx, 4*d.timeout())
	defer cancel()
	d.mu.Lock()
	c := d.claims[key]
	if c == nil {
		c = newClaim(id)
		d.claims[key] = c
		d.mu.Unlock()
		kept, err := d.take(ctx, key, ns, c)
		if err != nil || !kept {
			c.err = cmp.Or(err, errNotKept)
			d.mu.Lock()
			delete(d.claims, key) // the next request tries again
			d.mu.Unlock()
		}
		close(c.ready)
		if !kept && err == nil {
			return nil, nil
		}
		return c, err
	}
	d.mu.Unlock()
	select {
	case <-c.ready:
	case <-ctx.Done():
		return nil, unavailable(ctx.Err())
	}
	if errors.Is(c.err, errNotKept) {
		return nil, nil
	}
	if c.err != nil {
		return nil, c.err
	}
	return c, d.verify(ctx, key, c)
}

// unavailable wraps a store's failure as ErrStateUnavailable.
func unavailable(err error) error {
	if errors.Is(err, ErrStateUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStateUnavailable, err)
}

// claimOrLog is ensure for a call. With the store unreachable, a session
// this replica holds, whose claim it verified within memoryGrace, is
// served from what it holds (the call's result is marked not saved); any
// other is refused with ErrStateUnavailable, never served afresh over a
// state the store may hold, nor from an instance that may be stale.
func (d *durable) claimOrLog(ctx context.Context, key sessions.Key) (c *claim, err error) {
	if err := ctx.Err(); err != nil {
		// The client is gone (a request that waited in a stopped
		// process): nothing runs, so nothing resets a stored state.
		return nil, err
	}
	c, err = d.ensure(ctx, key, nil)
	if err == nil || !unanswered(err) || ctx.Err() != nil || errors.Is(err, errChanged) {
		return c, err
	}
	held := c != nil && c.err == nil
	switch {
	case held && !c.fresh():
		// Not verified lately: another replica may have taken the
		// session over meanwhile (this process was stopped, or cut off
		// from the store alone), so what it holds may be stale.
		return nil, err
	case !held && (key.Kind() != sessions.KindConn || d.h.ses.Fence(key) != 0 || d.wasAdopted(key)):
		// Served from memory only what this replica holds, or a
		// stateful session made here that was never claimed (the store
		// was away when it began). A client header's or handle's
		// session seen here first may have a state in the store, which
		// a fresh instance must not shadow; a session whose claim this
		// replica lost (another replica took it over) holds stale
		// instances.
		return nil, err
	}
	d.log.Warn("state store unavailable: serving the session from this replica, not saved", "session", key.String(), "error", err)
	return nil, errServedFromMemory
}

// errServedFromMemory: the session's claim could not be verified (the
// store did not answer), and the call runs on what this replica holds;
// its result is marked not saved.
var errServedFromMemory = errors.New("served from memory")

// errChanged: another replica served the session since this one last
// did, and its record could not be read: what this replica holds is
// stale, and the request is refused rather than served from it.
var errChanged = errors.New("the session was served by another replica since")

// errNotKept marks a claim given up: a handle the store does not know.
var errNotKept = errors.New("session not kept")

// take claims the session for the first time and then, if the store has
// it, seeds key's client from what the store holds after the claim (a
// write acknowledged by the previous holder before it is the newest
// state, and later writes of it are fenced). kept is false for a handle
// that neither this replica nor the store knows.
func (d *durable) take(ctx context.Context, key sessions.Key, ns *newSession, c *claim) (kept bool, err error) {
	ctx, span := telemetry.Start(ctx, "wasmtools.takeover")
	defer func() { telemetry.End(span, err) }()
	if d.open() {
		return false, unavailable(errStoreDown)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	asked := time.Now() // before the claim: a pause after it shortens the grace, never lengthens it
	cl, err := d.claim(ctx, key, c)
	if err != nil {
		return false, unavailable(err)
	}
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return false, unavailable(d.observe(fmt.Errorf("state store: read session: %w", err)))
	}
	if rec == nil && key.Kind() == sessions.KindHandle && !d.h.ses.Has(key) {
		return false, nil
	}
	c.fence = cl.Fence
	c.verified = asked
	if err := d.seed(key, c, rec, cl.Fence); err != nil {
		return false, err
	}
	if b, ok := rec["mcp"]; ok {
		c.mcp = b
	}
	switch {
	case ns != nil && ns.ss.InitializeParams() != nil:
		b, _ := json.Marshal(sessionRecord{Initialize: ns.ss.InitializeParams(), Subject: ns.subject})
		c.mcp = b
		err = d.putLocked(ctx, c, "mcp", b)
	case rec == nil:
		// A record, so that a replica taking the session over knows it.
		c.mcp = []byte(`{}`)
		err = d.putLocked(ctx, c, "mcp", c.mcp)
	}
	if err != nil {
		return false, unavailable(err)
	}
	return true, nil
}

// claim takes the session for this replica. The request reached this
// replica, so the proxy routes the session here now: it is taken even
// from a live holder, whose later writes are fenced. c.mu is held; c's
// fence is not changed (the caller adopts the new one once it has read
// what it vouches for).
func (d *durable) claim(ctx context.Context, key sessions.Key, c *claim) (statestore.Claim, error) {
	cl, err := d.store.Claim(ctx, c.id, d.owner, d.ttl(), true)
	if err != nil {
		return cl, d.observe(fmt.Errorf("state store: claim session: %w", err))
	}
	if cl.Previous != (statestore.Owner{}) {
		d.log.Info("session taken over", "session", key.String(), "from", cl.Previous.Replica, "holderAlive", cl.PreviousAlive, "fence", cl.Fence)
	}
	return cl, nil
}

// verify checks, before a request runs, that this replica still holds
// the session it claimed. If another replica served the session since,
// what this replica holds is stale: the store's record is read again and
// seeds the client under the new fence, retiring every instance of the
// old one. If the store lost the record (it came back empty, or the
// record expired) and no one else held the session, what this replica
// holds is the newest state: it is written back under the new fence.
// The new fence is adopted only once the record was read.
func (d *durable) verify(ctx context.Context, key sessions.Key, c *claim) error {
	if d.open() {
		return unavailable(errStoreDown)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	asked := time.Now() // before the claim: a pause after it shortens the grace, never lengthens it
	cl, err := d.claim(ctx, key, c)
	if err != nil {
		return unavailable(err)
	}
	if cl.Fence == c.fence {
		c.renewed, c.verified = asked, asked // a claim renews the record
		return nil
	}
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		// What this replica holds is stale: never served from memory,
		// until the record is read.
		c.stale = true
		return unavailable(fmt.Errorf("%w: %w", errChanged, d.observe(fmt.Errorf("state store: read session: %w", err))))
	}
	c.stale = false
	c.verified = asked
	if cl.Previous == (statestore.Owner{}) && !hasPlugins(rec) {
		return d.recover(ctx, key, c, cl.Fence)
	}
	clear(c.saved)
	clear(c.unsaved)
	clear(c.done)
	c.fence = cl.Fence
	if b, ok := rec["mcp"]; ok {
		c.mcp = b
	}
	return d.seed(key, c, rec, cl.Fence)
}

// hasPlugins reports whether rec holds any plugin's state.
func hasPlugins(rec map[string][]byte) bool {
	for f := range rec {
		if strings.HasPrefix(f, "p/") {
			return true
		}
	}
	return false
}

// recover writes back what this replica holds of a session whose record
// the store lost, under fence (this replica's new claim): the session's
// MCP record now, its instances' states in the background. A plugin whose
// state was in the store but whose instance this replica no longer holds
// is lost: its next instance starts afresh, and the client is told (a
// reset with reason "store-lost"). c.mu is held.
func (d *durable) recover(ctx context.Context, key sessions.Key, c *claim, fence uint64) error {
	d.log.Warn("state store lost the session's record: writing back what this replica holds", "session", key.String(), "epochChanged", statestore.Epoch(fence) != statestore.Epoch(c.fence))
	d.h.metrics.storeLost.Inc()
	lost := map[string]sessions.Seed{}
	for field := range c.saved {
		if name, ok := strings.CutPrefix(field, "p/"); ok && !d.h.ses.Holds(key, name) {
			lost[name] = sessions.Seed{Lost: "the state store lost this session's saved state", Reason: ReasonStoreLost}
		}
	}
	clear(c.saved)
	c.fence = fence
	c.dirty = false
	if len(lost) > 0 {
		if err := d.h.ses.Seed(key, lost, c.seeded); err != nil {
			return err
		}
	}
	if err := d.putLocked(ctx, c, "mcp", mcpOr(c.mcp)); err != nil {
		return unavailable(err)
	}
	d.h.wg.Add(1)
	go func() {
		defer d.h.wg.Done()
		rctx, cancel := context.WithTimeout(context.Background(), 10*d.timeout())
		defer cancel()
		err := d.h.ses.Instances(rctx, key, func(name string, inst *plugins.Instance, f uint64) error {
			_, err := d.checkpoint(rctx, c, inst.Plugin(), inst, f, nil)
			return err
		})
		if err != nil {
			d.log.Warn("state store: writing back a lost session", "session", key.String(), "error", err)
		}
	}()
	return nil
}

// ReasonStoreLost is the stateReset reason of a plugin's state that the
// state store lost (it came back empty, or evicted the record) while no
// replica held its instance.
const ReasonStoreLost = "store-lost"

// seed gives key's client the instance states of rec (nil: none, the
// session's states are new), under fence: instances of another fence are
// retired. c.mu is held.
func (d *durable) seed(key sessions.Key, c *claim, rec map[string][]byte, fence uint64) error {
	seeds := map[string]sessions.Seed{}
	for field, v := range rec {
		name, ok := strings.CutPrefix(field, "p/")
		if !ok {
			continue
		}
		var pr pluginRecord
		if err := unmarshalRecord(v, &pr); err != nil {
			seeds[name] = sessions.Seed{Lost: "its saved state is unreadable: " + err.Error()}
			continue
		}
		c.saved[field] = sha256.Sum256(v)
		c.done[name] = pr.Done
		if pr.Lost != "" {
			seeds[name] = sessions.Seed{Lost: pr.Lost}
			continue
		}
		seeds[name] = sessions.Seed{State: &plugins.State{Host: pr.Host, SHA256: pr.SHA256, Data: pr.Data}}
	}
	if key.Kind() == sessions.KindHandle {
		if err := d.h.ses.Open(key); err != nil {
			return err
		}
	}
	if err := d.h.ses.Seed(key, seeds, fence); err != nil {
		return err
	}
	if b, ok := rec["grants"]; ok {
		// The person's answers to run-time grant questions move with
		// the session (grants.go).
		if err := d.h.grants.restore(key, b); err != nil {
			d.log.Warn("session adopted without its grant answers", "session", key.String(), "error", err)
		}
	}
	c.seeded = fence
	if rec != nil {
		d.log.Info("session adopted", "session", key.String(), "plugins", len(seeds))
		d.h.metrics.adopted.Inc()
	}
	return nil
}

// storeTimeout bounds a store exchange made outside a durable's own
// bound (adoption of a stateful session).
const storeTimeout = 5 * time.Second

// putLocked writes one field of c's record with c's fence, unless it
// holds that value already. A write that got no answer may still land:
// the fence is bumped before the next write (dirty), so that it never
// lands after it. c.mu is held.
func (d *durable) putLocked(ctx context.Context, c *claim, field string, v []byte) error {
	sum := sha256.Sum256(v)
	unchanged := false
	if prev, ok := c.saved[field]; ok && prev == sum {
		// Nothing to write. Unless the claim was verified long ago (the
		// call was long, or this process was stopped while it ran): the
		// result was computed from what may be a stale instance, and
		// the fence is checked before it is sent.
		if time.Since(c.verified) < memoryGrace {
			return nil
		}
		unchanged = true
	}
	if d.open() {
		return errStoreDown
	}
	asked := time.Now()
	if unchanged && !c.dirty {
		if _, err := d.store.Renew(ctx, c.id, c.fence, d.ttl(), false); err != nil {
			return d.observe(err)
		}
		c.verified, c.renewed = asked, asked
		return nil
	}
	// The tenants' byte budgets (shares.go) before the store.
	undo, err := d.h.storeBytes.reserve(c.id, field, len(v), d.ttl(), d.h.tenantOf(""))
	if err != nil {
		return err
	}
	if c.dirty {
		f, err := d.store.Renew(ctx, c.id, c.fence, d.ttl(), true)
		if err != nil {
			undo()
			return d.observe(err)
		}
		c.fence, c.dirty = f, false
	}
	if err := d.store.Put(ctx, c.id, field, v, c.fence, d.ttl()); err != nil {
		undo()
		if unanswered(err) {
			c.dirty = true
			delete(c.saved, field)
		}
		return d.observe(err)
	}
	c.saved[field] = sum
	c.renewed, c.verified = asked, asked
	return nil
}

// Reasons of a result's notSaved mark ([MetaNotSaved]).
const (
	notSavedUnavailable = "store-unavailable"
	notSavedTooLarge    = "too-large"
	notSavedMoved       = "moved"
	notSavedUnsnapshot  = "cannot-snapshot"
	notSavedUnverified  = "unverified"
)

// checkpoint saves inst's state (between calls), started under fence,
// into c's record. It returns why the state is not saved ("" when it
// is), and errMoved when the session changed owner since inst started
// (inst is stale: its state is not the session's). A store that lost the
// record is written back first (recover). An instance the host cannot
// snapshot is recorded as such once, so that a replica taking the
// session over says its state was lost.
func (d *durable) checkpoint(ctx context.Context, c *claim, p *plugins.Plugin, inst *plugins.Instance, fence uint64, first *once) (why string, err error) {
	ctx, span := telemetry.Start(ctx, "wasmtools.checkpoint", attribute.String("wasmtools.plugin", p.Name()))
	defer func() {
		if why != "" {
			span.SetAttributes(attribute.String("wasmtools.not_saved", why))
		}
		telemetry.End(span, err)
	}()
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	st, err := inst.SaveState(ctx)
	var pr pluginRecord
	notSaved := ""
	if err != nil {
		if ctx.Err() != nil {
			return notSavedUnavailable, err
		}
		pr = pluginRecord{SHA256: p.SHA256(), Lost: "plugin " + p.Name() + " cannot be snapshotted: " + err.Error()}
		notSaved = notSavedUnsnapshot
	} else {
		pr = pluginRecord{Host: st.Host, SHA256: st.SHA256, Data: st.Data}
	}
	field := "p/" + p.Name()
	c.mu.Lock()
	defer c.mu.Unlock()
	if fence != c.seeded {
		return notSavedMoved, errMoved
	}
	c.remember(p.Name(), first)
	pr.Done = c.done[p.Name()]
	b, err := marshalRecord(pr)
	if err != nil {
		return notSavedUnavailable, err
	}
	start := time.Now()
	err = d.putLocked(ctx, c, field, b)
	if statestore.Lost(err) {
		err = d.relost(ctx, c)
		if err == nil {
			err = d.putLocked(ctx, c, field, b)
		}
	}
	d.h.metrics.checkpoint(time.Since(start), len(b), err)
	switch {
	case err == nil:
		delete(c.unsaved, p.Name())
		return notSaved, nil
	case errors.Is(err, statestore.ErrFenced), errors.Is(err, errMoved):
		return notSavedMoved, errMoved
	case errors.Is(err, statestore.ErrTooLarge):
		notSaved = notSavedTooLarge
	case errors.Is(err, errStoreDown) && time.Since(c.verified) >= memoryGrace:
		// The store was not asked (the breaker is open), and the claim
		// was verified too long ago to know the instance is current
		// (this process may have been stopped while another replica
		// took the session over): the result is not sent as a success,
		// and the instance goes. (A write that was sent and got no
		// answer may still land: that call is acknowledged, marked not
		// saved, never said to have had no effect.)
		return notSavedUnverified, errUnverified
	default:
		notSaved = notSavedUnavailable
	}
	c.unsaved[p.Name()] = notSaved
	return notSaved, err
}

// errUnverified fails a call whose state could be neither saved nor
// known current (see checkpoint).
var errUnverified = errors.New("the session's state could not be saved or verified while this call ran (the state store did not answer), and its effect was not kept: call the tool again")

// relost claims a session whose record the store lost again, for a write
// back: errMoved if another replica claimed it meanwhile. c.mu is held.
func (d *durable) relost(ctx context.Context, c *claim) error {
	cl, err := d.store.Claim(ctx, c.id, d.owner, d.ttl(), true)
	if err != nil {
		return d.observe(err)
	}
	if cl.Previous != (statestore.Owner{}) {
		return errMoved
	}
	d.log.Warn("state store lost the session's record: writing it back", "session", c.id)
	d.h.metrics.storeLost.Inc()
	clear(c.saved)
	c.fence, c.dirty = cl.Fence, false
	return d.putLocked(ctx, c, "mcp", mcpOr(c.mcp))
}

// afterCall is the checkpoint of a call that succeeded, under the
// after-call policy. It returns why the call's state is not saved (""
// when it is, or need not be), and errMoved when another replica took the
// session over while the call ran: the claim is forgotten here (its next
// request claims it again, from the store), and the call fails (its
// effect is not in the store).
func (d *durable) afterCall(ctx context.Context, key sessions.Key, c *claim, l *sessions.Lease, first *once) (string, error) {
	if c == nil || d.policy != CheckpointAfterCall || l.Plugin().Stateless() || l.Instance().Err() != nil {
		return "", nil
	}
	// Saved even if the client is gone: the call's effect is in the
	// instance, and the store must not fall behind it.
	notSaved, err := d.checkpoint(context.WithoutCancel(ctx), c, l.Plugin(), l.Instance(), l.Fence(), first)
	if errors.Is(err, errMoved) {
		d.forget(key)
		d.log.Warn("session taken over by another replica during a call", "session", key.String())
		return notSaved, errMoved
	}
	if errors.Is(err, errUnverified) {
		d.forget(key) // claimed and read again by the session's next request
		d.log.Warn("call not kept: its state could be neither saved nor verified", "session", key.String())
		return notSaved, errUnverified
	}
	if err != nil {
		d.log.Error("checkpoint: the call's state is not saved", "session", key.String(), "plugin", l.Plugin().Name(), "reason", notSaved, "error", err)
	}
	return notSaved, nil
}

// keepAlive renews c's record while a call runs, every third of its TTL,
// so that a call longer than the session timeout keeps its session; the
// returned func stops it.
func (d *durable) keepAlive(c *claim) func() {
	if d == nil || c == nil {
		return func() {}
	}
	every := d.ttl() / 3
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				d.renew(c)
			}
		}
	}()
	return func() { close(done) }
}

// renew resets c's record's TTL (any activity of its session).
func (d *durable) renew(c *claim) {
	if d.open() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout())
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := d.store.Renew(ctx, c.id, c.fence, d.ttl(), false); err != nil {
		d.observe(err)
		d.log.Debug("state store: renew", "session", c.id, "error", err)
		return
	}
	c.renewed = time.Now()
}

// saved returns the state of key's instance of p as the store keeps it,
// for an instance evicted for room: with after-call checkpoints it is
// the state as of its last call, so the client goes on as if it had never
// been evicted. nil when there is none (no store, another policy, a state
// that could not be saved, or another version's), and when the instance's
// last checkpoint failed: the store's state is older than what the client
// was told, and the client's next result says its state was reset rather
// than rolling it back silently.
func (d *durable) saved(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string) {
	if d == nil || d.policy != CheckpointAfterCall {
		return nil, ""
	}
	d.mu.Lock()
	c := d.claims[key]
	d.mu.Unlock()
	if c == nil {
		return nil, ""
	}
	c.mu.Lock()
	unsaved := c.unsaved[p.Name()] != ""
	delete(c.unsaved, p.Name()) // said once, by this reset
	c.mu.Unlock()
	if unsaved {
		return nil, ReasonNotSaved
	}
	if d.open() {
		return nil, ""
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	rec, err := d.store.Get(ctx, c.id)
	if err != nil {
		d.observe(err)
		return nil, ""
	}
	var pr pluginRecord
	if unmarshalRecord(rec["p/"+p.Name()], &pr) != nil || pr.Lost != "" || pr.SHA256 != p.SHA256() {
		return nil, ""
	}
	return &plugins.State{Host: pr.Host, SHA256: pr.SHA256, Data: pr.Data}, ""
}

// ReasonNotSaved is the stateReset reason of a plugin's state that an
// earlier result marked not saved ([MetaNotSaved]) and that was then lost
// (its instance evicted): the client goes on from a fresh instance, told
// so, rather than from the older stored state.
const ReasonNotSaved = "not-saved"

// forget drops this replica's claim on key, without touching the store.
func (d *durable) forget(key sessions.Key) {
	d.mu.Lock()
	delete(d.claims, key)
	d.mu.Unlock()
}

// ended deletes an ended session's record: its client closed it, or it
// timed out. Not at drain or close, whose sessions live on elsewhere. A
// session whose claim this replica no longer has (the heartbeat swept
// it) is claimed again to be deleted, unless a live replica holds it.
func (d *durable) ended(key sessions.Key) {
	d.mu.Lock()
	c := d.claims[key]
	delete(d.claims, key)
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout())
	defer cancel()
	if c == nil {
		id := storeID(key)
		if id == "" {
			return
		}
		// Not stolen: a session that ended here by timing out may live on
		// at the replica that holds it now.
		c = newClaim(id)
		cl, err := d.store.Claim(ctx, id, d.owner, d.ttl(), false)
		if errors.Is(err, statestore.ErrHeld) {
			return
		}
		if err != nil {
			d.log.Warn("state store: delete ended session", "session", key.String(), "error", err)
			return
		}
		c.fence = cl.Fence
		close(c.ready)
	}
	<-c.ready
	if c.err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := d.store.Delete(ctx, c.id, c.fence); err != nil && !errors.Is(err, statestore.ErrFenced) {
		d.log.Warn("state store: delete ended session", "session", key.String(), "error", err)
	}
	d.h.storeBytes.release(c.id)
}

// drain checkpoints every instance of every claimed session (waiting for
// calls queued on them) and releases the claims of the sessions it saved
// whole, so that other replicas take them over at once. A session not
// saved whole keeps its claim: it is taken over once this replica's
// heartbeat ends, from its last checkpoint.
func (d *durable) drain(ctx context.Context) error {
	d.mu.Lock()
	claims := make(map[sessions.Key]*claim, len(d.claims))
	for k, c := range d.claims {
		claims[k] = c
	}
	d.mu.Unlock()
	var firstErr error
	saved, released := 0, 0
	for key, c := range claims {
		select {
		case <-c.ready:
		default:
			continue
		}
		if c.err != nil {
			continue
		}
		err := d.h.ses.Instances(ctx, key, func(name string, inst *plugins.Instance, fence uint64) error {
			saved++
			_, err := d.checkpoint(ctx, c, inst.Plugin(), inst, fence, nil)
			return err
		})
		if err != nil {
			if !errors.Is(err, errMoved) {
				d.log.Error("drain: checkpoint", "session", key.String(), "error", err)
				if firstErr == nil {
					firstErr = err
				}
			}
			continue // keep the claim: the holder's heartbeat ends soon
		}
		rctx, cancel := context.WithTimeout(ctx, d.timeout())
		c.mu.Lock()
		if err := d.store.Release(rctx, c.id, c.fence); err == nil {
			released++
		}
		c.mu.Unlock()
		cancel()
	}
	lctx, cancel := context.WithTimeout(context.Background(), d.timeout())
	defer cancel()
	if err := d.store.Leave(lctx, d.owner); err != nil && firstErr == nil {
		firstErr = err
	}
	d.log.Info("drained", "sessions", len(claims), "released", released, "instances saved", saved)
	return firstErr
}

// mcpOr is b, or an empty session record.
func mcpOr(b []byte) []byte {
	if len(b) == 0 {
		return []byte(`{}`)
	}
	return b
}

// grantsChanged writes key's run-time grant answers (grants.go) into its
// record, so that they move with the session to another replica. A write
// that fails leaves them in this replica's memory: the person is asked
// again elsewhere, never granted what they did not approve.
func (d *durable) grantsChanged(ctx context.Context, key sessions.Key) {
	b := d.h.grants.export(key)
	if b == nil {
		return
	}
	c, err := d.claimOrLog(ctx, key)
	if c == nil || err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := d.putLocked(context.WithoutCancel(ctx), c, "grants", b); err != nil {
		d.log.Warn("state store: the session's grant answers not saved", "session", key.String(), "error", err)
	}
}
