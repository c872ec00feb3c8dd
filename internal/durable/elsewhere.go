package durable

import (
	"context"
	"time"
)

// ServeElsewhere reports whether a request of session id (its store ID,
// [StoreID]) is better refused by this replica before it runs, for the
// proxy to send it to another: this replica holds the session on a claim
// verified more than memoryGrace ago, so that it would refuse the request
// anyway ([Keeper.BeforeCall]: ErrStateUnavailable), and the store does
// not answer it now. Another replica that reaches the store takes the
// session over; when the store is away for every replica, the other
// refuses it as this one would have.
//
// "Now" is a probe of the store (a heartbeat, past the breaker) made for
// this request, once the breaker or the heartbeat's last round said the
// store was away: a store back, but back empty, holds nothing of the
// session, which only this replica has, and another replica would find
// it unknown (a 2025-11-25 session answered 404, a handle refused). The
// fault suite's redis-down-10s lost five sessions so while this trusted
// the last heartbeat round. A store that comes back between the probe
// and the other replica's claim still does (a few milliseconds).
//
// Readiness is not this: a replica cannot tell the store down for every
// replica from being cut off from it alone, and a proxy with every
// replica unready has none left to serve what memory still can. A
// request's refusal is retried by the proxy elsewhere, which tells the
// two apart. A claim whose session is in use (its lock held) is left to
// BeforeCall: its call ends within a store timeout, and this is asked
// before every call.
func (d *Keeper) ServeElsewhere(ctx context.Context, id string) bool {
	if id == "" || !d.StoreAway() {
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
	c.mu.Unlock()
	if fresh {
		return false
	}
	pctx, cancel := context.WithTimeout(ctx, d.timeout())
	defer cancel()
	err := d.store.Heartbeat(pctx, d.owner, heartbeatTTL)
	return err != nil && ctx.Err() == nil && unanswered(d.observe(err))
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
