package durable

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/plugins"
)

// claim is this replica's claim on one session. Its writes take turns
// under mu; each names the fence it writes with (fence), and writes only
// the state of an instance started under the fence the session's
// instances were last seeded with (seeded): another holder served the
// session since an instance started under another, and what it holds is
// not the session's state any more.
type Claim struct {
	key   sessions.Key
	id    string
	ready chan struct{} // closed once claimed (or failed)
	err   error

	mu     sync.Mutex // serialises the session's writes
	fence  uint64     // the fence to write with now
	seeded uint64     // the fence the session's instances are current under
	// dirty: a write failed without an answer (it may still land): the
	// fence is bumped before the next write, so that it never does.
	dirty bool
	saved map[string]fieldSum // digest of each field as last written
	// bases are what the store holds of each plugin's base of frames, as
	// far as this claim knows (frames.go).
	bases map[string]*storedBase
	// baseBytes are the sizes of the plugins' bases as the byte budgets
	// count them (Options.Reserve), as far as this claim knows.
	baseBytes map[string]int
	// mcp is the "mcp" field as last written: written back when the
	// store lost the record.
	mcp []byte
	// unsaved says, by plugin name, why the last checkpoint of its
	// instance failed: its stored state is older than what the client
	// was told.
	unsaved map[string]NotSaved
	// done are the results kept for at-most-once calls, by plugin name
	// (see pluginRecord.Done).
	done map[string][]Once
	// ran are the digests of the at-most-once keys of calls whose results
	// fell out of done, by plugin name (see pluginRecord.Ran).
	ran map[string][]byte
	// renewed is when the record's TTL was last renewed by this replica.
	renewed time.Time
	// stale: another replica served the session since this one's
	// instances started, and the record has not been read since.
	stale bool
	// verified is when this replica's claim was last confirmed by the
	// store (monotonic).
	verified time.Time
	// retired: this replica forgot the claim and claimed the session
	// anew; the new claim holds its notes (or read the record again), and
	// it writes nothing more (a write of its, late, could land over the
	// new claim's under the same fence).
	retired bool
	// recheck: a call run before its claim was checked could not check
	// it; the next request claims first (Keeper.CheckLater refuses c
	// until a claim of it is answered).
	recheck bool
	// checkFrom, while a checkpoint writes with c.mu held, is when the
	// call it saves started, if it ran before its claim was checked
	// (Keeper.CheckLater): a state unchanged is not skipped then unless
	// the claim was verified since, so that the write checks the fence.
	checkFrom time.Time
	// taken is the Taken of the last claim this replica saw answered
	// (statestore.Claim.Taken): while the store's stays the same, no one
	// claimed the session since, this replica included.
	taken uint64
}

func newClaim(key sessions.Key, id string) *Claim {
	return &Claim{key: key, id: id, ready: make(chan struct{}), saved: map[string]fieldSum{}, bases: map[string]*storedBase{}, baseBytes: map[string]int{}, unsaved: map[string]NotSaved{}, done: map[string][]Once{}, ran: map[string][]byte{}}
}

// memoryGrace is how long after its last verified claim a session may be
// served from what this replica holds when the store does not answer:
// long enough to ride out a blip, short enough that a replica that was
// stopped (SIGSTOP, a long GC pause, a frozen VM) or cut off from the
// store alone does not serve a session another replica took over
// meanwhile. Past it, the request is refused with -32053 until the store
// answers. No other replica takes the session over within it: the store
// refuses their claims for statestore.Lease, longer, after this
// replica's last exchange (a review found a replica within its grace
// writing back its older state over the calls another had acknowledged
// since, the session moved away and back within 2 s:
// TestRecentlyVerifiedDoesNotWriteBackOverOthersCalls).
const memoryGrace = 2 * time.Second

// maxLeaseWait bounds how long a claim waits for another replica's lease
// on the session (statestore.Lease) to run out, renewed as that replica
// goes on serving it; leaseSlack is added to each wait the store names.
const (
	maxLeaseWait = 2 * statestore.Lease
	leaseSlack   = 10 * time.Millisecond
)

// retire marks c, a claim this replica forgot, as replaced.
func (c *Claim) retire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
}

// claimedLast reports whether c, a claim this replica forgot, was the
// last to claim the session: the store's Taken is still the one c saw
// answered (no one claimed since, this replica included), and c's record
// was read since its last claim (not stale).
func (c *Claim) claimedLast(taken uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.stale && c.taken != 0 && c.taken == taken
}

// fresh reports whether c may be served from memory: its claim was
// verified within memoryGrace, and nothing since says it is stale.
func (c *Claim) fresh() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.stale && !c.verified.IsZero() && elapsed(c.verified, time.Now()) < memoryGrace
}

// Ensure claims key's session for this replica before a request runs on
// it (ns: the stateful session being made, whose record is written). The
// first time this replica serves the session, or when another replica
// served it since (the claim's fence moved), the store's record (if any)
// is read after the claim and seeds the key's client: its instances'
// states, and a handle's client is opened; instances of the old fence are
// retired. It returns nil for a key that is not kept, and for a handle
// the store does not know either (the caller refuses it). An error
// matching ErrStateUnavailable means the session's state could not be
// read or verified now: the request is refused, to be retried.
func (d *Keeper) Ensure(ctx context.Context, key sessions.Key, ns *NewSession) (*Claim, error) {
	if d == nil {
		return nil, nil
	}
	id := StoreID(key)
	if id == "" {
		return nil, nil
	}
	// A claim, a read, a write: a few exchanges, each bounded by the
	// store's client too; and the wait for another replica's lease on
	// the session, which is not an exchange (claim).
	ctx, cancel := context.WithTimeout(ctx, 4*d.timeout()+maxLeaseWait)
	defer cancel()
	d.mu.Lock()
	c := d.claims[key]
	if c == nil {
		c = newClaim(key, id)
		d.claims[key] = c
		if ns == nil {
			ns = d.pending[key]
		}
		d.mu.Unlock()
		kept, err := d.take(ctx, key, ns, c)
		d.mu.Lock()
		d.dropPending(key)
		if err != nil && unanswered(err) && !errors.Is(err, errRefused) && ns != nil && ns.Initialize != nil {
			// The store did not answer: kept for the next claim, which
			// writes the record a takeover needs (with ns nil it would
			// write one without the initialize to replay). Not a record
			// refused (too large, over the byte budgets): it would be
			// refused again.
			d.keepPending(key, ns)
		}
		d.mu.Unlock()
		if err != nil || !kept {
			c.err = cmp.Or(err, errNotKept)
			d.mu.Lock()
			if d.claims[key] == c { // not a newer one, after an Ended
				delete(d.claims, key) // the next request tries again
			}
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

// BeforeCall is Ensure for a call. With the store unreachable, a session
// this replica holds, whose claim it verified within memoryGrace, is
// served from what it holds: ErrServedFromMemory, with the claim when
// there is one, for [Keeper.Replay] and [Keeper.ServedFromMemory] only (the call
// is not checkpointed, and its result is marked not saved). Any other is
// refused with ErrStateUnavailable, never served afresh over a state the
// store may hold, nor from an instance that may be stale.
func (d *Keeper) BeforeCall(ctx context.Context, key sessions.Key) (c *Claim, err error) {
	if err := ctx.Err(); err != nil {
		// The client is gone (a request that waited in a stopped
		// process): nothing runs, so nothing resets a stored state.
		return nil, err
	}
	c, err = d.Ensure(ctx, key, nil)
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
	case !held && (key.Kind() != sessions.KindConn || d.ses.Fence(key) != 0 || d.wasAdopted(key)):
		// Served from memory only what this replica holds, or a
		// stateful session made here that was never claimed (the store
		// was away when it began). A client header's or handle's
		// session seen here first may have a state in the store, which
		// a fresh instance must not shadow; a session whose claim this
		// replica lost (another replica took it over) holds stale
		// instances.
		return nil, err
	}
	d.log.Warn(ServingFromMemory, "session", key.String(), "error", err)
	if held {
		return c, ErrServedFromMemory
	}
	return nil, ErrServedFromMemory
}

// take claims the session for the first time and then, if the store has
// it, seeds key's client from what the store holds after the claim (a
// write acknowledged by the previous holder before it is the newest
// state, and later writes of it are fenced). kept is false for a handle
// that neither this replica nor the store knows.
func (d *Keeper) take(ctx context.Context, key sessions.Key, ns *NewSession, c *Claim) (kept bool, err error) {
	ctx, span := telemetry.Start(ctx, "wasmtools.takeover")
	defer func() { telemetry.End(span, err) }()
	if d.open() {
		return false, unavailable(errStoreDown)
	}
	if key.Kind() == sessions.KindHandle && !d.ses.Has(key) {
		if err := d.heldBack(ctx, c.id); err != nil {
			return false, err
		}
	}
	d.mu.Lock()
	old := d.forgotten[key]
	delete(d.forgotten, key)
	d.mu.Unlock()
	resumable := old != nil // until a claim says someone else claimed since
	defer func() {
		switch {
		case old == nil:
		case err != nil && resumable:
			// Not taken after all: kept for the next try (retired, its
			// notes are as they were taken).
			d.mu.Lock()
			if d.forgotten[key] == nil {
				d.forgotten[key] = old
			}
			d.mu.Unlock()
		default:
			old.retire()
		}
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	asked := time.Now() // before the claim: a pause after it shortens the grace, never lengthens it
	cl, err := d.claim(ctx, key, c)
	if err != nil {
		return false, unavailable(err)
	}
	c.taken = cl.Taken
	resumable = resumable && old.claimedLast(cl.Taken)
	var notes claimNotes
	if old != nil {
		// Retired before the record is read: a checkpoint of old's
		// after the read would be in neither the record nor the notes.
		notes = old.retireTaking()
	}
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return false, unavailable(d.observe(fmt.Errorf("state store: read session: %w", err)))
	}
	d.countStored(c.id, rec)
	if rec == nil && key.Kind() == sessions.KindHandle && !d.ses.Has(key) {
		// Unknown here and to the store: the claim is given up, under
		// its own fence (a claim made since, by the replica that may
		// still hold the session, is left alone). Left in the store, it
		// read as a hand-over to that replica, back from a cut to the
		// store alone, from a holder that served the session, and that
		// replica dropped what it held, where it would write it back
		// (TestUnknownHandleElsewhereLeavesNoClaim). A release lost
		// leaves it so: that replica then says its state was lost.
		if err := d.store.Release(ctx, c.id, cl.Fence); err != nil {
			d.log.Warn("state store: release the claim of an unknown handle", "session", key.String(), "error", d.observe(err))
		}
		return false, nil
	}
	c.fence = cl.Fence
	c.verified = asked
	// The store lost the record since this replica forgot its claim (no
	// previous holder, no plugin's state): what it still holds is the
	// newest state, as verify's recover rule has it, and is written back
	// rather than retired for the empty record's fresh starts
	// (TestForgottenClaimAfterStoreRestartKeepsState).
	// Unless this replica cannot tell that no one else served the
	// session meanwhile (newestHere): then what it holds is said lost.
	lost := !resumable && old != nil && notes.seeded != 0 && cl.Previous == (statestore.Owner{}) && !hasPlugins(rec)
	lostHere := lost && d.newestHere(notes.fence, cl.Fence, notes.verified, asked)
	// A client header the store has no record of is a new client, or one
	// whose record the store lost with its data while no live replica held
	// its instances (its replica killed too), which nothing else tells
	// from a new one (a stateful session is answered 404, a handle
	// refused). Within the session timeout of a loss the store recorded
	// (noteEpoch) it is said lost: a new client then hears of a reset of a
	// state it never had.
	lostLately := false
	if old == nil && key.Kind() == sessions.KindClient && len(rec) == 0 {
		if lostLately, err = d.noteEpoch(ctx); err != nil {
			return false, unavailable(d.observe(err))
		}
	}
	// A stateful session this replica took over from its record (adopt:
	// its initialize replayed from it, by a request that ran nothing and
	// claimed nothing, as a GET does while the holder still holds it) and
	// claims here for the first time: a record without its initialize now
	// is one the store lost since (or let expire), and the state the
	// session was taken over with went with it. Said lost, never started
	// afresh unsaid (TestAdoptedSessionStoreBackEmptySaysReset; the fault
	// suite's redis-empty-mid-drain).
	adoptedLost := old == nil && ns == nil && key.Kind() == sessions.KindConn && rec["mcp"] == nil && d.adoptedHere(key)
	// A stateful session made here, never claimed (the store did not
	// answer at its initialize, its calls served from memory under no
	// fence) or whose first claim failed half way: no other replica can
	// have served it unless one took it over from a record of it, which
	// its claim would have met (a previous holder, a plugin's state).
	// Else what this replica holds is its newest state, and is kept.
	madeHere := old == nil && key.Kind() == sessions.KindConn && (ns != nil || d.ses.Fence(key) == 0) && !d.wasAdopted(key)
	keptHere := madeHere && cl.Previous == (statestore.Owner{}) && !hasPlugins(rec)
	switch {
	case keptHere:
		// Its instances go on under the new claim, marked not saved
		// until writeBack writes them (the record has none of them).
		for _, name := range d.ses.Adopt(key, d.ses.Fence(key), cl.Fence) {
			if d.policy == CheckpointAfterCall {
				c.unsaved[name] = NotSavedUnavailable
			}
		}
		if err := d.seed(ctx, key, c, rec, cl.Fence, nil); err != nil {
			return false, err
		}
	case madeHere:
		// Another replica took it over: its instances here are stale,
		// and what their calls did from memory (notSaved) is lost, said
		// so, unless the other replica wrote that plugin's state since.
		var gone map[string]NotSaved
		for _, name := range d.ses.Plugins(key) {
			if _, held := rec["p/"+name]; !held {
				if gone == nil {
					gone = map[string]NotSaved{}
				}
				gone[name] = NotSavedUnavailable
			}
		}
		if err := d.seed(ctx, key, c, rec, cl.Fence, gone); err != nil {
			return false, err
		}
		maps.Copy(c.unsaved, gone)
	case resumable || lostHere:
		// This replica forgot its claim (a call could be neither saved
		// nor verified), and no one claimed the session since: what it
		// still holds is the newest state.
		if err := d.resume(ctx, key, c, notes, rec); err != nil {
			return false, err
		}
	case lost:
		maps.Copy(c.saved, notes.saved)
		maps.Copy(c.unsaved, notes.unsaved)
		maps.Copy(c.done, notes.done)
		maps.Copy(c.ran, notes.ran)
		c.mcp = notes.mcp
		if err := d.lostWithStore(ctx, key, c, cl.Fence, "this replica cannot tell that its state is the newest"); err != nil {
			return false, err
		}
	case lostLately:
		if err := d.lostWithStore(ctx, key, c, cl.Fence, "it has no record of this client header within the session timeout of that loss"); err != nil {
			return false, err
		}
	case adoptedLost:
		if err := d.lostWithStore(ctx, key, c, cl.Fence, "this replica took the session over from a record the store no longer holds"); err != nil {
			return false, err
		}
	default:
		// As verify's: what the old claim saved and the record does
		// not hold was lost with the store, and what it knew lost still
		// is (stillLost).
		gone := stillLost(notes.unsaved, rec, goneFrom(notes.saved, rec))
		if err := d.seed(ctx, key, c, rec, cl.Fence, gone); err != nil {
			return false, err
		}
		maps.Copy(c.unsaved, gone)
	}
	if lostHere {
		d.log.Warn("state store lost the session's record: writing back what this replica holds", "session", key.String())
		d.obs.StoreLost()
		maps.Copy(c.saved, notes.saved)
		if err := d.announceLost(key, c); err != nil {
			return false, err
		}
		clear(c.saved)
		clear(c.bases)
		clear(c.baseBytes)
		c.mcp = notes.mcp
		d.writeBack(key, c)
	}
	if b, ok := rec["mcp"]; ok {
		c.mcp = b
	}
	switch {
	case ns != nil && ns.Initialize != nil:
		b, _ := json.Marshal(SessionRecord{Initialize: ns.Initialize, Subject: ns.Subject})
		c.mcp = b
		err = d.putLocked(ctx, c, "mcp", b)
	case rec == nil:
		// A record, so that a replica taking the session over knows it.
		c.mcp = mcpOr(c.mcp)
		err = d.putLocked(ctx, c, "mcp", c.mcp)
	}
	if err != nil {
		return false, unavailable(err)
	}
	if keptHere && len(c.unsaved) > 0 {
		d.writeBack(key, c)
	}
	return true, nil
}

// heldBack refuses for now (errLostLately) a handle's session id that
// the store does not hold while it came back empty lately: a replica cut
// off from it alone may still hold the session, and write it back once it
// reaches the store (LostLately); the client retries. Read before the
// claim, which the holder, back, would meet were this replica's release
// of it (take's, of a handle found unknown) unanswered. The epoch is read unless a loss was seen lately: the
// handover comes as the store comes back, before the heartbeat's next
// round (TestLostLatelyHandleBeforeHeartbeat). A handle is minted (its
// MAC): a made-up one costs no such read.
func (d *Keeper) heldBack(ctx context.Context, id string) error {
	lost, err := d.LostLately(ctx)
	if err != nil {
		return unavailable(err)
	}
	if !lost {
		return nil
	}
	rec, err := d.store.Get(ctx, id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return unavailable(d.observe(fmt.Errorf("state store: read session: %w", err)))
	}
	if len(rec) == 0 {
		return unavailable(errLostLately)
	}
	return nil
}

// claim takes the session for this replica. The request reached this
// replica, so the proxy routes the session here now: it is taken even
// from a live holder, whose later writes are fenced, once the holder's
// lease has run out (statestore.Lease: for its memoryGrace the holder may
// answer from what it holds without asking the store, or write it back
// over a record the store lost, so no one may take the session from it
// meanwhile). A lease renewed for longer than maxLeaseWait (the session
// served at the other replica all along) fails the claim. c.mu is held;
// c's fence is not changed (the caller adopts the new one once it has
// read what it vouches for).
func (d *Keeper) claim(ctx context.Context, key sessions.Key, c *Claim) (statestore.Claim, error) {
	cl, err := d.store.Claim(ctx, c.id, d.owner, d.ttl(), true)
	for waited := time.Duration(0); err != nil && waited < maxLeaseWait; {
		var leased *statestore.LeasedError
		if !errors.As(err, &leased) {
			break
		}
		wait := min(leased.Wait+leaseSlack, maxLeaseWait-waited)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return cl, fmt.Errorf("state store: claim session: %w (waiting for %v: %w)", err, wait, ctx.Err())
		}
		waited += wait
		cl, err = d.store.Claim(ctx, c.id, d.owner, d.ttl(), true)
	}
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
func (d *Keeper) verify(ctx context.Context, key sessions.Key, c *Claim) error {
	if d.open() {
		return unavailable(errStoreDown)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.retired {
		// Replaced (forgotten and claimed anew) since the caller found
		// it: the new claim is the session's; this one claims nothing.
		return unavailable(fmt.Errorf("%w: the claim was replaced", errChanged))
	}
	lastVerified := c.verified
	asked := time.Now() // before the claim: a pause after it shortens the grace, never lengthens it
	cl, err := d.claim(ctx, key, c)
	if err != nil {
		return unavailable(err)
	}
	c.recheck = false // checked now: what follows reads the record if anyone claimed since
	if cl.Fence != c.fence && !c.stale && cl.Taken != 0 && cl.Taken == c.taken {
		// No one claimed the session since the last claim this replica
		// saw answered: the fence moved by its own bump, whose answer
		// was lost. What it holds is the newest state; re-reading would
		// roll back what it was told was not saved, without a notice.
		// (Stale: another replica served the session before this
		// replica's last claim, whose record was not read: it is read
		// now.)
		c.fence, c.dirty = cl.Fence, false
	}
	if cl.Fence == c.fence {
		c.renewed, c.verified = asked, asked // a claim renews the record
		if d.ses.Fence(key) != c.seeded {
			return d.reseed(ctx, key, c)
		}
		return nil
	}
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		// What this replica holds is stale: never served from memory,
		// until the record is read.
		c.stale = true
		return unavailable(fmt.Errorf("%w: %w", errChanged, d.observe(fmt.Errorf("state store: read session: %w", err))))
	}
	d.countStored(c.id, rec)
	c.stale = false
	c.verified = asked
	c.taken = cl.Taken
	if cl.Previous == (statestore.Owner{}) && !hasPlugins(rec) {
		if d.newestHere(c.fence, cl.Fence, lastVerified, asked) {
			return d.recover(ctx, key, c, cl.Fence)
		}
		return d.lostWithStore(ctx, key, c, cl.Fence, "this replica cannot tell that its state is the newest")
	}
	// A plugin this claim saved that the record does not hold was lost
	// with it (the store lost the record, and another replica wrote it
	// again since): said lost, never started afresh without a word.
	gone := stillLost(c.unsaved, rec, goneFrom(c.saved, rec))
	clear(c.saved)
	clear(c.bases)
	clear(c.baseBytes)
	clear(c.unsaved)
	clear(c.done)
	clear(c.ran)
	c.fence = cl.Fence
	if b, ok := rec["mcp"]; ok {
		c.mcp = b
	}
	if err := d.seed(ctx, key, c, rec, cl.Fence, gone); err != nil {
		return err
	}
	maps.Copy(c.unsaved, gone) // recorded lost by writeLost
	return nil
}

// reseed seeds key's client again from the record, under the fence its
// instances were seeded with, when the session layer no longer has it
// seeded so: it ended the client here (its idle timeout, or evicted past
// the bounds on clients, which it tells the keeper nothing of), and the
// key came back before the heartbeat's sweep forgot the claim (the sweep
// keeps the claim of a live client). Unseeded, the new client's instances
// started afresh under fence 0, whose checkpoints are refused as stale,
// and every lease after the first failed as moved until that client ended
// too (TestClientEndedHereComesBackSeeded). The claim is this replica's
// still, so the record holds what it wrote; a plugin whose last state was
// not saved, which ended with the client, is said reset (as an eviction
// says it), as is every plugin under the drain policy. c.mu is held.
func (d *Keeper) reseed(ctx context.Context, key sessions.Key, c *Claim) error {
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return unavailable(d.observe(fmt.Errorf("state store: read session: %w", err)))
	}
	d.countStored(c.id, rec)
	d.log.Info("session ended here and back before its claim was forgotten: seeded again from the store", "session", key.String())
	lost := goneFrom(c.saved, rec)
	if lost == nil {
		lost = map[string]NotSaved{}
	}
	maps.Copy(lost, c.unsaved)
	if d.policy != CheckpointAfterCall {
		// Under the drain policy the record is as old as the last drain:
		// what the ended client held since went with it, and every
		// plugin starts afresh, said reset (as Keeper.Saved has an
		// eviction say), never rolled back to the record silently
		// (TestClientEndedHereUnderDrainSaysReset). A plugin the record
		// does not name may have been used here since: AnyPlugin.
		for field := range rec {
			if name, ok := strings.CutPrefix(field, "p/"); ok {
				lost[name] = NotSavedUnavailable
			}
		}
		lost[sessions.AnyPlugin] = NotSavedUnavailable
	}
	// The claim's results of at-most-once calls are the newest (it held
	// the session all along): those of calls served from memory are in
	// no record yet, and the record's, which seed reads, must not take
	// their place, or a retry runs such a call again
	// (TestClientEndedHereKeepsUnsavedResults).
	done, ran := maps.Clone(c.done), maps.Clone(c.ran)
	if err := d.seed(ctx, key, c, rec, c.seeded, lost); err != nil {
		return err
	}
	maps.Copy(c.done, done)
	maps.Copy(c.ran, ran)
	return nil
}

// newestHere reports whether what this replica holds of a session whose
// record the store lost (no holder now, no plugin's state in the record)
// is the session's newest state, to be written back: no other replica
// can have claimed the session since this replica's last fence, last.
// Its claim verified within memoryGrace before the new one was asked
// says so, as for serving from memory (no one could claim meanwhile: the
// store's lease). Else, in the same epoch (a record evicted or expired
// alone, the fence counter kept), the new claim, fence, is the next
// number after last. A store restarted empty (a new
// epoch) keeps nothing to tell, and then only the store's outage can
// explain the claim's going unverified (beats.awayExplains: the process
// ran all along, and the store stopped answering its heartbeat within
// memoryGrace of the verification): during an outage no one else could
// claim either. A replica stopped meanwhile (SIGSTOP, a frozen VM), or
// one that ran while the session went on elsewhere, would otherwise
// write its stale state back over the other's acknowledged calls
// (TestPausedReplicaDoesNotWriteBackOverLostRecord,
// TestLiveReplicaMovedAwayDoesNotWriteBackOverLostRecord). What this
// does not see: a replica cut off from the store alone while the store,
// reachable by others, came back empty.
func (d *Keeper) newestHere(last, fence uint64, verified, asked time.Time) bool {
	switch {
	case !verified.IsZero() && elapsed(verified, asked) < memoryGrace:
		// No one could claim meanwhile: the store's lease. (Not the
		// counter first: this replica's own bumps whose answers it
		// lost move it too, TestRelostUnreadRecordKeepsState.)
		return true
	case last != 0 && statestore.Epoch(last) == statestore.Epoch(fence):
		return fence == last+1
	}
	return !verified.IsZero() && d.beats.awayExplains(verified.Sub(clockBase), asked.Sub(clockBase))
}

// goneFrom returns the plugins of saved (a claim's "p/NAME" fields) that
// rec does not hold, each noted lost with the store.
func goneFrom(saved map[string]fieldSum, rec map[string][]byte) map[string]NotSaved {
	var gone map[string]NotSaved
	for field := range saved {
		name, ok := strings.CutPrefix(field, "p/")
		if _, held := rec[field]; !ok || held {
			continue
		}
		if gone == nil {
			gone = map[string]NotSaved{}
		}
		gone[name] = notSavedStoreLost
	}
	return gone
}

// stillLost adds to gone (made if nil) each plugin whose state notes say
// the store lost (a claim's unsaved notes, store-lost) and rec holds
// nothing of: no replica wrote that plugin's state back since, so it is
// lost still, whoever claimed the session meanwhile. A claim that said
// its plugins lost (lostWithStore) and met another's claim before the
// record did dropped its notes otherwise, and its next instance started
// afresh unsaid (TestStoreLostNotesKeptPastAnotherClaim). The note of
// every plugin not named (sessions.AnyPlugin) is kept the same way.
func stillLost(notes map[string]NotSaved, rec map[string][]byte, gone map[string]NotSaved) map[string]NotSaved {
	for name, why := range notes {
		if _, held := rec["p/"+name]; why != notSavedStoreLost || held {
			continue
		}
		if gone == nil {
			gone = map[string]NotSaved{}
		}
		gone[name] = why
	}
	return gone
}

// lostWithStore is recover for a replica that cannot tell that what it
// holds is the session's newest state (newestHere): another replica may
// have served the session since, and the store lost what that one
// acknowledged. Nothing is written back. Every plugin this claim knows
// of (saved, not saved, or held here) starts afresh under fence, said
// lost (store-lost), and recorded lost so that a replica taking the
// session over says it too: a reset said, never an older state restored
// silently. c.mu is held.
func (d *Keeper) lostWithStore(ctx context.Context, key sessions.Key, c *Claim, fence uint64, why string) error {
	d.log.Warn("state store lost the session's record, and "+why+": its plugins' states are said lost", "session", key.String())
	d.obs.StoreLost()
	lost := map[string]NotSaved{}
	for field := range c.saved {
		if name, ok := strings.CutPrefix(field, "p/"); ok {
			lost[name] = notSavedStoreLost
		}
	}
	for name := range c.unsaved {
		lost[name] = notSavedStoreLost
	}
	for _, name := range d.ses.Plugins(key) {
		lost[name] = notSavedStoreLost
	}
	// And every other plugin: the session may have used one first on a
	// replica that served it meanwhile, whose state the store lost too,
	// and nothing here names it (sessions.AnyPlugin; "p/*/" in the record).
	lost[sessions.AnyPlugin] = notSavedStoreLost
	clear(c.saved)
	clear(c.bases)
	clear(c.baseBytes)
	clear(c.unsaved)
	c.fence, c.dirty = fence, false
	if err := d.seed(ctx, key, c, nil, fence, lost); err != nil {
		return err
	}
	maps.Copy(c.unsaved, lost)
	if err := d.putLocked(ctx, c, "mcp", mcpOr(c.mcp)); err != nil {
		return unavailable(err)
	}
	// Recorded now, as far as the store answers; writeLost (the
	// heartbeat, a drain) records the rest.
	for name := range lost {
		pr := pluginRecord{Lost: "the state store lost this session's saved state", Reason: ReasonStoreLost, Done: c.done[name], Ran: c.ran[name]}
		b, base, _, err := c.encodePlugin(name, pr, nil, false, nil)
		if err == nil {
			_, err = d.putState(ctx, c, name, b, base, nil)
		}
		if err != nil {
			break
		}
		delete(c.unsaved, name)
	}
	return nil
}

// unsavedOf returns why plugin name's last state is not saved, as c
// knows: its own note, else, for a plugin with no field saved under c,
// the note of every plugin not named (sessions.AnyPlugin). The caller
// holds c.mu.
func (c *Claim) unsavedOf(name string) NotSaved {
	if why := c.unsaved[name]; why != "" {
		return why
	}
	if _, saved := c.saved["p/"+name]; saved {
		return ""
	}
	return c.unsaved[sessions.AnyPlugin]
}

// claimNotes are what a claim knew of the instances of its session, taken
// when it is retired (retireTaking).
type claimNotes struct {
	seeded, fence uint64
	verified      time.Time
	dirty         bool
	saved         map[string]fieldSum
	mcp           []byte
	unsaved       map[string]NotSaved
	done          map[string][]Once
	ran           map[string][]byte
}

// retireTaking retires c, a claim this replica forgot, and returns its
// notes, in one step: none of its writes is missed, and none follows.
func (c *Claim) retireTaking() claimNotes {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retired = true
	return claimNotes{seeded: c.seeded, fence: c.fence, verified: c.verified, dirty: c.dirty, saved: maps.Clone(c.saved), mcp: c.mcp,
		unsaved: maps.Clone(c.unsaved), done: maps.Clone(c.done), ran: maps.Clone(c.ran)}
}

// resume takes over what a claim this replica forgot knew of the
// instances it still holds (old, its notes), for c, its new claim, made
// while no one else claimed the session (rec is the record read after
// it): they stay, under the fence they were seeded with, and c writes
// under its own. A plugin whose last state was not saved keeps its notes
// if its instance is still here (its results kept for at-most-once
// calls; the state is saved again once the store answers); if not, that
// state is lost, and its next instance says so (stateReset not-saved).
// c.mu is held.
func (d *Keeper) resume(ctx context.Context, key sessions.Key, c *Claim, old claimNotes, rec map[string][]byte) error {
	if err := d.seed(ctx, key, c, rec, old.seeded, old.unsaved); err != nil {
		return err
	}
	// A write of old's fence that got no answer may still land: what
	// was read of the plugins' bases may be stale (learnBase).
	c.dirty = old.dirty && c.fence == old.fence
	if c.dirty {
		clear(c.bases)
	}
	for name, why := range old.unsaved {
		// Kept for a plugin whose instance is gone too (seed told the
		// session layer it starts afresh): writeLost records that its
		// state is lost, so that a replica taking the session over says
		// so as well (TestEvictedUnsavedLostAfterResume).
		c.unsaved[name] = why
		c.done[name], c.ran[name] = old.done[name], old.ran[name]
		if d.ses.Holds(key, name) {
			delete(c.saved, "p/"+name)
		}
	}
	d.log.Info("session claimed again: its instances here are current", "session", key.String(), "unsaved", len(old.unsaved))
	return nil
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
func (d *Keeper) recover(ctx context.Context, key sessions.Key, c *Claim, fence uint64) error {
	d.log.Warn("state store lost the session's record: writing back what this replica holds", "session", key.String(), "epochChanged", statestore.Epoch(fence) != statestore.Epoch(c.fence))
	d.obs.StoreLost()
	if err := d.announceLost(key, c); err != nil {
		return err
	}
	clear(c.saved)
	clear(c.bases)
	clear(c.baseBytes)
	c.fence = fence
	c.dirty = false
	if err := d.putLocked(ctx, c, "mcp", mcpOr(c.mcp)); err != nil {
		return unavailable(err)
	}
	d.writeBack(key, c)
	return nil
}

// writeBack writes the states of the instances this replica holds of
// key's session back into its record, which the store lost (recover,
// relost), off the caller's goroutine: each waits for c.mu, which the
// caller holds. One that fails does not stop the others; it stays marked
// not saved (announceLost), so that the heartbeat saves it again. c.mu is
// held.
func (d *Keeper) writeBack(key sessions.Key, c *Claim) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		rctx, cancel := context.WithTimeout(context.Background(), 10*d.timeout())
		defer cancel()
		failed := 0
		err := d.ses.Instances(rctx, key, func(name string, inst *plugins.Instance, f uint64) error {
			_, err := d.checkpoint(rctx, c, inst.Plugin(), inst, f, nil, time.Time{}, "")
			if errors.Is(err, errMoved) && !errors.Is(err, errStaleInstance) {
				return err // the session is another claim's now
			}
			if err != nil {
				failed++
			}
			return nil
		})
		if err != nil || failed > 0 {
			d.log.Warn("state store: writing back a lost session", "session", key.String(), "failed", failed, "error", err)
		}
	}()
}

// announceLost seeds, when the store lost key's record, each plugin
// whose state was saved there and whose instance this replica no longer
// holds as lost: its next instance starts afresh, and the client is told
// (a reset with reason "store-lost"). Each whose instance it holds is
// marked not saved until writeBack writes it: one the write-back misses
// is then saved again by the heartbeat, and an eviction meanwhile says
// its state was reset (Keeper.Saved). c.mu is held.
func (d *Keeper) announceLost(key sessions.Key, c *Claim) error {
	lost := map[string]sessions.Seed{}
	for field := range c.saved {
		name, ok := strings.CutPrefix(field, "p/")
		switch {
		case !ok:
		case !d.ses.Holds(key, name):
			lost[name] = sessions.Seed{Lost: "the state store lost this session's saved state", Reason: ReasonStoreLost}
			// Recorded lost by writeLost (the heartbeat, a drain), so
			// that a replica taking the session over says so too,
			// rather than start it afresh without a word
			// (TestStoreLostUnheldPluginSaidElsewhere).
			c.unsaved[name] = notSavedStoreLost
		case c.unsaved[name] == "":
			c.unsaved[name] = NotSavedUnavailable
		}
	}
	if len(lost) == 0 {
		return nil
	}
	return d.ses.Seed(key, lost, c.seeded)
}

// seed gives key's client the instance states of rec (nil: none, the
// session's states are new), under fence: instances of another fence are
// retired. The plugins of unsaved had a newer state than rec's, which was
// not saved: their next instances start afresh, and say so. ctx is the
// request's that takes the session (Options.OpenHandle). c.mu is held.
func (d *Keeper) seed(ctx context.Context, key sessions.Key, c *Claim, rec map[string][]byte, fence uint64, unsaved map[string]NotSaved) error {
	seeds := map[string]sessions.Seed{}
	for field, v := range rec {
		name, ok := strings.CutPrefix(field, "p/")
		if !ok {
			continue
		}
		pr, err := readPlugin(rec, name)
		if err != nil {
			seeds[name] = sessions.Seed{Lost: "its saved state is unreadable: " + err.Error()}
			continue
		}
		c.saved[field] = sumOf(v)
		c.learnBase(name, rec)
		// Within the bounds a write keeps, whole digests only: a
		// record is sealed, but its reader does not rely on it.
		ran := pr.Ran[len(pr.Ran)%ranSize:]
		c.done[name] = pr.Done[max(0, len(pr.Done)-maxOnce):]
		c.ran[name] = ran[max(0, len(ran)-maxRan*ranSize):]
		if pr.Lost != "" {
			seeds[name] = sessions.Seed{Lost: pr.Lost, Reason: pr.Reason}
			continue
		}
		seeds[name] = sessions.Seed{State: &plugins.State{Host: pr.Host, SHA256: pr.SHA256, Data: pr.Data}, Unsaid: pr.Unsaid}
	}
	if key.Kind() == sessions.KindHandle {
		if err := d.openHandle(ctx, key); err != nil {
			return err
		}
	}
	for name, why := range unsaved {
		seeds[name] = sessions.Seed{Lost: "its last state was not saved", Reason: ReasonNotSaved}
		if why == notSavedStoreLost {
			seeds[name] = sessions.Seed{Lost: "the state store lost this session's saved state", Reason: ReasonStoreLost}
		}
	}
	if err := d.ses.Seed(key, seeds, fence); err != nil {
		return err
	}
	if b, ok := rec["grants"]; ok {
		// The person's answers to run-time grant questions move with
		// the session (Options.RestoreGrants).
		if err := d.restoreGrants(ctx, key, b); err != nil {
			d.log.Warn("session adopted without its grant answers", "session", key.String(), "error", err)
		}
	}
	c.seeded = fence
	if rec != nil {
		d.log.Info("session adopted", "session", key.String(), "plugins", len(seeds))
		d.obs.Adopted()
	}
	return nil
}

// forget drops c, this replica's claim on key, without touching the
// store: the session's next request claims it again (take). The claim is
// kept aside until then (Keeper.forgotten). A claim that is no longer
// key's (a newer one took its place) is left alone.
func (d *Keeper) forget(key sessions.Key, c *Claim) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.claims[key] != c {
		return
	}
	d.forgotten[key] = c
	delete(d.claims, key)
}

// Ended deletes an ended session's record: its client closed it, or it
// timed out. Not at drain or close, whose sessions live on elsewhere. A
// session whose claim this replica no longer has (the heartbeat swept
// it) is claimed again to be deleted, only if this replica still held it
// in the store: one that another replica claimed since (the client went
// on there) may still be in use whoever holds it now, live, drained or
// dead, and its record is left to expire. A review found a replica whose
// claim was fenced and forgotten deleting, at its copy's idle timeout,
// the record of the calls another replica had acknowledged since
// (TestEndedAfterForgetLeavesOthersRecord).
func (d *Keeper) Ended(key sessions.Key) {
	d.mu.Lock()
	c := d.claims[key]
	delete(d.claims, key)
	delete(d.forgotten, key)
	d.dropPending(key)
	if key.Kind() == sessions.KindConn {
		delete(d.adopted, key.ID())
	}
	d.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), d.timeout())
	defer cancel()
	if c == nil {
		id := StoreID(key)
		if id == "" {
			return
		}
		// Not stolen: a session that ended here by timing out may live on
		// at the replica that holds it now.
		c = newClaim(key, id)
		cl, err := d.store.Claim(ctx, id, d.owner, d.ttl(), false)
		if errors.Is(err, statestore.ErrHeld) || errors.Is(err, statestore.ErrLeased) {
			return // another holds it
		}
		if err != nil {
			d.log.Warn("state store: delete ended session", "session", key.String(), "error", err)
			return
		}
		if !cl.Held {
			if err := d.store.Release(ctx, id, cl.Fence); err != nil {
				d.log.Warn("state store: release ended session", "session", key.String(), "error", err)
			}
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
	d.release(c.id)
}
