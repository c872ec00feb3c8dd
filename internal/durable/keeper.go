package durable

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
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

// Options configures [New]. Zero values mean the documented defaults;
// only Store and Sessions are required.
type Options struct {
	// Store keeps the records. Every exchange with it is bounded by
	// StoreTimeout, whatever the caller's context allows.
	Store statestore.Store
	// Sessions is the session layer whose clients the keeper seeds and
	// whose instances it checkpoints.
	Sessions *sessions.Manager
	// StoreTimeout bounds one exchange with the store. The default is
	// [DefaultStoreTimeout] (1s). After an exchange that got no answer
	// the store is not asked for 2s (the breaker).
	StoreTimeout time.Duration
	// Replica names this replica in its claims ("-" if empty).
	Replica string
	// Checkpoint is the policy: [CheckpointAfterCall] (the default) or
	// [CheckpointOnDrain].
	Checkpoint string
	// SessionTimeout is how long a session's record lives unused; 0 means
	// sessions never time out, and a record lives a day unused.
	SessionTimeout time.Duration
	// Logger receives the keeper's records (component=durable); nil
	// discards them.
	Logger *slog.Logger
	// Observer counts checkpoints, adoptions and lost records; nil
	// counts nothing.
	Observer Observer
	// ExportGrants and RestoreGrants carry a session's run-time grant
	// answers in its record (field "grants"); nil carries none.
	// RestoreGrants's ctx is the request's that takes the session over
	// (as OpenHandle's).
	ExportGrants  func(key sessions.Key) []byte
	RestoreGrants func(ctx context.Context, key sessions.Key, data []byte) error
	// Reserve counts size bytes of field of record id against the
	// tenants' budgets before the write, and returns how to undo it (the
	// write failed); Release forgets record id (deleted). nil counts
	// nothing.
	Reserve func(id, field string, size int, ttl time.Duration) (undo func(), err error)
	// Count sets the bytes counted for field of record id to size,
	// whatever the budgets: what the store may hold after a write that
	// failed or got no answer, which Reserve could refuse to count. nil
	// with Reserve nil.
	Count   func(id, field string, size int, ttl time.Duration)
	Release func(id string)
	// OpenHandle opens the session-layer client of a handle this replica
	// takes over from the store; ctx is the request's that takes it, so
	// that the caller can open it in its tenant's group
	// ([sessions.Manager.OpenIn]). nil opens it in none
	// ([sessions.Manager.Open]).
	OpenHandle func(ctx context.Context, key sessions.Key) error
	// Shares says that sessions' subjects are tenants (host.Options
	// Tenants): each subject, and the sessions of none together, may hold
	// a quarter of what the keeper keeps for sessions whose record is not
	// written yet. Without it those bounds are everyone's.
	Shares bool
}

// Observer is told what an operator watches of the keeper. Its methods
// must not block.
type Observer interface {
	// Checkpointed is called after each write of an instance's state:
	// how long it took, its size, and its error (nil if it landed).
	Checkpointed(d time.Duration, size int, err error)
	// Adopted is called when a session is taken over from the store.
	Adopted()
	// StoreLost is called when the store lost a record this replica
	// writes back.
	StoreLost()
}

type nopObserver struct{}

func (nopObserver) Checkpointed(time.Duration, int, error) {}

func (nopObserver) Adopted() {}

func (nopObserver) StoreLost() {}

// Keeper keeps sessions in the store. It owns the claims of this
// replica: which sessions it serves, under which fence. Its methods are
// safe for concurrent use; a nil *Keeper (no store) keeps nothing.
type Keeper struct {
	store   statestore.Store // bounded: every exchange within timeout, its refusal noted
	owner   statestore.Owner
	policy  string
	log     *slog.Logger
	ses     *sessions.Manager
	obs     Observer
	exp     time.Duration // the store's timeout for one exchange
	session time.Duration // the session timeout, 0 for none

	exportGrants  func(sessions.Key) []byte
	restoreGrants func(context.Context, sessions.Key, []byte) error
	reserve       func(id, field string, size int, ttl time.Duration) (undo func(), err error)
	count         func(id, field string, size int, ttl time.Duration)
	release       func(id string)
	openHandle    func(ctx context.Context, key sessions.Key) error

	wg sync.WaitGroup // background work: renewals, write-backs

	downUntil atomic.Int64 // the breaker: until when (ns since clockBase) the store is not asked
	// refusedAt is when (ns since clockBase) an exchange of this
	// replica's last met the store refusing or dropping a connection (its
	// process down: see ServeElsewhere), 0 never. The store wrapper
	// (bounded) notes it, which every exchange goes through.
	refusedAt atomic.Int64
	// epochAt is when (ns since clockBase) the last exchange began that
	// read the store's epoch this replica now holds (noteEpoch), 0 never:
	// a refusal noted before it is forgotten (refusedLately).
	epochAt atomic.Int64
	// beats: when the heartbeat loop ran (beat), for ranSince.
	beats beats
	// keyChecked: the store's key check passed; keyBad: it failed (why),
	// and the replica is not ready.
	keyChecked atomic.Bool
	keyBad     atomic.Pointer[string]
	renewing   atomic.Bool // a renewAll round runs
	// lostUntil is until when (ns since clockBase) a session the store
	// does not hold is "not now" (LostLately): lostHold after this
	// replica last saw the store's epoch change, or after the loss the
	// store recorded (noteEpoch), 0 never.
	lostUntil atomic.Int64
	// lossRead is the epoch whose recorded loss this replica dated a
	// hold from (noteEpoch), 0 none: the record's time is fixed, so a
	// later read of it moves nothing, and one that reads it as newer (the
	// store's clock set back since it was written) would hold back for
	// as long as the clock is behind.
	lossRead atomic.Uint32
	// epoch is the store's epoch as this replica last saw it (noteEpoch),
	// 0 before it saw one: a store seen with another since came back
	// empty.
	epoch atomic.Uint32

	mu     sync.Mutex
	claims map[sessions.Key]*Claim
	// forgotten are claims dropped after a call that could not be
	// verified or saved (forget), until the session's next claim (take)
	// or its end: what they say of the instances this replica still
	// holds (what was not saved, the results kept for at-most-once
	// calls) carries over if no one claimed the session meanwhile.
	forgotten map[sessions.Key]*Claim
	// adopted are the stateful sessions this replica took over from the
	// store, until they end here: never served afresh from memory. Past
	// maxAdoptedNotes of them adoptedFull is set for good, and then no
	// stateful session this replica holds no claim on is (AdoptedHere).
	adopted     map[string]bool
	adoptedFull bool
	// pending are new stateful sessions whose record could not be
	// written when they were made (the store did not answer), at most
	// maxPending: the session's next claim writes it, so that another
	// replica can still take the session over.
	pending      map[sessions.Key]*NewSession
	pendingBytes int // of the pending sessions' initialize parameters
	// pendingBy counts the pending sessions of each subject, with shares.
	pendingBy map[string]pendingShare
	shares    bool // Options.Shares
}

// pendingShare is what one subject's pending sessions hold.
type pendingShare struct{ sessions, bytes int }

// New returns the keeper of this replica's sessions in o.Store. Its
// heartbeat runs in [Keeper.Heartbeat], which the caller runs until the
// replica stops; [Keeper.Wait] then waits for its background work.
func New(o Options) *Keeper {
	var boot [6]byte
	rand.Read(boot[:])
	exp := cmp.Or(o.StoreTimeout, DefaultStoreTimeout)
	d := &Keeper{
		owner:         statestore.Owner{Replica: cmp.Or(o.Replica, "-"), Boot: hex.EncodeToString(boot[:])},
		policy:        cmp.Or(o.Checkpoint, CheckpointAfterCall),
		log:           cmp.Or(o.Logger, slog.New(slog.DiscardHandler)).With("component", "durable"),
		ses:           o.Sessions,
		obs:           o.Observer,
		exp:           exp,
		session:       max(o.SessionTimeout, 0),
		exportGrants:  o.ExportGrants,
		restoreGrants: o.RestoreGrants,
		reserve:       o.Reserve,
		count:         o.Count,
		release:       o.Release,
		openHandle:    o.OpenHandle,
		claims:        map[sessions.Key]*Claim{},
		forgotten:     map[sessions.Key]*Claim{},
		adopted:       map[string]bool{},
		pending:       map[sessions.Key]*NewSession{},
		pendingBy:     map[string]pendingShare{},
		shares:        o.Shares,
	}
	d.store = bounded{Store: o.Store, d: exp, refusedAt: &d.refusedAt}
	if d.obs == nil {
		d.obs = nopObserver{}
	}
	if d.exportGrants == nil {
		d.exportGrants = func(sessions.Key) []byte { return nil }
	}
	if d.restoreGrants == nil {
		d.restoreGrants = func(context.Context, sessions.Key, []byte) error { return nil }
	}
	if d.reserve == nil {
		d.reserve = func(string, string, int, time.Duration) (func(), error) { return func() {}, nil }
	}
	if d.count == nil {
		d.count = func(string, string, int, time.Duration) {}
	}
	if d.release == nil {
		d.release = func(string) {}
	}
	if d.openHandle == nil {
		d.openHandle = func(_ context.Context, key sessions.Key) error { return d.ses.Open(key) }
	}
	return d
}

// Wait waits for the keeper's background work (renewals, write-backs
// of a record the store lost) to end. Call it after Heartbeat's context
// ended and no request runs.
func (d *Keeper) Wait() {
	if d != nil {
		d.wg.Wait()
	}
}

// KeyMismatch says why the state store's values do not open with this
// replica's state key, or "" (no store, or they do, or not known yet).
// A mismatch is for good: the replica is not ready.
func (d *Keeper) KeyMismatch() string {
	if d == nil {
		return ""
	}
	if why := d.keyBad.Load(); why != nil {
		return *why
	}
	return ""
}

// maxPending bounds the new sessions a Keeper holds pending
// (Keeper.pending).
const maxPending = 4096

// maxAdoptedNotes bounds the notes of sessions taken over that a Keeper
// keeps (Keeper.AdoptedHere): live sessions each have one, and the
// go-sdk's sessions are bounded (host.Options.MaxSessions).
const maxAdoptedNotes = 1 << 16

// maxPendingBytes bounds the initialize parameters a Keeper holds for
// sessions whose record is not written yet (Keeper.pending): clients
// choose them, and a store down for a while would otherwise let them
// pile up. Past it (or past maxPending sessions) a new session is not
// kept: its first claim writes a record no other replica can take over,
// as one the store refused.
const maxPendingBytes = 16 << 20

// keepPending keeps ns for key's next claim, within maxPending sessions
// and maxPendingBytes, and with shares within a quarter of each for ns's
// subject (until stop 63 one tenant's large initializes, some 64 of 256
// KiB, left no room for any other's new sessions while the store was
// down). d.mu is held; key holds nothing (dropPending).
func (d *Keeper) keepPending(key sessions.Key, ns *NewSession) {
	n := len(ns.Initialize)
	if len(d.pending) >= maxPending || d.pendingBytes+n > maxPendingBytes {
		return
	}
	if d.shares {
		mine := d.pendingBy[ns.Subject]
		if mine.sessions >= maxPending/4 || mine.bytes+n > maxPendingBytes/4 {
			return
		}
		d.pendingBy[ns.Subject] = pendingShare{mine.sessions + 1, mine.bytes + n}
	}
	d.pending[key] = ns
	d.pendingBytes += n
}

// dropPending forgets what keepPending kept for key. d.mu is held.
func (d *Keeper) dropPending(key sessions.Key) {
	ns, ok := d.pending[key]
	if !ok {
		return
	}
	d.pendingBytes -= len(ns.Initialize)
	delete(d.pending, key)
	if d.shares {
		mine := d.pendingBy[ns.Subject]
		if mine.sessions--; mine.sessions == 0 {
			delete(d.pendingBy, ns.Subject)
		} else {
			mine.bytes -= len(ns.Initialize)
			d.pendingBy[ns.Subject] = mine
		}
	}
}

// AdoptedHere notes that stateful session id was taken over from the
// store: it has a state there, so it is never served from memory before
// this replica's claim on it succeeded. The note goes when the session
// ends here ([Keeper.Ended]).
//
// Forgetting a live session's note would let a store outage serve it
// afresh over the state the store holds, a silent reset; so past
// maxAdoptedNotes (sessions adopted here whose end this replica never
// saw: an adoption that failed half way) none is forgotten. The replica
// instead stops serving any stateful session it holds no claim on from
// memory (BeforeCall): an outage then refuses the new sessions it would
// have served, which is availability lost, not state.
func (d *Keeper) AdoptedHere(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.adopted) >= maxAdoptedNotes {
		if !d.adoptedFull {
			d.log.Warn("too many sessions adopted here to remember: new stateful sessions will not be served from memory while the state store is unavailable", "adopted", len(d.adopted))
		}
		d.adoptedFull = true
		return
	}
	d.adopted[id] = true
}

// adoptedHere reports whether key's stateful session was taken over here
// and is noted so: unlike wasAdopted, past maxAdoptedNotes it says no for
// the sessions it could not note (a reset said of a session made here,
// which it may be, would be a reset the client never had).
func (d *Keeper) adoptedHere(key sessions.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.adopted[key.ID()]
}

// wasAdopted reports whether key's stateful session may have been taken
// over here.
func (d *Keeper) wasAdopted(key sessions.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.adoptedFull || d.adopted[key.ID()]
}
