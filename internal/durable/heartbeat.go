package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
)

// Heartbeat timing: a replica says it is alive every heartbeatEvery, for
// heartbeatTTL.
const (
	heartbeatTTL   = 6 * time.Second
	heartbeatEvery = 2 * time.Second
)

// Heartbeat says this replica is alive until ctx ends, and drops the
// claims of clients the session layer no longer has.
func (d *Keeper) Heartbeat(ctx context.Context) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		d.beats.beat(sinceBase())
		hctx, cancel := context.WithTimeout(ctx, heartbeatEvery)
		at := sinceBase()
		err := d.store.Heartbeat(hctx, d.owner, heartbeatTTL)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("state store heartbeat", "error", err)
		}
		if ctx.Err() == nil {
			d.beats.answered(at, !unanswered(err))
		}
		if err == nil {
			if _, err := d.noteEpoch(hctx); err != nil && ctx.Err() == nil {
				d.log.Warn("state store: epoch", "error", err)
			}
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

// noteEpoch asks the store for its epoch, telling it the one this
// replica saw before: a store that came back empty since (a new epoch)
// records that it lost the earlier one, for the session timeout (the
// longest a client's record lives idle, d.ttl) or lostHold, whichever is
// longer: a replica started since the loss holds back for lostHold by the
// record, which a session timeout under a minute ended sooner
// (TestLostLatelyShortSessionTimeout). It returns whether such a loss was
// recorded for the store's epoch within the session timeout, by this
// replica or another (a client header first seen later is a new one,
// whatever it had would have expired), and holds back what the store does not hold (lostUntil) for
// lostHold after the loss this replica saw or the store recorded,
// whichever is later: a replica started since the loss, which never saw
// the earlier epoch, learns of it from the record. The heartbeat calls
// it each round, so that a live replica records a loss though no client
// of its own comes back, and take for a client header the store has no
// record of, which may be one whose state went with the loss
// (TestStoreBackEmptyHeaderClientToldReset).
//
// An epoch read that leaves this replica holding the store's answer
// moves epochAt to when it was asked (never back): a refusal noted
// before then is forgotten (refusedLately).
func (d *Keeper) noteEpoch(ctx context.Context) (lost bool, err error) {
	seen := d.epoch.Load()
	asked := int64(sinceBase())
	e, loss, err := d.store.Epoch(ctx, seen, max(d.ttl(), lostHold))
	if err != nil {
		return false, fmt.Errorf("state store: epoch: %w", err)
	}
	if d.epoch.CompareAndSwap(seen, e) && seen != 0 && e != seen {
		d.holdLost(sinceBase() + lostHold)
		d.log.Warn("state store came back empty (a new epoch): its loss is recorded", "was", seen, "now", e)
	}
	if loss.Recorded && d.lossRead.Swap(e) != e && loss.Ago < lostHold {
		// The record's age is by the store's clock, and dated back
		// from when the read was asked by this replica's: no other
		// replica's clock (the recorder's "at") enters, so a skew
		// between replicas neither shortens nor stretches the hold.
		// Dated once, from the first read of the record: a store whose
		// clock went back since it was written (a failover to a primary
		// whose clock is behind, which Redis hands expiries on to as
		// absolute times) reads it as new until it catches up, and each
		// read renewed the hold (TestLostLatelyRecordHeldAMinute).
		d.holdLost(time.Duration(asked) - loss.Ago + lostHold)
	}
	// Another read's answer stored meanwhile (an epoch the store had
	// before or after this one) leaves epochAt to that read's.
	for d.epoch.Load() == e {
		at := d.epochAt.Load()
		if at >= asked || d.epochAt.CompareAndSwap(at, asked) {
			break
		}
	}
	return loss.Recorded && loss.Ago < d.ttl(), nil
}

// holdLost moves lostUntil to until (ns since clockBase), never back.
func (d *Keeper) holdLost(until time.Duration) {
	for {
		at := d.lostUntil.Load()
		if int64(until) <= at || d.lostUntil.CompareAndSwap(at, int64(until)) {
			return
		}
	}
}

// checkKey checks that this replica's state key opens what the store
// holds (see statestore.CheckKey). A mismatch makes the replica not ready
// for good, saying why in /readyz and the log; a store that cannot tell
// now is asked again at the next heartbeat.
func (d *Keeper) checkKey(ctx context.Context) {
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
func (d *Keeper) sweep() {
	live := map[sessions.Key]bool{}
	for _, k := range d.ses.Keys() {
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
	for k := range d.forgotten {
		if !live[k] {
			delete(d.forgotten, k)
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
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.renewing.Store(false)
		d.renewAll(stale)
	}()
}

// renewAll renews the records of live sessions whose TTL is a third
// gone, and saves again what failed to save.
func (d *Keeper) renewAll(stale []*claimOf) {
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
	c   *Claim
}

// resave writes again the states of key's instances whose last
// checkpoint failed.
func (d *Keeper) resave(key sessions.Key, c *Claim) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*d.timeout())
	defer cancel()
	d.ses.Instances(ctx, key, func(name string, inst *plugins.Instance, fence uint64) error {
		c.mu.Lock()
		why := c.unsaved[name]
		c.mu.Unlock()
		if why == "" || why == NotSavedTooLarge || why == NotSavedUnsnapshot {
			return nil
		}
		if _, err := d.checkpoint(ctx, c, inst.Plugin(), inst, fence, nil, time.Time{}, ""); err != nil {
			return err
		}
		d.log.Info("state saved again after a failed checkpoint", "session", key.String(), "plugin", name)
		return nil
	})
	if err := d.writeLost(ctx, key, c); err != nil && !errors.Is(err, errMoved) {
		d.log.Warn("state store: a lost state not recorded", "session", key.String(), "error", err)
	}
}

// KeepAlive renews c's record while a call runs, every third of its TTL,
// so that a call longer than the session timeout keeps its session; the
// returned func stops it.
func (d *Keeper) KeepAlive(c *Claim) func() {
	if d == nil || c == nil {
		return func() {}
	}
	// A timer, not a goroutine waiting on a ticker: nearly every call
	// ends long before the first renewal, and stopping a timer wakes no
	// one (waking a goroutine on another core costs more than the rest
	// of this, on a virtual machine).
	every := d.ttl() / 3
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	mu.Lock()
	t = time.AfterFunc(every, func() {
		d.renew(c)
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	})
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
		t.Stop()
	}
}

// renew resets c's record's TTL (any activity of its session).
func (d *Keeper) renew(c *Claim) {
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

// pauseGap is the longest the heartbeat loop goes between two rounds while
// this process runs: a round waits at most heartbeatEvery for the store,
// then for its tick. A longer gap means the process did not run (SIGSTOP,
// a frozen VM, a long pause).
const pauseGap = 2*heartbeatEvery + time.Second

// beats is what the heartbeat loop saw, as durations since clockBase:
// when it ran (its first and last round, and the end of the last gap
// between two rounds longer than pauseGap), and whether the store
// answered it (the latest outage: the last answer before it, the first
// after it). Each round's heartbeat is this process's probe of the store.
type beats struct {
	mu                       sync.Mutex
	first, last, pausedUntil time.Duration
	answeredAt               time.Duration // the last round the store answered
	failing                  bool          // the last round it did not
	awayFrom, backAt         time.Duration // the latest outage; backAt 0 while it lasts
}

// beat records a round of the heartbeat loop at now.
func (b *beats) beat(now time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.first == 0 {
		b.first = now
	}
	if b.last != 0 && now-b.last > pauseGap {
		b.pausedUntil = now
	}
	b.last = now
}

// answered records whether the store answered the round at now.
func (b *beats) answered(now time.Duration, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case ok && b.failing:
		b.failing, b.backAt = false, now
	case !ok && !b.failing:
		b.failing, b.awayFrom, b.backAt = true, b.answeredAt, 0
	}
	if ok {
		b.answeredAt = now
	}
}

// ranSince reports whether this process ran without a stop from since
// to now: its heartbeat loop ran already then, has run since with no gap
// longer than pauseGap, and ran within pauseGap of now. b.mu is held.
func (b *beats) ranSince(since, now time.Duration) bool {
	return b.first != 0 && b.first <= since+pauseGap && now-b.last <= pauseGap && b.pausedUntil < since
}

// stoppedSince reports whether this process was stopped (a gap of over
// pauseGap in its heartbeat loop) after since or within pauseGap before
// it, or is coming out of a stop now (its loop has not run for pauseGap).
// A request read just after a stop may have been sent before it and sat
// in a socket's buffer meanwhile: its since is when it was read, after
// the loop's first round (pausedUntil) if that round came first. b.mu is
// held.
func (b *beats) stoppedSince(since, now time.Duration) bool {
	return b.last != 0 && (b.pausedUntil != 0 && b.pausedUntil > since-pauseGap || now-b.last > pauseGap)
}

// StoppedSince reports whether this process was stopped (SIGSTOP, a
// frozen VM: its heartbeat loop did not run for over 5 s) since t, or
// came out of a stop less than 5 s before t. A request that was in the
// process then, or sent before the stop and read after it, may have been
// given up by its client: the host does not let it take a notice the
// client must get (sessions.Lease.KeepNotice), which the next call then
// says again. False without a store (no heartbeat).
func (d *Keeper) StoppedSince(t time.Time) bool {
	if d == nil {
		return false
	}
	d.beats.mu.Lock()
	defer d.beats.mu.Unlock()
	return d.beats.stoppedSince(t.Sub(clockBase), sinceBase())
}

// awayExplains reports whether the store's latest outage explains why a
// claim verified at v went unverified until now, when the store answers
// it again: this process ran all along, and the store last answered its
// heartbeat within memoryGrace after v, and not since (or only once the
// outage was over, and the outage ended after v). A claim unverified
// while the store answered this replica went unverified because nobody
// asked this replica for the session, which may have gone on elsewhere
// (a review, stop 59).
func (b *beats) awayExplains(v, now time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ranSince(v, now) && b.awayFrom != 0 && b.awayFrom <= v+memoryGrace && (b.failing || b.backAt >= v)
}
