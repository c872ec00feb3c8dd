package durable

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// timeout bounds one exchange with the store.
func (d *Keeper) timeout() time.Duration { return d.exp }

// ttl is how long a session's record lives unused: the session timeout,
// or a day when sessions never time out.
func (d *Keeper) ttl() time.Duration {
	if t := d.session; t > 0 {
		return t
	}
	return 24 * time.Hour
}

// bounded is a store whose every exchange is bounded by a timeout
// (Options.StoreTimeout), whatever its caller's context allows, and
// whose every exchange that meets the store refusing or dropping a
// connection is noted in refusedAt (nil: not noted), whoever made it and
// whatever it does with its error: a refusal is what keeps a cut-off
// replica's sessions here (ServeElsewhere), and one left unnoted by an
// exchange that forgot to (a session's end, a read of a session record,
// the heartbeat's epoch) could hand a session over to a store back empty.
type bounded struct {
	statestore.Store
	d         time.Duration
	refusedAt *atomic.Int64
}

func (b bounded) Heartbeat(ctx context.Context, o statestore.Owner, ttl time.Duration) error {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	return b.ended(ctx, begun, b.Store.Heartbeat(ctx, o, ttl))
}

func (b bounded) Leave(ctx context.Context, o statestore.Owner) error {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	return b.ended(ctx, begun, b.Store.Leave(ctx, o))
}

func (b bounded) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	cl, err := b.Store.Claim(ctx, id, o, ttl, steal)
	return cl, b.ended(ctx, begun, err)
}

func (b bounded) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	return b.ended(ctx, begun, b.Store.Put(ctx, id, field, v, fence, ttl))
}

func (b bounded) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	f, err := b.Store.Renew(ctx, id, fence, ttl, bump)
	return f, b.ended(ctx, begun, err)
}

func (b bounded) Get(ctx context.Context, id string) (map[string][]byte, error) {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	rec, err := b.Store.Get(ctx, id)
	return rec, b.ended(ctx, begun, err)
}

func (b bounded) Epoch(ctx context.Context, seen uint32, window time.Duration) (uint32, statestore.Loss, error) {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	e, lost, err := b.Store.Epoch(ctx, seen, window)
	return e, lost, b.ended(ctx, begun, err)
}

func (b bounded) Release(ctx context.Context, id string, fence uint64) error {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	return b.ended(ctx, begun, b.Store.Release(ctx, id, fence))
}

func (b bounded) Delete(ctx context.Context, id string, fence uint64) error {
	ctx, cancel := statestore.WithTimeout(ctx, b.d)
	defer cancel()
	begun := time.Now()
	return b.ended(ctx, begun, b.Store.Delete(ctx, id, fence))
}

// stalledError is the failure of an exchange that says nothing of the
// store, because this process did not run while it was bounded, or
// gave the store too little of the bound: its deadline fired well after
// it was due (the process was stopped by SIGSTOP, a frozen VM, a long
// pause, or starved of CPU, while the exchange was in flight), or the
// exchange began with less than three quarters of its bound left (the
// process was stopped or slow earlier in the same call, say while it
// snapshotted the instance or made an exchange before: a checkpoint's
// steps share one bound). The store may have answered all along. On a
// machine out of CPU, either opened a replica's breaker that no
// store fault did, for hundreds of calls served from memory, notSaved
// (the fault suite's sigstop-past-proxy: 452 after an exchange given
// 265 ms; 121 after reads whose timers fired 430 ms late). It is still
// unanswered (a write may have landed), but it does not open the breaker
// (observe): a replica continued after a stop would otherwise find the
// store "down" for breakerWindow, and serve from memory sessions that
// other replicas took over while it was stopped (issue #25,
// sigstop-replica).
type stalledError struct{ err error }

func (e *stalledError) Error() string {
	return e.err.Error() + " (not the store's failure: this process was paused or slow during the call)"
}

func (e *stalledError) Unwrap() error { return e.err }

// ended is the error of an exchange begun at begun under ctx (bounded),
// whose refusal it notes: a failure for want of an answer is marked
// stalled when the store was given less than three quarters of the
// bound, or when it ended more than a quarter of the bound after its
// deadline (a timer that fires on time ends it at the deadline; a loaded
// machine's fire a little late). In a store's real outage an exchange
// given its bound soon comes (a call's first, the heartbeat's, a claim's)
// and opens the breaker; until then a call waits out its exchange rather
// than failing fast, which is all the breaker spares.
func (b bounded) ended(ctx context.Context, begun time.Time, err error) error {
	if b.refusedAt != nil && refusedConn(err) {
		b.refusedAt.Store(int64(sinceBase()))
	}
	if err == nil || !unanswered(err) {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && (dl.Sub(begun) < b.d*3/4 || time.Since(dl) > b.d/4) {
		return &stalledError{err}
	}
	return err
}

// clockBase is what the breaker's times count from: the monotonic clock
// since it, so that a step of the system clock neither holds the breaker
// open nor closes it early.
var clockBase = time.Now()

// elapsed is the time from from to to by the monotonic clock, or by the
// wall clock when that says more: the grace a replica gives what it
// verified (memoryGrace) is counted by the larger, so that a process
// whose monotonic clock stood still while the world went on (a virtual
// machine frozen, on a clock source that does not count the pause) does
// not trust its memory past what the store's lease gave it. A wall clock
// stepped forward only shortens the grace.
func elapsed(from, to time.Time) time.Duration {
	return max(to.Sub(from), to.Round(0).Sub(from.Round(0)))
}

// sinceBase is the monotonic time since clockBase.
func sinceBase() time.Duration { return time.Since(clockBase) }

// open reports whether the breaker is open: the store is not asked.
func (d *Keeper) open() bool { return sinceBase() < time.Duration(d.downUntil.Load()) }

// WaitStore waits until the breaker lets the store be asked again (at
// once if it is closed), or until ctx ends.
func (d *Keeper) WaitStore(ctx context.Context) error {
	for {
		left := time.Duration(d.downUntil.Load()) - sinceBase()
		if left <= 0 {
			return nil
		}
		t := time.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// observe trips the breaker on an error that says the store did not
// answer (not a refusal the store made).
func (d *Keeper) observe(err error) error {
	// A caller that went away (its client cancelled) says nothing of the
	// store; nor does an exchange this process stalled (stalledError).
	var stalled *stalledError
	if err != nil && unanswered(err) && !errors.Is(err, context.Canceled) && !errors.As(err, &stalled) {
		now := sinceBase()
		if prev := time.Duration(d.downUntil.Swap(int64(now + breakerWindow))); prev <= now && d.log != nil {
			// Said once as it opens, not for each call it fails: the
			// one cause of every notSaved store-unavailable of the next
			// breakerWindow, which a replica's own slowness (a machine
			// out of CPU) can bring as well as the store's.
			d.log.Warn(BreakerOpened, "error", err, "for", breakerWindow)
		}
	}
	return err
}

// Log messages the fault suite counts per replica (internal/faults): the
// breaker opening (the store did not answer an exchange within its
// bound), after which calls go on from memory, not saved, for
// breakerWindow; and each call served so (BeforeCall).
const (
	BreakerOpened     = "state store did not answer: not asked for a while (breaker open), calls served from memory marked notSaved"
	ServingFromMemory = "state store unavailable: serving the session from this replica, not saved"
)

// refusedConn reports whether err is the store's end refusing or closing
// the connection: nothing listens at its address, or the process that did
// went away. Its process is down or was, and a store that restarts may
// come back empty, which a store that only stops answering (a frozen
// process, a link blackholed) does not. A Redis store marks an exchange during which its client met
// that, or LOADING, with statestore.ErrDropped: what go-redis returns is
// its last attempt's error, often the deadline (TestRedisFaultsClassified).
func refusedConn(err error) bool {
	return err != nil && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, statestore.ErrDropped))
}

// silent reports whether err is the store answering nothing within the
// exchange's deadline: a timeout, not a refusal.
func silent(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// unanswered reports whether err is a store that did not answer, rather
// than one that refused. statestore.ErrNotReplicated is unanswered: the
// write landed on the primary, but too few replicas have it, so a
// failover may lose it; its outcome is unknown, as a lost answer's (the
// fence is bumped before the next write, the result is not saved), and
// never a refusal, which would let a call run again over a write that
// stays. WAIT's short answer is not silent (the other replicas meet the
// same primary: no hand-over); WAIT unanswered is (TestNotReplicatedClassified).
func unanswered(err error) bool {
	switch {
	case err == nil, errors.Is(err, statestore.ErrFenced), statestore.Lost(err),
		errors.Is(err, statestore.ErrNotFound), errors.Is(err, statestore.ErrTooLarge),
		errors.Is(err, statestore.ErrSeal), errors.Is(err, statestore.ErrHeld),
		errors.Is(err, statestore.ErrLeased), errors.Is(err, statestore.ErrBudget),
		errors.Is(err, errLostLately):
		return false
	}
	return true
}

// fieldSum is a digest of a field's value, to tell whether a field holds a
// value already. A 128-bit XXH3 with a seed random per process: not
// cryptographic (a SHA-256 of a Go guest's record was 30 µs of each
// checkpoint's CPU), but no one who shapes a value sees a seed or a
// digest, a chance collision is 1 in 2^128, and a claim compares only its
// own session's values (the reasoning of the sandbox's page hashes, which
// a snapshot trusts the same way).
type fieldSum [2]uint64

var sumSeed = randomSeed()

func sumOf(v []byte) fieldSum {
	h := xxh3.Hash128Seed(v, sumSeed)
	return fieldSum{h.Hi, h.Lo}
}

// randomSeed is a seed for XXH3 (zeebo/xxh3, which go-redis brings in
// already): it hashes at memory speed, four times as fast as maphash here.
func randomSeed() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return binary.LittleEndian.Uint64(b[:])
}

// putLocked writes one field of c's record with c's fence, unless it
// holds that value already. A write that got no answer may still land:
// the fence is bumped before the next write (dirty), so that it never
// lands after it. c.mu is held.
func (d *Keeper) putLocked(ctx context.Context, c *Claim, field string, v []byte) error {
	sum := sumOf(v)
	unchanged := false
	if prev, ok := c.saved[field]; ok && prev == sum {
		// Nothing to write. Unless the claim was verified long ago (the
		// call was long, or this process was stopped while it ran): the
		// result was computed from what may be a stale instance, and
		// the fence is checked before it is sent.
		if elapsed(c.verified, time.Now()) < memoryGrace && !c.verified.Before(c.checkFrom) {
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
	// The tenants' byte budgets (Options.Reserve) before the store.
	undo, err := d.reserve(c.id, field, len(v), d.ttl())
	if err != nil {
		return fmt.Errorf("%w: %w", errRefused, err)
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
		if errors.Is(err, statestore.ErrBudget) {
			// The store's own count of the tenants' bytes refused it,
			// as Reserve does: the store is as it was.
			return fmt.Errorf("%w: %w", errRefused, err)
		}
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

// countStored counts each field of record id as the store holds it
// (rec, as a claim read it) against the byte budgets (Options.Count): a
// replica counts in its own memory, and what another replica wrote and
// this one does not write again (another plugin's state, its base) would
// otherwise go uncounted here, so that a session moved between N
// replicas could hold N times the record's budget
// (TestTakeoverCountsStoredRecord). A field this replica counted that
// the record no longer holds stays counted until the record's count
// lapses: more, never less.
func (d *Keeper) countStored(id string, rec map[string][]byte) {
	for field, v := range rec {
		d.count(id, field, len(v), d.ttl())
	}
}

// mcpOr is b, or an empty session record.
func mcpOr(b []byte) []byte {
	if len(b) == 0 {
		return []byte(`{}`)
	}
	return b
}
