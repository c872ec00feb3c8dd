package durable

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/plugins"
)

// checkpoint saves inst's state (between calls), started under fence,
// into c's record. It returns why the state is not saved ("" when it
// is), and errMoved when the session changed owner since inst started
// (inst is stale: its state is not the session's). A store that lost the
// record is written back first (recover). An instance the host cannot
// snapshot is recorded as such once, so that a replica taking the
// session over says its state was lost.
//
// checkFrom, if not zero, is when the call whose state this saves started,
// a call run before its claim was checked: the write checks it then, even
// of a state unchanged, unless the claim was verified since.
//
// unsaid is the reason of a reset the call's client may not have been told
// of (unsaidOf), recorded with the state (pluginRecord.Unsaid).
func (d *Keeper) checkpoint(ctx context.Context, c *Claim, p *plugins.Plugin, inst *plugins.Instance, fence uint64, first *Once, checkFrom time.Time, unsaid string) (why NotSaved, err error) {
	ctx, span := telemetry.Start(ctx, "wasmtools.checkpoint", attribute.String("wasmtools.plugin", p.Name()))
	defer func() {
		if why != "" {
			span.SetAttributes(attribute.String("wasmtools.not_saved", string(why)))
		}
		telemetry.End(span, err)
	}()
	ctx, cancel := statestore.WithTimeout(ctx, d.timeout())
	defer cancel()
	st, err := inst.SaveState(ctx)
	var pr pluginRecord
	var notSaved NotSaved
	if err != nil {
		if ctx.Err() != nil {
			// Out of time: nothing is written (not a lost state, which
			// would reset it for good), but the call was answered: its
			// key is kept for the next write, and an eviction before
			// then says the state was reset rather than serving the
			// store's older one.
			c.mu.Lock()
			defer c.mu.Unlock()
			if err := c.instanceMoved(fence); err != nil {
				return NotSavedMoved, err
			}
			c.remember(p.Name(), first)
			c.unsaved[p.Name()] = NotSavedUnavailable
			return NotSavedUnavailable, err
		}
		pr = pluginRecord{SHA256: p.SHA256(), Lost: "plugin " + p.Name() + " cannot be snapshotted: " + err.Error()}
		notSaved = NotSavedUnsnapshot
	} else {
		// A host snapshot's Data is its head, its frames in st.Frames
		// (writeState writes them).
		pr = pluginRecord{Host: st.Host, SHA256: st.SHA256, Data: st.Data, Unsaid: unsaid}
	}
	name := p.Name()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.instanceMoved(fence); err != nil {
		return NotSavedMoved, err
	}
	c.checkFrom = checkFrom
	defer func() { c.checkFrom = time.Time{} }()
	// The call's key is written with its state but kept in the claim only
	// for a call that is acknowledged (below): one that fails as not kept
	// (moved, stale, unverified, its state lost with the store's) is run
	// again when it is retried, not answered from this run, whose effect
	// is nowhere (TestUnverifiedCallKeyNotReplayedAfterResume,
	// TestLostHereCallKeyNotReplayed: a review, stop 64).
	pr.Done, pr.Ran = c.withOnce(name, first)
	keep := func() { c.done[name], c.ran[name] = pr.Done, pr.Ran }
	start := time.Now()
	written, err := d.writeState(ctx, c, name, pr, st)
	d.obs.Checkpointed(time.Since(start), written, err)
	switch {
	case err == nil:
		keep()
		delete(c.unsaved, p.Name())
		return notSaved, nil
	case errors.Is(err, errStaleInstance):
		return NotSavedMoved, err // the claim is current; the instance is not
	case errors.Is(err, statestore.ErrFenced), errors.Is(err, errMoved):
		return NotSavedMoved, errMoved
	case errors.Is(err, statestore.ErrTooLarge):
		notSaved = NotSavedTooLarge
	case refused(err):
		notSaved = NotSavedBudget // the byte budgets (TestStoreBudgetSaysOverBudget)
	case errors.Is(err, errStoreDown) && elapsed(c.verified, time.Now()) >= memoryGrace:
		// The store was not asked (the breaker is open), and the claim
		// was verified too long ago to know the instance is current
		// (this process may have been stopped while another replica
		// took the session over): the result is not sent as a success,
		// and the instance goes. (A write that was sent and got no
		// answer may still land: that call is acknowledged, marked not
		// saved, never said to have had no effect.)
		return NotSavedUnverified, errUnverified
	default:
		notSaved = NotSavedUnavailable
	}
	keep() // acknowledged, marked not saved
	c.unsaved[p.Name()] = notSaved
	return notSaved, err
}

// instanceMoved says why an instance started under fence may not be
// saved under c: errMoved when c is retired (another claim of this
// replica's replaced it), errStaleInstance when the session's instances
// were seeded since under another fence (the claim is current; only the
// instance is not). c.mu is held.
func (c *Claim) instanceMoved(fence uint64) error {
	switch {
	case c.retired:
		return errMoved
	case fence != c.seeded:
		return errStaleInstance
	}
	return nil
}

// relost claims a session whose record the store lost again, for a write
// back: errMoved if another replica claimed it meanwhile, whether it
// holds it still or wrote the session's state back and let it go (a
// drain releases its claims): what this replica holds is then older than
// the record, which the session's next claim reads (verify's rule). Else
// it writes back the MCP record now and, as recover does, every instance
// this replica holds (the caller writes its own after): writing back
// only the plugin being saved left the others' acknowledged states out
// of the record, and a replica taking the session over started them
// afresh, silently (TestRelostWritesBackEveryHeldPlugin). c.mu is held.
func (d *Keeper) relost(ctx context.Context, key sessions.Key, c *Claim) error {
	asked := time.Now() // before the claim, as verify's
	cl, err := d.store.Claim(ctx, c.id, d.owner, d.ttl(), true)
	if errors.Is(err, statestore.ErrLeased) {
		return errMoved // another replica claimed the session in the new epoch
	}
	if err != nil {
		return d.observe(err)
	}
	if cl.Previous != (statestore.Owner{}) {
		return errMoved
	}
	rec, err := d.store.Get(ctx, c.id)
	if err != nil && !errors.Is(err, statestore.ErrNotFound) {
		return d.observe(err)
	}
	if hasPlugins(rec) {
		return errMoved
	}
	if !d.newestHere(c.fence, cl.Fence, c.verified, asked) {
		// Another replica may have served the session since this
		// replica last verified its claim: this replica's instances are
		// said lost, here and in the record, rather than written back,
		// and the call whose write met the loss is not kept (its
		// instance is stale now; the claim is current). (Letting the
		// session go instead, so that such a replica could write back
		// its newer state, left this replica's next claim of it
		// resuming without the notes: the heartbeat's writeLost, fenced,
		// dropped them, and a fresh instance went on unsaid; the fault
		// suite's sigstop-redis-empty.)
		c.verified, c.taken = asked, cl.Taken
		if err := d.lostWithStore(ctx, key, c, cl.Fence, "this replica cannot tell that its state is the newest"); err != nil {
			return err
		}
		return errLostHere
	}
	d.log.Warn("state store lost the session's record: writing it back", "session", c.id)
	d.obs.StoreLost()
	if err := d.announceLost(key, c); err != nil {
		return err
	}
	clear(c.saved)
	clear(c.bases)
	clear(c.baseBytes)
	c.fence, c.dirty, c.taken = cl.Fence, false, cl.Taken
	if err := d.putLocked(ctx, c, "mcp", mcpOr(c.mcp)); err != nil {
		return err
	}
	d.writeBack(key, c)
	return nil
}

// AfterCall is the checkpoint of a call that succeeded, under the
// after-call policy. It returns why the call's state is not saved (""
// when it is, or need not be), and errMoved when another replica took the
// session over while the call ran: the claim is forgotten here (its next
// request claims it again, from the store), and the call fails (its
// effect is not in the store).
func (d *Keeper) AfterCall(ctx context.Context, key sessions.Key, c *Claim, l *sessions.Lease, first *Once) (NotSaved, error) {
	if c == nil || d.policy != CheckpointAfterCall || l.Plugin().Stateless() || l.Instance().Err() != nil {
		return "", nil
	}
	// Saved even if the client is gone: the call's effect is in the
	// instance, and the store must not fall behind it.
	notSaved, err := d.checkpoint(statestore.Detach(ctx), c, l.Plugin(), l.Instance(), l.Fence(), first, time.Time{}, unsaidOf(l))
	if errors.Is(err, errMoved) {
		if !errors.Is(err, errStaleInstance) {
			// The store says another claim holds the session: the next
			// request claims it again. (Not when only the instance is
			// older than the claim, which is current: forgetting it
			// would fail the session's other calls under it.)
			d.forget(key, c)
		}
		d.log.Warn("session taken over by another replica during a call", "session", key.String())
		return notSaved, errMoved
	}
	if errors.Is(err, errUnverified) {
		d.forget(key, c) // claimed and read again by the session's next request
		d.log.Warn("call not kept: its state could be neither saved nor verified", "session", key.String())
		return notSaved, errUnverified
	}
	if err != nil {
		d.log.Error("checkpoint: the call's state is not saved", "session", key.String(), "plugin", l.Plugin().Name(), "reason", notSaved, "error", err)
	}
	return notSaved, nil
}

// Saved is [sessions.Options.Saved]: the state of key's instance of p as
// the store keeps it, for an instance evicted for room: with after-call
// checkpoints it is the state as of its last call, so the client goes on
// as if it had never been evicted. nil when there is none (no store,
// another policy, a state that could not be saved, or another version's),
// and when the instance's last checkpoint failed: the store's state is
// older than what the client was told, and the client's next result says
// its state was reset rather than rolling it back silently. known is
// false when the store could not be asked (the breaker open, a read that
// failed, the record gone until the claim's next check writes it back):
// the lease fails as retryable rather than starting afresh, which the
// next checkpoint would write over the saved state
// (TestEvictedRestoreWithLostReadKeepsState).
func (d *Keeper) Saved(ctx context.Context, key sessions.Key, p *plugins.Plugin) (st *plugins.State, reason string, known bool) {
	if d == nil || d.policy != CheckpointAfterCall {
		return nil, "", true
	}
	d.mu.Lock()
	c := d.claims[key]
	d.mu.Unlock()
	if c == nil {
		return nil, "", true
	}
	c.mu.Lock()
	// The note stays until the plugin's next checkpoint (as Stored's
	// does): the fresh instance this reset starts is saved again by the
	// heartbeat (resave) or recorded lost (writeLost) if it goes too, so
	// that the record never keeps the older state the client was told is
	// gone (a lease that only replays a first result writes nothing:
	// TestResetSaidWithReplayIsRecorded).
	why := c.unsavedOf(p.Name())
	c.mu.Unlock()
	if why == notSavedStoreLost {
		return nil, ReasonStoreLost, true
	}
	if why != "" {
		return nil, ReasonNotSaved, true
	}
	if d.open() {
		return nil, "", false
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	rec, err := d.store.Get(ctx, c.id)
	if err != nil {
		if !errors.Is(err, statestore.ErrNotFound) {
			d.observe(err)
		}
		return nil, "", false
	}
	pr, err := readPlugin(rec, recordOf(rec, p.Name()))
	if err != nil || pr.Lost != "" || pr.SHA256 != p.SHA256() {
		return nil, pr.Reason, true // "": evicted, as ever
	}
	return &plugins.State{Host: pr.Host, SHA256: pr.SHA256, Data: pr.Data}, pr.Unsaid, true
}

// unsaidOf is the reason of the reset l's notice carries, "" if none: the
// checkpoint records it with the state, so that a replica that starts
// from the state says the reset too, until the next call saved clears it.
// Not only when l keeps its notice (sessions.Lease.KeepNotice): a call
// whose answer is written may still answer no one (the replica killed
// before the bytes left, a proxy that gave up), and the client's retry at
// another replica then went on from the fresh state unsaid (a review's
// TestResetSaidAgainAfterKilledReplica). At worst the reset is said twice.
func unsaidOf(l *sessions.Lease) string {
	if r := l.Notice().Reset; r != nil {
		return r.Reason
	}
	return ""
}

// Stored is [sessions.Options.Stored]: p's state in key's record, read
// now under this replica's claim (under: the fence the claim's instances
// are seeded under), for a plugin whose instance was dropped as moved.
// known is false without a current claim here (the session's next
// request claims it, and seeds the client), with the store away, or with
// the record gone (the claim's next check writes it back). A state this
// replica was told was not saved is lost with the instance: reason
// not-saved (the note stays until the plugin's next checkpoint, so an
// attempt that fails after this one says so again).
func (d *Keeper) Stored(ctx context.Context, key sessions.Key, p *plugins.Plugin) (st *plugins.State, reason string, under uint64, known bool) {
	if d == nil {
		return nil, "", 0, true // no store: nothing to start from
	}
	if StoreID(key) == "" {
		return nil, "", d.ses.Fence(key), true // not kept: the same
	}
	d.mu.Lock()
	c := d.claims[key]
	d.mu.Unlock()
	if c == nil || d.open() {
		return nil, "", 0, false
	}
	select {
	case <-c.ready:
	default:
		return nil, "", 0, false
	}
	if c.err != nil {
		return nil, "", 0, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stale || c.retired {
		return nil, "", 0, false
	}
	name := p.Name()
	switch c.unsavedOf(name) {
	case "":
	case notSavedStoreLost:
		return nil, ReasonStoreLost, c.seeded, true
	default:
		return nil, ReasonNotSaved, c.seeded, true
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	rec, err := d.store.Get(ctx, c.id)
	if err != nil {
		if !errors.Is(err, statestore.ErrNotFound) {
			d.observe(err)
		}
		return nil, "", 0, false
	}
	v, ok := rec["p/"+recordOf(rec, name)]
	if !ok {
		return nil, "", c.seeded, true // none saved: a fresh start
	}
	pr, err := readPlugin(rec, recordOf(rec, name))
	if err != nil || pr.Lost != "" {
		return nil, cmp.Or(pr.Reason, sessions.ReasonReplicaLost), c.seeded, true
	}
	// The claim's notes follow the state the instance starts from.
	c.saved["p/"+name] = sumOf(v)
	c.learnBase(name, rec)
	c.done[name], c.ran[name] = pr.Done, pr.Ran
	return &plugins.State{Host: pr.Host, SHA256: pr.SHA256, Data: pr.Data}, pr.Unsaid, c.seeded, true
}

// Drain checkpoints every instance of every claimed session (waiting for
// calls queued on them) and releases the claims of the sessions it saved
// whole, so that other replicas take them over at once. A session not
// saved whole keeps its claim: it is taken over once this replica's
// heartbeat ends, from its last checkpoint.
//
// It first writes the records of the sessions KeepPending keeps.
//
// ctx bounds the wait for a busy instance, as it bounded the calls in
// flight before; the exchanges with the store are each bounded by the
// store's timeout, not by what is left of ctx. Once ctx has ended, a
// session whose call still runs keeps its claim, and the others are saved
// and released all the same: a red team found one client's call that
// outlasted the grace left ctx ended for every session, none saved nor
// released (with CheckpointOnDrain, every other client lost its state).
func (d *Keeper) Drain(ctx context.Context) error {
	store := context.WithoutCancel(ctx)
	d.KeepPending(ctx)
	d.mu.Lock()
	claims := make(map[sessions.Key]*Claim, len(d.claims))
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
		if ctx.Err() != nil && d.open() {
			// Past the grace, with the store away: each exchange would
			// wait the store's timeout in turn, session after session,
			// for claims that expire with this replica's heartbeat
			// anyway (TestDrainPastGraceStopsAskingAnAwayStore).
			continue
		}
		err := d.ses.Instances(ctx, key, func(name string, inst *plugins.Instance, fence uint64) error {
			saved++
			_, err := d.checkpoint(store, c, inst.Plugin(), inst, fence, nil, time.Time{}, "")
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
		if err := d.writeLost(store, key, c); err != nil {
			if !errors.Is(err, errMoved) {
				d.log.Error("drain: a lost state not recorded", "session", key.String(), "error", err)
				firstErr = cmp.Or(firstErr, err)
			}
			continue // keep the claim, as for a checkpoint that failed
		}
		rctx, cancel := context.WithTimeout(store, d.timeout())
		c.mu.Lock()
		if err := d.observe(d.store.Release(rctx, c.id, c.fence)); err == nil {
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

// writeLost records in key's record, for each plugin whose last state
// was not saved and whose instance here is gone (evicted before the
// heartbeat could save it again), that its state is lost: the record
// still holds an older state, which a replica taking the session over
// would otherwise restore without a word, where this replica says the
// state was reset (Saved). The heartbeat's resave and Drain call it once
// the store answers; a plugin recorded lost is no longer unsaved here,
// and Saved reads the reason from the record.
//
// A claim retired or stale writes nothing: a newer claim of this replica
// may have the same fence, and a state it saved since
// (TestRetiredClaimWriteLostOverwritesNewState). A write fenced
// (another replica took the session over) is errMoved, and the notes go:
// the record is the other replica's now.
func (d *Keeper) writeLost(ctx context.Context, key sessions.Key, c *Claim) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.retired || c.stale {
		return nil
	}
	for name, why := range c.unsaved {
		if why == "" || d.ses.Holds(key, name) {
			continue
		}
		pr := pluginRecord{Lost: "its last state was not saved", Reason: ReasonNotSaved, Done: c.done[name], Ran: c.ran[name]}
		if why == notSavedStoreLost {
			pr.Lost, pr.Reason = "the state store lost this session's saved state", ReasonStoreLost
		}
		if _, err := d.writeState(ctx, c, name, pr, nil); err != nil {
			if errors.Is(err, statestore.ErrFenced) || errors.Is(err, errMoved) {
				clear(c.unsaved)
				return errMoved
			}
			return err
		}
		delete(c.unsaved, name)
	}
	return nil
}

// GrantsChanged writes key's run-time grant answers (the host's) into its
// record, so that they move with the session to another replica. A write
// that fails leaves them in this replica's memory: the person is asked
// again elsewhere, never granted what they did not approve.
func (d *Keeper) GrantsChanged(ctx context.Context, key sessions.Key) {
	b := d.exportGrants(key)
	if b == nil {
		return
	}
	c, err := d.BeforeCall(ctx, key)
	if c == nil || err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := d.putLocked(context.WithoutCancel(ctx), c, "grants", b); err != nil {
		d.log.Warn("state store: the session's grant answers not saved", "session", key.String(), "error", err)
	}
}

// KeepPending claims each new session whose record could not be written
// when it was made (the store did not answer: pending) and that no call
// claimed since (each was served from memory), which writes its record,
// so that another replica can take it over: only this replica holds it,
// and another would answer it unknown (a 2025-11-25 session 404, which
// ends it at the client: TestSessionMadeWhileStoreDownSavedByDrain; the
// fault suite's partition-store-flapping lost one so, begun in a cut and
// drained a second after the link came back). A drain calls it first:
// the host before its readiness fails, since a proxy then sends the
// session's next request to another replica at once. The store is asked
// past the breaker. With the store away still, it is asked again every
// pendingRetry, for up to half of what ctx leaves (the rest is for the
// calls in flight and the drain's writes; 10 s without a deadline): a
// store that stalls for a few seconds around a drain (Redis stopped
// during a rolling restart: the fault suite's
// redis-frozen-rolling-restart) then loses no session
// (TestDrainKeepsSessionMadeWhileStoreAwayWhenItAnswersAgain). Past that,
// such a session is lost with the replica, as before. What its calls
// served from memory did is kept: the claim finds no previous holder
// (take's keptHere), and the drain's checkpoints write the instances.
func (d *Keeper) KeepPending(ctx context.Context) {
	if d == nil {
		return
	}
	store := context.WithoutCancel(ctx)
	d.mu.Lock()
	var pending []sessions.Key
	for k := range d.pending {
		if d.claims[k] == nil {
			pending = append(pending, k)
		}
	}
	d.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	wait := maxPendingWait
	if dl, ok := ctx.Deadline(); ok {
		wait = time.Until(dl) / 2
	}
	until := time.Now().Add(wait)
	for _, key := range pending {
		if ctx.Err() != nil && d.open() {
			break // as Drain's claims
		}
		for said := false; ; said = true {
			// Asked past the breaker, which fails a claim fast for 2 s
			// after an exchange went unanswered: the store may be
			// back (the fault suite's drain came 0.2 s after the
			// link), and this is the session's last chance.
			d.downUntil.Store(0)
			_, err := d.Ensure(store, key, nil)
			if err == nil {
				break
			}
			if !unanswered(err) {
				d.log.Error("drain: a session made while the store was away not kept", "session", key.String(), "error", err)
				break
			}
			if time.Now().Add(pendingRetry).After(until) {
				// The others would wait in turn.
				d.log.Error("drain: a session made while the store was away not kept", "session", key.String(), "error", err, "pending", len(pending))
				return
			}
			if !said {
				d.log.Warn("drain: the store does not answer: waiting for it to keep the sessions made while it was away", "sessions", len(pending), "for", wait.Round(time.Millisecond))
			}
			select {
			case <-time.After(pendingRetry):
			case <-ctx.Done():
				d.log.Error("drain: a session made while the store was away not kept", "session", key.String(), "error", err, "pending", len(pending))
				return
			}
		}
	}
}

// KeepPending's pace while the store does not answer, and its wait
// without a deadline.
const (
	pendingRetry   = 250 * time.Millisecond
	maxPendingWait = 10 * time.Second
)
