package durable

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
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
	if c.stale || c.dirty || c.retired || c.verified.IsZero() {
		return nil
	}
	return c
}

// AfterUncheckedCall is [Keeper.AfterCall] for a call run under c, from
// [Keeper.CheckLater], before its claim was checked; started is when the
// call started (before its lease). The checkpoint checks the claim; when
// it did not (nothing was written: the instance failed, or the write was
// refused), the claim is checked now. ErrRunAgain says the instance was
// stale; the other errors and reasons are AfterCall's, and a call whose
// claim could not be checked (the store did not answer) is served only
// if the claim was verified within the last 2 s, as from memory
// ([NotSavedUnavailable]), else it fails as unverified.
func (d *Keeper) AfterUncheckedCall(ctx context.Context, key sessions.Key, c *Claim, l *sessions.Lease, first *Once, started time.Time) (NotSaved, error) {
	why, err := d.afterCall(ctx, key, c, l, first, started)
	switch {
	case errors.Is(err, errMoved):
		return why, ErrRunAgain // the claim is forgotten: the next request takes the session over
	case err != nil:
		return why, err
	}
	checked, err := d.CheckSince(ctx, key, c, l, started)
	return cmp.Or(checked, why), err
}

// CheckSince checks c, the claim of a call run on l before it was checked
// ([Keeper.CheckLater]), unless something verified it since the call
// started: before a result of the call is sent, a failure included (a
// guest's error may be as stale as its result). ErrRunAgain says the
// instance was stale. A claim that could not be checked (the store did
// not answer) is accepted only if it was verified within the last 2 s, as
// from memory ([NotSavedUnavailable]); otherwise the claim is forgotten
// and the call fails as unverified ([NotSavedUnverified]).
func (d *Keeper) CheckSince(ctx context.Context, key sessions.Key, c *Claim, l *sessions.Lease, started time.Time) (NotSaved, error) {
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
		// Forgotten since (a call of the session found it moved, or
		// could not save): the run again claims the session first.
		return "", ErrRunAgain
	}
	verr := d.verify(context.WithoutCancel(ctx), key, c)
	c.mu.Lock()
	moved := c.seeded != seeded || l.Fence() != c.seeded || c.retired
	fresh := !moved && !c.stale && time.Since(c.verified) < memoryGrace
	c.mu.Unlock()
	switch {
	case verr == nil && moved:
		// Taken over and read again: the session's instances are
		// seeded from the store under the new fence.
		return "", ErrRunAgain
	case verr == nil:
		return "", nil
	case errors.Is(verr, errChanged):
		return "", ErrRunAgain
	case fresh:
		return NotSavedUnavailable, nil
	}
	d.forget(key, c) // claimed and read again by the session's next request
	d.log.Warn("call not kept: its claim could not be checked", "session", key.String(), "error", verr)
	return NotSavedUnverified, errUnverified
}
