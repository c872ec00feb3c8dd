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
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
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

	mu     sync.Mutex
	claims map[sessions.Key]*claim
	// users are the authenticated users of stateful sessions made and
	// not yet initialized, by session ID (at most maxPendingUsers).
	users map[string]string
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

// claim is this replica's claim on one session.
type claim struct {
	id    string
	ready chan struct{} // closed once claimed (or failed)
	err   error

	mu    sync.Mutex // serialises the session's writes
	fence uint64
	saved map[string][sha256.Size]byte // digest of each field as last written
}

func newDurable(h *Host) *durable {
	var boot [6]byte
	rand.Read(boot[:])
	d := &durable{
		h:      h,
		store:  h.opts.Store,
		owner:  statestore.Owner{Replica: cmpOr(h.opts.Replica, "-"), Boot: hex.EncodeToString(boot[:])},
		policy: cmpOr(h.opts.Checkpoint, CheckpointAfterCall),
		log:    h.log.With("component", "durable"),
		claims: map[sessions.Key]*claim{},
		users:  map[string]string{},
	}
	return d
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
		cancel()
		d.sweep()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep forgets the claims of clients that ended in the session layer
// (handles ended idle or evicted: their records expire in the store).
func (d *durable) sweep() {
	live := map[sessions.Key]bool{}
	for _, k := range d.h.ses.Keys() {
		live[k] = true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, c := range d.claims {
		select {
		case <-c.ready:
			if !live[k] {
				delete(d.claims, k)
			}
		default:
		}
	}
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
}

// ensure claims key's session for this replica before a request runs on
// it (ns: the stateful session being made, whose record is written). The first time this replica serves the session, or when another
// replica served it since (the claim's fence moved), the store's record
// (if any) seeds the key's client: its instances' states, and a handle's
// client is opened. It returns nil for a key that is not kept, and for a
// handle the store does not know either (the caller refuses it).
func (d *durable) ensure(ctx context.Context, key sessions.Key, ns *newSession) (*claim, error) {
	if d == nil {
		return nil, nil
	}
	id := storeID(key)
	if id == "" {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	d.mu.Lock()
	c := d.claims[key]
	if c == nil {
		c = &claim{id: id, ready: make(chan struct{}), saved: map[string][sha256.Size]byte{}}
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
		return nil, ctx.Err()
	}
	if errors.Is(c.err, errNotKept) {
		return nil, nil
	}
	if c.err != nil {
		return nil, c.err
	}
	return c, d.verify(ctx, key, c)
}

// claimOrLog is ensure for a request that runs whatever the store says:
// with the store unreachable, the request is served from what this
// replica holds (nil: nothing is written), and the log says so. A session
// that would have been taken over is then not found here (a handle is
// refused as expired), rather than served afresh.
func (d *durable) claimOrLog(ctx context.Context, key sessions.Key) *claim {
	c, err := d.ensure(ctx, key, nil)
	if err != nil {
		d.log.Warn("state store unavailable: serving the session from this replica only, not kept", "session", key.String(), "error", err)
		return nil
	}
	return c
}

// errNotKept marks a claim given up: a handle the store does not know.
var errNotKept = errors.New("session not kept")

// take claims the session for the first time and, if the store has it,
// seeds key's client. kept is false for a handle that neither this
// replica nor the store knows.
func (d *durable) take(ctx context.Context, key sessions.Key, ns *newSession, c *claim) (kept bool, err error) {
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return false, fmt.Errorf("state store: read session: %w", err)
	}
	if rec == nil && key.Kind() == sessions.KindHandle && !d.h.ses.Has(key) {
		return false, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := d.claim(ctx, key, c); err != nil {
		return false, err
	}
	if rec != nil {
		if err := d.seed(key, c, rec); err != nil {
			return false, err
		}
	}
	switch {
	case ns != nil && ns.ss.InitializeParams() != nil:
		b, _ := json.Marshal(sessionRecord{Initialize: ns.ss.InitializeParams(), Subject: ns.subject})
		err = d.putLocked(ctx, c, "mcp", b)
	case rec == nil:
		// A record, so that a replica taking the session over knows it.
		err = d.putLocked(ctx, c, "mcp", []byte(`{}`))
	}
	return err == nil, err
}

// claim takes the session for this replica. The request reached this
// replica, so the proxy routes the session here now: it is taken even
// from a live holder, whose later writes are fenced. c.mu is held.
func (d *durable) claim(ctx context.Context, key sessions.Key, c *claim) error {
	cl, err := d.store.Claim(ctx, c.id, d.owner, d.ttl(), true)
	if err != nil {
		return fmt.Errorf("state store: claim session: %w", err)
	}
	c.fence = cl.Fence
	if cl.Previous != (statestore.Owner{}) {
		d.log.Info("session taken over", "session", key.String(), "from", cl.Previous.Replica, "holderAlive", cl.PreviousAlive, "fence", cl.Fence)
	}
	return nil
}

// verify checks, before a request runs, that this replica still holds
// the session it claimed. If another replica served the session since,
// what this replica holds is stale: its idle instances are dropped and
// the store's record seeds the client again.
func (d *durable) verify(ctx context.Context, key sessions.Key, c *claim) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	fence := c.fence
	if err := d.claim(ctx, key, c); err != nil {
		return err
	}
	if c.fence == fence {
		return nil
	}
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return fmt.Errorf("state store: read session: %w", err)
	}
	clear(c.saved)
	d.h.ses.DropIdle(key)
	return d.seed(key, c, rec)
}

// seed gives key's client the instance states of rec (nil: none, the
// session's states are new). c.mu is held.
func (d *durable) seed(key sessions.Key, c *claim, rec map[string][]byte) error {
	seeds := map[string]sessions.Seed{}
	for field, v := range rec {
		name, ok := strings.CutPrefix(field, "p/")
		if !ok {
			continue
		}
		var pr pluginRecord
		if err := json.Unmarshal(v, &pr); err != nil {
			seeds[name] = sessions.Seed{Lost: "its saved state is unreadable: " + err.Error()}
			continue
		}
		c.saved[field] = sha256.Sum256(v)
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
	if err := d.h.ses.Seed(key, seeds); err != nil {
		return err
	}
	if rec != nil {
		d.log.Info("session adopted", "session", key.String(), "plugins", len(seeds))
		d.h.metrics.adopted.Inc()
	}
	return nil
}

// storeTimeout bounds each exchange with the store.
const storeTimeout = 5 * time.Second

// put writes one field of c's record, unless it holds that value already.
func (d *durable) put(ctx context.Context, c *claim, field string, v []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return d.putLocked(ctx, c, field, v)
}

// putLocked is put with c.mu held.
func (d *durable) putLocked(ctx context.Context, c *claim, field string, v []byte) error {
	sum := sha256.Sum256(v)
	if prev, ok := c.saved[field]; ok && prev == sum {
		return nil
	}
	// The tenants' byte budgets (shares.go) before the store.
	undo, err := d.h.storeBytes.reserve(c.id, field, len(v), d.ttl(), d.h.tenantOf(""))
	if err != nil {
		return err
	}
	if err := d.store.Put(ctx, c.id, field, v, c.fence, d.ttl()); err != nil {
		undo()
		return err
	}
	c.saved[field] = sum
	return nil
}

// checkpoint saves inst's state (between calls) into c's record. An
// instance the host cannot snapshot is recorded as such once, so that a
// replica taking the session over says its state was lost.
func (d *durable) checkpoint(ctx context.Context, c *claim, p *plugins.Plugin, inst *plugins.Instance) error {
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	st, err := inst.SaveState(ctx)
	var pr pluginRecord
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		pr = pluginRecord{SHA256: p.SHA256(), Lost: "plugin " + p.Name() + " cannot be snapshotted: " + err.Error()}
	} else {
		pr = pluginRecord{Host: st.Host, SHA256: st.SHA256, Data: st.Data}
	}
	b, err := json.Marshal(pr)
	if err != nil {
		return err
	}
	start := time.Now()
	err = d.put(ctx, c, "p/"+p.Name(), b)
	d.h.metrics.checkpoint(time.Since(start), len(b), err)
	return err
}

// afterCall is the checkpoint of a call that succeeded, under the
// after-call policy. A session another replica took over meanwhile is
// forgotten here (its next request claims it again, from the store), and
// the call fails with errMoved: its effect is not in the store.
func (d *durable) afterCall(ctx context.Context, key sessions.Key, c *claim, l *sessions.Lease) error {
	if c == nil || d.policy != CheckpointAfterCall || l.Plugin().Stateless() || l.Instance().Err() != nil {
		return nil
	}
	err := d.checkpoint(ctx, c, l.Plugin(), l.Instance())
	if errors.Is(err, statestore.ErrFenced) {
		d.forget(key)
		d.log.Warn("session taken over by another replica during a call", "session", key.String())
		return errMoved
	}
	if err != nil {
		// The store is down: the call's effect lives here only. The
		// client is told nothing (its call succeeded), the log is.
		d.log.Error("checkpoint", "session", key.String(), "plugin", l.Plugin().Name(), "error", err)
	}
	return nil
}

// saved returns the state of key's instance of p as the store keeps it,
// for an instance evicted for room: with after-call checkpoints it is
// the state as of its last call, so the client goes on as if it had never
// been evicted. nil when there is none (no store, another policy, a state
// that could not be saved, or another version's).
func (d *durable) saved(ctx context.Context, key sessions.Key, p *plugins.Plugin) *plugins.State {
	if d == nil || d.policy != CheckpointAfterCall {
		return nil
	}
	d.mu.Lock()
	c := d.claims[key]
	d.mu.Unlock()
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, storeTimeout)
	defer cancel()
	rec, err := d.store.Get(ctx, c.id)
	if err != nil {
		return nil
	}
	var pr pluginRecord
	if json.Unmarshal(rec["p/"+p.Name()], &pr) != nil || pr.Lost != "" || pr.SHA256 != p.SHA256() {
		return nil
	}
	return &plugins.State{Host: pr.Host, SHA256: pr.SHA256, Data: pr.Data}
}

// forget drops this replica's claim on key, without touching the store.
func (d *durable) forget(key sessions.Key) {
	d.mu.Lock()
	delete(d.claims, key)
	d.mu.Unlock()
}

// ended deletes an ended session's record: its client closed it, or it
// timed out. Not at drain or close, whose sessions live on elsewhere.
func (d *durable) ended(key sessions.Key) {
	d.mu.Lock()
	c := d.claims[key]
	delete(d.claims, key)
	d.mu.Unlock()
	if c == nil {
		return
	}
	<-c.ready
	if c.err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := d.store.Delete(ctx, c.id, c.fence); err != nil && !errors.Is(err, statestore.ErrFenced) {
		d.log.Warn("state store: delete ended session", "session", key.String(), "error", err)
	}
	d.h.storeBytes.release(c.id)
}

// drain checkpoints every idle instance of every claimed session and
// releases the claims, so that other replicas take the sessions over at
// once. Calls in flight are waited for by the caller first.
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
		err := d.h.ses.Instances(ctx, key, func(name string, inst *plugins.Instance) error {
			saved++
			return d.checkpoint(ctx, c, inst.Plugin(), inst)
		})
		if err != nil && !errors.Is(err, statestore.ErrFenced) {
			d.log.Error("drain: checkpoint", "session", key.String(), "error", err)
			if firstErr == nil {
				firstErr = err
			}
			continue // keep the claim: the holder's heartbeat ends soon
		}
		rctx, cancel := context.WithTimeout(ctx, storeTimeout)
		c.mu.Lock()
		if err := d.store.Release(rctx, c.id, c.fence); err == nil {
			released++
		}
		c.mu.Unlock()
		cancel()
	}
	lctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	defer cancel()
	if err := d.store.Leave(lctx, d.owner); err != nil && firstErr == nil {
		firstErr = err
	}
	d.log.Info("drained", "sessions", len(claims), "released", released, "instances saved", saved)
	return firstErr
}
