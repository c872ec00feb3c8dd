package sessions

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// slot holds one client's instance of one plugin. Leases on it run one at
// a time: holding lock is holding the slot, and inst and notice are
// touched only by its holder. A holder that may give the slot back after
// its client ended does so with [Manager.letGo] (or [Manager.release]),
// which frees the instance then.
type slot struct {
	c       *client
	plugin  string
	lock    chan struct{}
	waiting atomic.Int32 // leases holding or waiting for the slot
	inst    *plugins.Instance
	notice  Notice
	// kept is notice as a lease left it (KeepNotice), at keptAt: a
	// notice since put in its place differs from it.
	kept   Notice
	keptAt time.Time
	elem   *list.Element // in Manager.lru while inst is set; guarded by Manager.mu
	// fence is the fence inst was seeded or verified under (its client's
	// fence when it started, see [Manager.Seed]); guarded by Manager.mu.
	fence uint64
	// starting: a lease is starting inst under fence, outside
	// Manager.mu, so that a [Manager.Adopt] meanwhile moves fence as it
	// would an instance's; guarded by Manager.mu.
	starting bool
	// blank: inst started afresh, with nothing to say, and no call on it
	// has ended but by a reset: it holds what a new instance would, so
	// its loss to a cancelled call is no reset to tell of
	// (TestCancelledFirstCallResetsNothing). The slot's lease holder's.
	blank bool
}

// acquire waits for the slot, refusing at once past the queue limit, and
// leaving if the client ends. The caller calls [Manager.release].
func (sl *slot) acquire(ctx context.Context, limit int) error {
	if int(sl.waiting.Add(1)) > limit {
		sl.waiting.Add(-1)
		return ErrBusy
	}
	select {
	case sl.lock <- struct{}{}:
		return nil
	case <-sl.c.ended:
		sl.waiting.Add(-1)
		return ErrSessionEnded
	case <-ctx.Done():
		sl.waiting.Add(-1)
		return ctx.Err()
	}
}

// release gives back a slot taken with acquire (see letGo).
func (m *Manager) release(sl *slot) {
	sl.waiting.Add(-1)
	m.letGo(sl)
}

// letGo gives back a held slot, first freeing its instance if the slot's
// client has ended. endClient waits for a held slot only until its ctx
// ends, and then leaves the instance to whoever holds the slot: a lease,
// but also an Acquire that fails after taking it, a retirement moving the
// instance, or a checkpoint. Checking and giving back under m.mu, the lock
// that ends the client, leaves no gap: a client ending after the check
// finds the slot free, or held by a later holder that checks in turn. An
// instance left in the slot of an ended client is in no client any more:
// no End, Close or idle timeout would free it.
func (m *Manager) letGo(sl *slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.letGoLocked(sl)
}

// letGoLocked is letGo for a caller holding m.mu.
func (m *Manager) letGoLocked(sl *slot) {
	if sl.c.closed && sl.inst != nil {
		m.log.Info("instance freed", "session", sl.c.key.String(), "plugin", sl.plugin)
		m.closeInstanceLocked(sl)
	}
	<-sl.lock
}

// tryLock takes the slot only if nothing holds it; letGo gives it back
// (unlock, only when the instance was just freed).
func (sl *slot) tryLock() bool {
	select {
	case sl.lock <- struct{}{}:
		return true
	default:
		return false
	}
}

func (sl *slot) unlock() { <-sl.lock }

// Notice is what a client's next result should say about its previous
// instance of a plugin. Both fields are nil when there is nothing to say.
type Notice struct {
	// Reset: the previous instance was discarded, and this one starts
	// afresh.
	Reset *Reset
	// Upgraded: the previous instance's state was handed to this one, of
	// a new version of the plugin.
	Upgraded *Upgrade
}

// Reset says why an instance was discarded.
type Reset struct {
	// Reason is "trap", "timeout", "cancelled", "evicted", "upgrade" or
	// [ReasonReplicaLost].
	Reason string
	Detail string
}

// Upgrade says which version an instance's state was handed to.
type Upgrade struct {
	SHA256 string
}

// Lease is the right to run guest code on one instance, from
// [Manager.Acquire] until [Lease.Done]. It is used by one goroutine at a
// time, but Done may follow a Pause made on another.
type Lease struct {
	m      *Manager
	c      *client // nil for a pooled instance
	sl     *slot   // nil for a pooled instance
	pool   poolKey // a pooled instance's pool
	plugin *plugins.Plugin
	inst   *plugins.Instance
	notice Notice
	ctx    context.Context
	cancel context.CancelCauseFunc
	start  time.Time
	// fence is stored under m.mu (Manager.Adopt moves it) and loaded
	// without it by Fence, which a durable call asks up to three times.
	fence atomic.Uint64
	keep  bool // KeepNotice: Done leaves notice with the instance
	// unheard is KeepNoticeSince's arrived; keptAt is when an earlier
	// lease left notice for l (zero: it did not).
	unheard, keptAt time.Time

	// guarded by m.mu (token: but for firstToken's setting)
	token    bool          // holds a concurrency token
	waitElem *list.Element // in m.waiting while waiting for a person
	park     *parkedRun
	evicted  bool
	done     bool
	released bool // Done has finished: its instance discarded or given back
}

// Acquire returns a lease on key's instance of plugin p, making the
// instance if there is none (or, for a stateless plugin, a lease on a
// warm pooled instance). It waits for the client's earlier leases on the
// plugin, and for a turn under [Options.MaxConcurrentCalls].
//
// Refusals: [ErrBusy], [ErrAtCapacity], [ErrSessionEnded], [ErrClosed],
// [ErrUnknownKey] (a [Handle] key that is not open),
// [ErrRetired] (p was replaced or removed: acquire the version served
// now), and ctx's error. An instance that fails to start gives an error
// matching [ErrStart], and leaves what it would have started from (a
// seed, a saved or stored state, a reset to say) to the client's next
// lease. An instance of an older version of p held by the
// client is moved to p first, its state handed over when both versions
// can (see [Lease.Notice]).
func (m *Manager) Acquire(ctx context.Context, key Key, p *plugins.Plugin) (*Lease, error) {
	if p.Stateless() {
		return m.acquirePooled(ctx, p)
	}
	for {
		l, err := m.acquireSlot(ctx, key, p)
		if errors.Is(err, ErrSessionEnded) && ctx.Err() == nil {
			switch key.kind {
			case KindClient:
				continue // reaped meanwhile: the key gets a new client
			case KindHandle:
				return nil, ErrUnknownKey // ended meanwhile: the handle is gone
			}
		}
		return l, err
	}
}

func (m *Manager) acquireSlot(ctx context.Context, key Key, p *plugins.Plugin) (*Lease, error) {
	group := m.tenantOf(ctx)
	l := &Lease{m: m, plugin: p, start: time.Now()}
	m.mu.Lock()
	c, victim, err := m.clientLocked(key, group)
	if err != nil {
		m.mu.Unlock()
		if victim != nil {
			m.endClient(context.Background(), victim)
		}
		return nil, err
	}
	if c.group == "" {
		if group != "" && m.indexed(c) {
			m.regroupHandleLocked(c, group)
		} else {
			m.regroupKeyedLocked(c, group)
		}
	}
	if c.closed {
		m.leaveLocked(c)
		m.mu.Unlock()
		return nil, ErrSessionEnded
	}
	sl, ok := c.slots[p.Name()]
	if !ok {
		sl = &slot{c: c, plugin: p.Name(), lock: make(chan struct{}, 1)}
		c.slots[p.Name()] = sl
	}
	l.c, l.sl = c, sl
	// A free slot, as most leases find it (a session's calls to a plugin
	// come one at a time), is taken in this hold and the lease
	// registered in it: under many sessions this lock is the host's most
	// contended, and a warm lease took it twice here. Only when nothing
	// holds or waits for the slot, so that no queued lease is passed.
	taken, warm := false, false
	if victim == nil {
		if sl.waiting.Add(1) == 1 && sl.tryLock() {
			taken = true
			warm, err = m.registerLocked(l)
		} else {
			sl.waiting.Add(-1) // queued below, as any
		}
	}
	m.mu.Unlock()
	if victim != nil {
		// Before this client's instance starts, so that the victim's
		// counts no more against the instance bounds.
		m.log.Info("client evicted: too many open", "session", victim.key.String(), "max", m.opts.MaxClients, "share", m.opts.MaxClientsPerGroup)
		m.endClient(context.Background(), victim)
	}

	leave := func() {
		m.mu.Lock()
		m.leaveLocked(c)
		m.broadcastLocked() // WaitIdle counts queued leases
		m.mu.Unlock()
	}
	if !taken {
		if err := sl.acquire(ctx, m.queueLimit()); err != nil {
			leave()
			return nil, err
		}
		l.start = time.Now()
		m.mu.Lock()
		warm, err = m.registerLocked(l)
		m.mu.Unlock()
	}
	if err != nil {
		m.release(sl)
		leave()
		return nil, err
	}
	fail := func(err error) (*Lease, error) {
		m.mu.Lock()
		sl.starting = false
		delete(m.leases, l)
		m.leaveLocked(c)
		m.broadcastLocked()
		m.mu.Unlock()
		m.release(sl)
		return nil, err
	}

	if !warm {
		m.mu.Lock()
		stale := sl.inst != nil && sl.fence != c.fence
		m.mu.Unlock()
		if stale {
			// Its session was claimed by another holder since the
			// instance started: what it holds is not the session's
			// state any more.
			m.log.Info("instance retired: its session changed owner", "session", c.key.String(), "plugin", p.Name())
			m.dropInstance(sl)
		}
		if sl.inst != nil && !sl.inst.Plugin().SameCode(p) {
			// p replaced the instance's version, and this lease got here
			// before the retirement's own move did.
			m.moveOff(sl, sl.inst.Plugin(), p)
		}
		if sl.inst == nil {
			if err := m.startInSlot(ctx, c, sl, p); err != nil {
				return fail(err)
			}
		} else {
			m.mu.Lock()
			if sl.elem != nil {
				m.lru.MoveToBack(sl.elem)
			}
			m.mu.Unlock()
		}
		m.mu.Lock()
		l.fence.Store(sl.fence)
		m.mu.Unlock()
	}
	l.inst = sl.inst
	l.notice, sl.notice = sl.notice, Notice{}
	if !sl.keptAt.IsZero() && l.notice == sl.kept {
		l.keptAt = sl.keptAt
	}
	sl.kept, sl.keptAt = Notice{}, time.Time{}
	if err := m.firstToken(ctx, l); err != nil {
		// Not delivered: the next lease says it, as kept as it was.
		sl.notice, sl.kept, sl.keptAt = l.notice, l.notice, l.keptAt
		return fail(err)
	}
	l.ctx, l.cancel = m.leaseContext(ctx, p)
	return l, nil
}

// leaseContext is the context and cancel of a lease of p acquired under
// ctx: ctx itself and no cancel for a plugin whose calls never wait for a
// person (Options.Waits), since only a lease waiting for one is ever
// cancelled (evictLocked, Close); its Done's cancel only let go of what
// ended with it, which the sandbox's call lets go of itself.
func (m *Manager) leaseContext(ctx context.Context, p *plugins.Plugin) (context.Context, context.CancelCauseFunc) {
	if m.opts.Waits != nil && !m.opts.Waits(p) {
		return ctx, nil
	}
	return context.WithCancelCause(ctx)
}

// registerLocked registers l, which holds its slot, as a live lease, or
// says why it may not run: under the lock that checks retirement, so that
// a retirement waits for every lease on the old version. warm: the slot
// holds an instance of l's code under the client's fence, as most leases
// find, and what the cold path takes the lock for again (stale?, the LRU,
// the lease's fence) is done in this hold. The caller holds m.mu.
func (m *Manager) registerLocked(l *Lease) (warm bool, err error) {
	c, sl, p := l.c, l.sl, l.plugin
	switch {
	case c.closed:
		return false, ErrSessionEnded
	case m.closed:
		return false, ErrClosed
	case m.isRetiredLocked(p):
		return false, ErrRetired
	}
	m.leases[l] = struct{}{}
	if sl.inst != nil && sl.fence == c.fence && sl.inst.Plugin().SameCode(p) {
		if sl.elem != nil {
			m.lru.MoveToBack(sl.elem)
		}
		l.fence.Store(sl.fence)
		return true, nil
	}
	return false, nil
}

// startInSlot starts the instance of p in c's slot sl, which holds none
// and is held by the caller's lease, from what the client was seeded
// with, stored or saved; an error is the lease's failure. Apart from
// acquireSlot, and not inlined, so that a warm lease's frame does not
// hold the cold start's locals: acquireSlot's was 1,392 bytes, and it
// lies under every tool call's goroutine stack, which it pushed past
// 8 KiB into a copy to 16 KiB (issue 27, item 2).
//
//go:noinline
func (m *Manager) startInSlot(ctx context.Context, c *client, sl *slot, p *plugins.Plugin) error {
	m.mu.Lock()
	_, seeded := c.seedFor(p.Name())
	moved := c.moved[p.Name()] && !seeded
	m.mu.Unlock()
	if err := m.reserve(ctx, p, sl); err != nil {
		return err
	}
	var stored *Seed
	var under uint64
	if moved {
		// The plugin's state is in the store (see ErrMoved), read
		// under the fence the client is seeded under: a Seed since
		// (another claim's) supersedes it.
		var st *plugins.State
		why, known := "", false
		if m.opts.Stored != nil {
			st, why, under, known = m.opts.Stored(ctx, c.key, p)
		}
		switch {
		case !known:
			m.unreserve(p)
			return ErrMoved
		case st != nil:
			stored = &Seed{State: st, Unsaid: why}
		case why != "":
			stored = &Seed{Lost: "its state could not be read back from the state store", Reason: why}
		default:
			stored = &Seed{} // none saved: a fresh start
		}
	}
	m.mu.Lock()
	if stored != nil && (!c.moved[p.Name()] || c.fence != under) {
		m.mu.Unlock()
		m.unreserve(p)
		return ErrMoved
	}
	seed, seeded := c.seedFor(p.Name())
	// What the start takes (c.seeds' seed, the moved mark, the slot's
	// notice), given back if no instance starts: giveBack.
	own, before := seeded && stored == nil, sl.notice.Reset
	delete(c.seeds, p.Name())
	if c.started == nil {
		c.started = map[string]bool{}
	}
	c.started[p.Name()] = true
	if stored != nil {
		seed, seeded = *stored, stored.State != nil || stored.Lost != ""
	}
	delete(c.moved, p.Name())
	// The instance starts under the client's fence now, unless an
	// Adopt moves it while it starts (the first claim of a session
	// served from memory): a Seed since leaves it stale.
	sl.fence, sl.starting = c.fence, true
	// Back as of its last call that succeeded: read from the store,
	// or seeded by a claim since (which read the same state), with
	// after-call checkpoints the state saved after that call.
	if (stored != nil || m.opts.StoredAfterCancel) && seeded && seed.State != nil && sl.notice.Reset != nil && sl.notice.Reset.Reason == "cancelled" {
		sl.notice.Reset = nil
	}
	evicted := sl.notice.Reset != nil && sl.notice.Reset.Reason == ReasonEvicted
	m.mu.Unlock()
	// giveBack puts back what the start took when no instance started
	// (a call whose context ended as its state was restored): the
	// plugin's next lease starts from the same seed, reads Stored or
	// asks Saved again, or says the notice. Taken for good, the next
	// instance started afresh with no word. Not after a Seed of
	// another claim since (the slot's fence is not the client's):
	// its seeds stand, as they would over the instance, stale once
	// started. One of the starting instance's fence, or an Adopt,
	// kept the instance's source over its seeds: that is given back.
	// In the hold that clears sl.starting: a Seed under the fence
	// between the two took the slot for one whose instance goes
	// on, dropped the plugin's seed, the one given back included,
	// and the next instance started afresh unsaid
	// (TestSeedAfterFailedStartStands).
	giveBack := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		sl.starting = false
		if c.fence != sl.fence {
			return
		}
		if _, ok := c.seeds[p.Name()]; own && !ok {
			if c.seeds == nil {
				c.seeds = map[string]Seed{}
			}
			// An AnyPlugin seed as the plugin's own; one whose state did
			// not restore as lost (see start).
			c.seeds[p.Name()] = seed
		}
		if stored != nil {
			if c.moved == nil {
				c.moved = map[string]bool{}
			}
			c.moved[p.Name()] = true
		}
		sl.notice.Reset = before
	}
	if !seeded && evicted && m.opts.Saved != nil {
		// The evicted instance's state may be kept elsewhere.
		st, why, known := m.opts.Saved(ctx, c.key, p)
		if !known {
			// Not started afresh over the saved state: the slot keeps
			// its notice, and the next lease asks again.
			giveBack()
			m.unreserve(p)
			return fmt.Errorf("%w: the evicted instance's saved state could not be read now", ErrMoved)
		}
		m.mu.Lock()
		switch {
		case st != nil:
			seed, seeded = Seed{State: st, Unsaid: why}, true
			sl.notice.Reset = nil
		case why != "":
			sl.notice.Reset = &Reset{Reason: why, Detail: "the instance was evicted, and its last state was not saved"}
		}
		m.mu.Unlock()
	}
	inst, reset, err := m.start(ctx, p, &seed, seeded)
	if err != nil {
		giveBack()
		if m.gaveBack != nil {
			m.gaveBack()
		}
		m.unreserve(p)
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	m.mu.Lock()
	if reset != nil {
		sl.notice.Reset = reset
	}
	sl.inst, sl.starting = inst, false
	sl.blank = !seeded && reset == nil
	sl.elem = m.lru.PushBack(sl)
	m.mu.Unlock()
	m.obs.InstanceStarted(p.Name())
	m.log.Info("instance created", "session", c.key.String(), "plugin", p.Name(), "sha256", p.SHA256())
	return nil
}

// start makes a new instance of p: from the client's seed if it has one
// for p, else afresh. A seed that cannot be restored gives a fresh
// instance and the reset to tell the client of; it is made a lost one
// (Seed.Lost), so that a start that fails after it gives back a seed that
// is said, not restored again.
func (m *Manager) start(ctx context.Context, p *plugins.Plugin, seed *Seed, seeded bool) (*plugins.Instance, *Reset, error) {
	if !seeded {
		inst, err := p.NewInstance(ctx)
		return inst, nil, err
	}
	if seed.State != nil {
		inst, err := p.RestoreState(ctx, seed.State)
		if err == nil {
			m.log.Info("instance restored", "plugin", p.Name(), "sha256", p.SHA256(), "bytes", len(seed.State.Data))
			if seed.Unsaid != "" {
				return inst, &Reset{Reason: seed.Unsaid, Detail: "the state was reset before a call whose client may not have been answered"}, nil
			}
			return inst, nil, nil
		}
		if ctx.Err() != nil {
			return nil, nil, err
		}
		*seed = Seed{Lost: err.Error(), Reason: seed.Reason}
	}
	inst, err := p.NewInstance(ctx)
	if err != nil {
		return nil, nil, err
	}
	m.log.Warn("instance state lost with its replica", "plugin", p.Name(), "detail", seed.Lost)
	return inst, &Reset{Reason: cmp.Or(seed.Reason, ReasonReplicaLost), Detail: seed.Lost}, nil
}

// takeToken waits for a turn under the concurrency limit.
func (m *Manager) takeToken(ctx context.Context, l *Lease) error {
	if m.running == nil {
		return nil
	}
	if err := m.waitTurn(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	l.token = true
	m.mu.Unlock()
	return nil
}

// firstToken is takeToken for a lease Acquire has not returned yet: its
// token is set without m.mu, which a warm lease would otherwise take a
// third time. Only its holder's Pause and Done read it, and no one has
// the lease before Acquire returns it.
func (m *Manager) firstToken(ctx context.Context, l *Lease) error {
	if m.running == nil {
		return nil
	}
	if err := m.waitTurn(ctx); err != nil {
		return err
	}
	l.token = true
	return nil
}

// waitTurn takes a token of m.running, or fails when ctx ends first.
func (m *Manager) waitTurn(ctx context.Context) error {
	select {
	case m.running <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Context is the context to run guest code under: the one Acquire was
// given, also cancelled when the lease is evicted or abandoned
// ([context.Cause] says why: [ErrEvicted], [ErrClosed], or the park's
// abandonment); for a plugin that [Options.Waits] says never waits for a
// person, the one Acquire was given.
func (l *Lease) Context() context.Context { return l.ctx }

// Instance is the instance to run.
func (l *Lease) Instance() *plugins.Instance { return l.inst }

// Fence is the fence the lease's instance was seeded or verified under
// (see [Manager.Seed]): a write of its state is conditioned on it. 0 for a
// client never seeded (no state store).
func (l *Lease) Fence() uint64 { return l.fence.Load() }

// Stale reports whether the lease's client was seeded under another fence
// since its instance started: another holder served the session, and the
// instance is dropped when the lease is done.
func (l *Lease) Stale() bool {
	if l.c == nil {
		return false
	}
	l.m.mu.Lock()
	defer l.m.mu.Unlock()
	return l.c.fence != l.fence.Load()
}

// Plugin is the plugin version the lease runs: the one acquired.
func (l *Lease) Plugin() *plugins.Plugin { return l.plugin }

// Client is the number of the client whose instance l holds
// ([Manager.ClientNumber] while it lives), 0 for a pooled instance: a
// client that ended while l's call runs keeps its number, though its key
// may have a new client by then.
func (l *Lease) Client() uint64 {
	if l.c == nil {
		return 0
	}
	return l.c.number
}

// Notice says what happened to the client's previous instance, for the
// result of this lease's call.
func (l *Lease) Notice() Notice { return l.notice }

// Pause marks the lease as waiting for a person (an elicitation, a sampling
// request, a parked round): it gives back its concurrency token, and may be
// evicted while it waits (its context is then cancelled with
// [ErrEvicted]), unless [Options.Waits] said its plugin never waits.
// Resume ends the wait.
func (l *Lease) Pause() {
	m := l.m
	m.mu.Lock()
	if l.done || l.waitElem != nil {
		m.mu.Unlock()
		return
	}
	unevictable := l.cancel == nil
	if !unevictable {
		l.waitElem = m.waiting.PushBack(l)
	}
	token := l.token
	l.token = false
	m.broadcastLocked()
	m.mu.Unlock()
	if token {
		<-m.running
	}
	if unevictable {
		m.log.Error("a lease waits for a person, but its plugin was said never to (Options.Waits): it cannot be evicted meanwhile", "plugin", l.plugin.Name())
	}
}

// Resume ends a wait begun with Pause, taking a concurrency token back. It
// fails if ctx ends first, or the lease was evicted meanwhile.
func (l *Lease) Resume(ctx context.Context) error {
	m := l.m
	m.mu.Lock()
	if l.waitElem != nil {
		m.waiting.Remove(l.waitElem)
		l.waitElem = nil
	}
	evicted := l.evicted
	m.mu.Unlock()
	if evicted {
		return context.Cause(l.ctx)
	}
	return m.takeToken(ctx, l)
}

// Done ends the lease. err is the guest's failure, if any: a trap, a
// timeout or a cancellation (and an instance that is no longer usable,
// whatever err says) discards the instance, and the client's next lease
// says why; any other error (a guest's own error) keeps it. Done is
// idempotent.
// KeepNotice makes l leave its notice with the instance when it is done,
// for the instance's next lease to say again, unless a newer notice took
// its place or the instance is gone: l's call may answer no one (a client
// gone while its request sat in a stopped process), and the notice is the
// client's one word that its state was reset (the fault suite's
// sigstop-redis-empty: such a request took a fresh instance's notice, and
// the client's next call went on from it unsaid). Called by l's holder.
func (l *Lease) KeepNotice() { l.keep = true }

// KeepNoticeSince is KeepNotice for a call whose client may have given up
// on it, whose request arrived at arrived (it sat in a stopped process, or
// was sent before the stop and read after it), except for a notice an
// earlier lease kept and left before arrived: that lease kept it for the
// client's next call, which a request arriving after it is, and which says
// it. Kept again, every call within the 5 s the host counts a stop for
// said it again, and a client saw one reset said by each of them (one that
// re-seeds its state on a reset did so at each). A request that arrived
// before, in the process beside the lease that kept the notice (a retry
// that sat through the stop too), keeps it again. What this gives up: a
// request sent before the stop and read only after that lease was done,
// whose client gave up, says the notice to no one. Called by l's holder.
func (l *Lease) KeepNoticeSince(arrived time.Time) { l.unheard = arrived }

func (l *Lease) Done(err error) {
	m := l.m
	// Read before the hold, and trusted only if l was not evicted
	// meanwhile (evictLocked marks it under m.mu).
	kept := resetReason(err, l, false) == "" && (l.sl == nil || !errors.Is(err, ErrMoved))
	// Before the slot is let go, as ever. An eviction after it finds
	// the context ended: l.evicted, read in the hold, says it. A lease
	// of a plugin that never waits has no context of its own to end.
	if l.cancel != nil {
		l.cancel(nil)
	}
	m.mu.Lock()
	if l.done {
		m.mu.Unlock()
		return
	}
	l.done = true
	if l.waitElem != nil {
		m.waiting.Remove(l.waitElem)
		l.waitElem = nil
	}
	if l.park != nil {
		m.unparkLocked(l.park.id)
	}
	token := l.token
	l.token = false
	delete(m.leases, l)
	// An instance that goes on (no failure, not stale), as most leases
	// leave theirs, is given back in this hold, which a warm call's
	// release took five of (a pooled one's three): under many sessions
	// this lock is the host's most contended. What each step below takes
	// it for is done here, in the same order.
	evicted := l.evicted
	switch {
	case !kept || evicted:
		kept = false
	case l.sl == nil:
		// A pooled instance back in its pool, when that frees none.
		kept = m.poolBackLocked(l)
	case l.c.fence != l.fence.Load():
		kept = false // stale
	default:
		l.sl.blank = false
		l.keepNotice()
		m.leaveLocked(l.c)
		l.sl.waiting.Add(-1)
		m.letGoLocked(l.sl)
	}
	if kept {
		l.released = true
		m.broadcastLocked()
	}
	m.mu.Unlock()
	if token {
		<-m.running
	}
	if kept {
		return
	}
	reason := resetReason(err, l, evicted)
	if l.sl == nil {
		m.donePooled(l, reason)
	} else {
		sl := l.sl
		switch {
		case errors.Is(err, ErrMoved), l.Stale():
			m.dropInstance(sl)
			if errors.Is(err, ErrMoved) {
				m.markMoved(l.c, sl.plugin)
			}
		case reason == "cancelled" && sl.blank:
			// Its first call cut: what a new instance starts with is
			// what it had, nothing to lose (the proxy killed mid-call
			// in the fault suite's proxy-restart said "cancelled").
			// What the lease took to say (an earlier instance's reset,
			// an upgrade) went unheard with the call: the next says it,
			// as kept as it was (TestKeptNoticeThroughCancelledFirstCall).
			m.log.Info("instance dropped: its first call was cancelled", "session", sl.c.key.String(), "plugin", sl.plugin)
			m.dropInstance(sl)
			sl.notice, sl.kept, sl.keptAt = l.notice, l.notice, l.keptAt
		case reason != "":
			m.discard(sl, reason, detailOf(err, l))
			if reason == "cancelled" && m.opts.StoredAfterCancel {
				// Not after a timeout or a trap: the same state may fail
				// the same way again.
				m.markMoved(l.c, sl.plugin)
			}
		}
		if reason == "" {
			sl.blank = false
		}
		l.keepNotice()
		m.mu.Lock()
		m.leaveLocked(l.c)
		m.mu.Unlock()
		m.release(sl) // frees the instance if the client ended meanwhile
	}
	m.mu.Lock()
	l.released = true
	m.broadcastLocked()
	m.mu.Unlock()
}

// keepNotice leaves l's notice with its instance for the next lease, if
// l was asked to keep it (KeepNotice, KeepNoticeSince). Called by the
// slot's holder, before it lets the slot go.
func (l *Lease) keepNotice() {
	sl := l.sl
	keep := l.keep || !l.unheard.IsZero() && (l.keptAt.IsZero() || l.unheard.Before(l.keptAt))
	if keep && l.notice != (Notice{}) && sl.inst != nil && sl.notice == (Notice{}) {
		// The slot is l's until release. Kept again, it is kept as
		// of the first time: a call that arrived between the two
		// keepings came after it was kept, and does not keep it
		// (TestKeptNoticeAgainKeepsItsTime).
		keptAt := l.keptAt
		if keptAt.IsZero() {
			keptAt = time.Now()
		}
		sl.notice, sl.kept, sl.keptAt = l.notice, l.notice, keptAt
	}
}

// resetReason says why a lease leaves its instance unusable, or "" when
// the instance may go on. evicted: l was evicted (its context's cause may
// not say so: Done ends it first).
func resetReason(err error, l *Lease, evicted bool) string {
	switch {
	case l.inst.Err() == nil && err == nil:
		return ""
	case evicted || errors.Is(context.Cause(l.ctx), ErrEvicted):
		return "evicted"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case isTrap(err), l.inst.Err() != nil:
		return "trap"
	}
	return ""
}

// isTrap reports whether err is a guest's trap. (Apart from resetReason,
// whose every call, a call that went well included, would otherwise
// allocate the target of errors.As.)
func isTrap(err error) bool {
	var te *sandbox.TrapError
	return errors.As(err, &te)
}

func detailOf(err error, l *Lease) string {
	if err != nil {
		return err.Error()
	}
	return l.inst.Err().Error()
}

// markMoved says c's instance of plugin is gone and its state is in the
// store: its next instance starts from a seed or from Options.Stored (see
// ErrMoved).
func (m *Manager) markMoved(c *client, plugin string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c.moved == nil {
		c.moved = map[string]bool{}
	}
	c.moved[plugin] = true
}
