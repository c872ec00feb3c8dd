package durable

import (
	"context"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// ServeElsewhere reports whether a request of session id (its store ID,
// [StoreID]) is better refused by this replica before it runs, for the
// proxy to send it to another: this replica holds the session on a claim
// verified more than memoryGrace ago, so that it would refuse the request
// anyway ([Keeper.BeforeCall]: ErrStateUnavailable), the store does not
// answer it now, and as far as this replica can tell the store still
// holds the session's record, so that another replica that reaches the
// store takes the session over from it. When the store is away for every
// replica, the other refuses it as this one would have.
//
// The other replica must find the record: a session it cannot find in a
// store that answers it is unknown (a 2025-11-25 session answered 404,
// which ends it at the client; a handle refused), while this replica
// could have written it back from memory once it reached the store. So
// the session is handed over only when nothing says the store lost it:
//
//   - "Now" is a probe of the store (a heartbeat, past the breaker) made
//     for this request, once the breaker or the heartbeat's last round
//     said the store was away: a store back holds what it holds, and
//     this replica serves the session itself. The fault suite's
//     redis-down-10s lost five sessions while this trusted the last
//     heartbeat round.
//   - The probe must have met silence (a timeout: a link blackholed, a
//     store frozen), and no exchange since this replica last read the
//     store's epoch may have met a connection refused or dropped: a
//     store whose process went down may come back empty (Redis without
//     persistence), and is back for the others before it is for this
//     replica (go-redis dials again once a second after a run of refused
//     dials). Handing over then lost a session of s3's in
//     redis-down-10s, 0.8 s after Redis came back
//     (TestStoreDownBackEmptyKeepsSessionHere; refused, then silent:
//     TestStoreRefusedThenSilentKeepsSessionHere). go-redis's retries
//     hide what an exchange met, so the Redis store marks one that met a
//     refusal or a drop (statestore.ErrDropped: TestRedisFaultsClassified).
//   - The claim's fence is of the store's epoch as this replica last
//     saw it: one of an earlier epoch names a record the store lost.
//   - The claim was verified once (its record written or read): a
//     session this replica began while the store was away holds no claim
//     at all, and is served from memory.
//   - The policy is [CheckpointAfterCall]: with [CheckpointOnDrain] the
//     record holds nothing since the last drain, and no result said so
//     (no notSaved mark), so the other replica would lose the session's
//     calls unsaid (TestCutOffDrainPolicyKeepsSessionHere); the session
//     stays here, refused -32053 until the store answers again.
//
// Not seen: a store restarted empty behind a link that only went silent
// for this replica, or one whose restart came back within the
// heartbeat's round without this replica's connections noticing. The
// other replica, which saw the store's epoch change or finds its loss
// recorded by one that did, answers the session it cannot find "not now"
// for a while (LostLately), and this one writes it back once it reaches
// the store.
//
// What a call served from memory within the grace did is in no record
// (its result said notSaved): the other replica goes on from the state
// the store holds, as the mark warned, as it does for a replica failed
// over by the proxy.
//
// Readiness is not this: a replica cannot tell the store down for every
// replica from being cut off from it alone, and a proxy with every
// replica unready has none left to serve what memory still can. A
// request's refusal is retried by the proxy elsewhere, which tells the
// two apart. A claim whose session is in use (its lock held) is left to
// BeforeCall: its call ends within a store timeout, and this is asked
// before every call.
func (d *Keeper) ServeElsewhere(ctx context.Context, id string) bool {
	if id == "" || d.policy != CheckpointAfterCall || !d.StoreAway() || d.refusedLately() {
		return false
	}
	var c *Claim
	d.mu.Lock()
	for _, cl := range d.claims {
		if cl.id == id {
			c = cl
			break
		}
	}
	d.mu.Unlock()
	if c == nil {
		return false
	}
	select {
	case <-c.ready:
	default:
		return false
	}
	if c.err != nil || !c.mu.TryLock() {
		return false
	}
	fresh := !c.stale && !c.verified.IsZero() && elapsed(c.verified, time.Now()) < memoryGrace
	epoch := d.epoch.Load()
	held := !c.verified.IsZero() && !c.retired && (epoch == 0 || statestore.Epoch(c.fence) == epoch)
	c.mu.Unlock()
	if fresh || !held {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	err := d.store.Heartbeat(pctx, d.owner, heartbeatTTL)
	return err != nil && ctx.Err() == nil && unanswered(d.observe(err)) && silent(err) && !d.refusedLately()
}

// refusedLately reports whether the store refused or dropped a
// connection of this replica's (any exchange: bounded notes it) since
// this replica last read the store's epoch (or ever, before a first
// read): its process went down in this outage, and may have come back
// empty.
//
// Only an epoch read clears it, not any answer of the store's (a
// heartbeat, a claim, a read): an answer says the store is up, not that
// it still holds what it held, and what the hand-over trusts past the
// mark is the epoch this replica last saw, a claim of which names a
// record the store has. A store back empty answers everything, under a
// new epoch; cleared by that answer, with the new epoch not read yet (the
// link cut between the heartbeat and its epoch read, or before the next
// round), a claim of the old epoch would read as held and be handed over
// to a store that lost its record. Cleared once an epoch read begun after
// the refusal was answered, the store's epoch as it is since is the one
// this replica holds, and a claim of a lost epoch is kept here. The
// refusal is dated when its exchange ended and the read when it began,
// so that one in flight alongside the read is not forgotten.
func (d *Keeper) refusedLately() bool {
	at := d.refusedAt.Load()
	return at != 0 && at >= d.epochAt.Load()
}

// StoreAway reports whether the store does not answer this replica now:
// the breaker is open, or the heartbeat's last round went unanswered.
// False without a store.
func (d *Keeper) StoreAway() bool {
	if d == nil {
		return false
	}
	if d.open() {
		return true
	}
	d.beats.mu.Lock()
	defer d.beats.mu.Unlock()
	return d.beats.failing
}

// lostHold is how long after the store came back empty (a new epoch) a
// session it does not hold is "not now" rather than unknown
// (LostLately).
const lostHold = time.Minute

// LostLately reports whether the store came back empty (its epoch
// change) within lostHold, as this replica saw it or as the store's
// record of its loss says, reading the store's epoch now if it knows of
// no loss lately (its heartbeat reads it only every 2 s). A session
// the store does not hold may then be one a replica cut off from the
// store alone still holds: its link silent, nothing told it of the loss,
// so past its grace it hands the session over (ServeElsewhere), and it
// writes the session back once its link returns. Answered as unknown (a
// 2025-11-25 session 404, a handle refused) the session ends at the
// client (TestCutOffStoreBackEmptyLosesNoSession); answered "not now" it
// is retried until then, for lostHold at most: a session whose replica
// died with the store's data is unknown after all, said so that much
// later.
//
// A replica that never saw the earlier epoch (started since the loss:
// the proxy's fallback may be one restarted or added) learns of it from
// the record a replica that saw it left in the store, dated by the
// store's clock (statestore.Loss), so that every replica holds back
// alike whatever its clock: the record is written with the epoch read
// that saw the change, by the first replica to read the store after it
// came back (a live one's heartbeat, within 2 s). When no replica that
// reaches the store saw the earlier epoch (each restarted with the
// store), nothing records the loss, and a session the store does not
// hold is unknown. The record comes with the epoch read this made
// already when it knew of no loss (no exchange more), and only for a
// session the store does not hold. The error is the epoch read's, when
// the store did not answer it.
func (d *Keeper) LostLately(ctx context.Context) (bool, error) {
	if d == nil {
		return false, nil
	}
	if d.lostRecently() {
		return true, nil
	}
	if _, err := d.noteEpoch(ctx); err != nil {
		return false, d.observe(err)
	}
	return d.lostRecently(), nil
}

func (d *Keeper) lostRecently() bool {
	return int64(sinceBase()) < d.lostUntil.Load()
}
