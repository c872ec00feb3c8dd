package durable

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// ErrRunAgain is [Keeper.AfterUncheckedCall]'s answer for a call that ran
// on a stale instance: another replica served the session since this
// one's instances started. Nothing of the call is kept or sent; the
// caller drops the instance (its lease is done with sessions.ErrMoved)
// and runs the call again after [Keeper.BeforeCall], which takes the
// session over from the store.
var ErrRunAgain = errors.New("the call ran on a stale instance: run it again")

// CheckLater returns this replica's claim on key's session for a call
// that may run before the claim is checked, or nil when the call must be
// claimed first ([Keeper.BeforeCall]).
//
// Only a call that can have no effect outside its instance may run so
// (plugins.Plugin.Contained): its checkpoint ([Keeper.AfterUncheckedCall])
// checks the claim instead, in the fenced write of the call's state (or a
// fenced renewal, the state unchanged), before its result is sent. That
// write proves that no one claimed the session since this replica last
// read it, so the instance was current all along; a call then costs one
// exchange with the store instead of two (docs/DESIGN.md, "Checking the
// claim after a contained call"). A claim is returned only when nothing
// says it is not current: the store answering (the breaker closed), the
// claim taken and its record read since it last moved (not stale), no
// write of it unanswered (dirty), and with the after-call policy.
func (d *Keeper) CheckLater(key sessions.Key) *Claim {
	if d == nil || d.policy != CheckpointAfterCall || d.open() {
		return nil
	}
	d.mu.Lock()
	c := d.claims[key]
	d.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c.ready:
	default:
		return nil
	}
	if c.err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stale || c.dirty || c.recheck || c.retired || c.verified.IsZero() {
		return nil
	}
	if d.ses.Fence(key) != c.seeded {
		return nil // ended here and back: seeded again first (verify)
	}
	return c
}

// ErrOutcomeUnknown is [Keeper.AfterUncheckedCall]'s answer for a call
// whose claim could not be checked to a conclusion: the store did not
// answer (past the 2 s a session may be served from memory), or the
// session moved while the call's own write may have landed. The call
// fails, telling its client that its effect may or may not have been
// kept (a retry under the same idempotency key is answered with its
// result if it was); the caller keeps the instance (its lease is done
// with the guest's own error, none when the guest succeeded), and the
// session's next request is claimed first.
var ErrOutcomeUnknown = errors.New("the state store did not confirm this call: its effect may or may not have been kept; call the tool again with the same idempotency key (dev.wasmtools/idempotencyKey) to be answered with its result if it was")

// AfterUncheckedCall is [Keeper.AfterCall] for a call run on l under c,
// from [Keeper.CheckLater], before its claim was checked; started is when
// the call started (before its lease). The checkpoint's write checks the
// claim; when it did not (nothing written: the instance failed, the state
// was refused; or the write failed), the claim is checked now
// ([Keeper.CheckSince]).
//
// Run again only when nothing of the call can be in the store and its
// instance is known stale: ErrRunAgain (the caller drops the instance).
// When the claim cannot be checked, or the session moved while the
// call's own write may have landed: ErrOutcomeUnknown (the caller keeps
// the instance; no claim is forgotten, and the next request verifies the
// claim, reading the record if anyone claimed since, before anything
// runs). A claim that cannot be checked but was verified within the last
// 2 s serves the result as from memory ([NotSavedUnavailable]).
func (d *Keeper) AfterUncheckedCall(ctx context.Context, key sessions.Key, c *Claim, l *sessions.Lease, first *Once, started time.Time) (NotSaved, error) {
	if c == nil {
		return "", nil
	}
	var why NotSaved
	var err error
	if d.policy == CheckpointAfterCall && !l.Plugin().Stateless() && l.Instance().Err() == nil {
		// Saved even if the client is gone: the call's effect is in
		// the instance, and the store must not fall behind it.
		why, err = d.checkpoint(statestore.Detach(ctx), c, l.Plugin(), l.Instance(), l.Fence(), first, started, unsaidOf(l))
	}
	switch {
	case errors.Is(err, errLostHere):
		// Nothing written, and not run again: the call fails, and the
		// client's next call is told its state was lost.
		return why, err
	case errors.Is(err, errStaleInstance):
		// Nothing written; the claim is current, the instance is not.
		return why, ErrRunAgain
	case errors.Is(err, errMoved):
		// The store refused the write: another claim holds the
		// session. Nothing of the call landed.
		d.forget(key, c)
		d.log.Info("session taken over by another replica: the call runs again", "session", key.String())
		return why, ErrRunAgain
	case errors.Is(err, errUnverified):
		// Not written (the breaker is open), and the instance is kept
		// if the claim cannot be checked now: noted as not saved, so
		// that an eviction says its state was reset rather than
		// restoring the store's older one (Keeper.Saved), and the
		// heartbeat saves it once the store answers.
		// The call is not failed here (its instance, which holds its
		// effect, is kept): its key is kept too, so that a retry after
		// ErrOutcomeUnknown is answered from this run, not run again
		// (checkpoint keeps keys only for calls it acknowledges: a
		// review, stop 64, TestOutcomeUnknownRetryNotRunTwice).
		c.mu.Lock()
		if !c.retired && l.Fence() == c.seeded {
			c.unsaved[l.Plugin().Name()] = NotSavedUnverified
			c.remember(l.Plugin().Name(), first)
		}
		c.mu.Unlock()
	case err != nil:
		d.log.Warn("checkpoint of a call run before its claim was checked", "session", key.String(), "plugin", l.Plugin().Name(), "reason", why, "error", err)
	}
	checked, err := d.checkSince(ctx, key, c, l, started, mayHaveLanded(err) || errors.Is(err, errUnverified))
	return cmp.Or(checked, why), err
}

// CheckSince checks c, the claim of a call run on l before it was checked
// ([Keeper.CheckLater]), unless something verified it since the call
// started: before a result of the call is sent, a failure included (a
// guest's error may be as stale as its result). ErrRunAgain says the
// instance was stale; ErrOutcomeUnknown that the claim could not be
// checked (see AfterUncheckedCall); a claim that could not be checked
// but was verified within the last 2 s is accepted, as from memory
// ([NotSavedUnavailable]).
func (d *Keeper) CheckSince(ctx context.Context, key sessions.Key, c *Claim, l *sessions.Lease, started time.Time) (NotSaved, error) {
	return d.checkSince(ctx, key, c, l, started, false)
}

// checkSince is CheckSince. maybe: the call's own write failed in a way
// that may have landed it, or was never sent (the breaker open), so that
// the instance may hold the only copy of the call's effect: the call is
// never run again then, as its first run may be in the store, or be the
// only copy of its effect.
func (d *Keeper) checkSince(ctx context.Context, key sessions.Key, c *Claim, l *sessions.Lease, started time.Time, maybe bool) (NotSaved, error) {
	c.mu.Lock()
	checked := !c.verified.Before(started)
	seeded := c.seeded
	c.mu.Unlock()
	if checked && l.Fence() == seeded {
		return "", nil
	}
	d.mu.Lock()
	current := d.claims[key] == c
	d.mu.Unlock()
	if !current {
		// Forgotten since (another call of the session could not be
		// saved or checked): the session's next request claims it
		// again, and resumes this claim's instances if no one claimed
		// since.
		return d.unknown(key, c, "its claim was forgotten meanwhile")
	}
	verr := d.verify(context.WithoutCancel(ctx), key, c)
	c.mu.Lock()
	moved := c.seeded != seeded || l.Fence() != c.seeded || c.retired
	fresh := !moved && !c.stale && elapsed(c.verified, time.Now()) < memoryGrace
	c.mu.Unlock()
	switch {
	case verr == nil && !moved:
		return "", nil
	case verr == nil && !maybe:
		// Taken over and read again: the session's instances are
		// seeded from the store under the new fence.
		return "", ErrRunAgain
	case verr == nil:
		// Taken over, but this call's write may be in what the other
		// replica read: not run again.
		return d.unknown(key, c, "the session moved while its write may have landed")
	case fresh:
		d.markRecheck(c)
		return NotSavedUnavailable, nil
	}
	return d.unknown(key, c, verr.Error())
}

// unknown ends a call whose claim could not be checked to a conclusion:
// ErrOutcomeUnknown, the session's next request claimed first. c's notes
// stay as they are (a state not saved is saved again once the store
// answers, or resumed with its instance by the next claim).
func (d *Keeper) unknown(key sessions.Key, c *Claim, why string) (NotSaved, error) {
	d.markRecheck(c)
	d.log.Warn("call not confirmed: its claim could not be checked", "session", key.String(), "why", why)
	return NotSavedUnverified, ErrOutcomeUnknown
}

// markRecheck has the next request of c's session claim it first
// (CheckLater refuses c until a claim of it is answered: verify).
func (d *Keeper) markRecheck(c *Claim) {
	c.mu.Lock()
	c.recheck = true
	c.mu.Unlock()
}
