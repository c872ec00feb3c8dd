// Package sessions owns every client's plugin instances: which client a
// request belongs to (its [Key]), each client's instance of each plugin, the
// limits on live instances and their memory, the warm pools of stateless
// plugins, moving instances off a plugin version that a reload retired, and
// calls parked while a client is asked a question.
//
// It knows nothing of MCP: the host maps MCP sessions, handles, headers and
// subjects to keys, and protocol results to and from leases. A [Lease],
// from [Manager.Acquire], is the only way to run guest code on an instance:
//
//	l, err := m.Acquire(ctx, key, plugin)
//	if err != nil { ... }         // refused: busy, at capacity, closed
//	err = run(l.Context(), l.Instance())
//	l.Done(err)                   // a trap, timeout or cancel resets the instance
//
// Rules the package keeps (and its property test checks): no instance is
// closed while a lease on it is live, pooled instances included; every
// reservation (instance counts, memory) is released exactly once; a lease
// waiting on a person gives back its concurrency token; parked calls are
// capped and can be evicted, so they never pin the server.
package sessions

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime"
	"sync"
	"time"

	"github.com/wasmtools/wasmtools/plugins"
)

// Defaults of [Options].
const (
	// DefaultQueueLimit bounds the calls one client may have waiting for
	// one plugin instance, the running one included.
	DefaultQueueLimit = 16
	// DefaultMaxParked bounds the calls parked for a client's answer
	// across all clients: each holds an instance and a goroutine.
	DefaultMaxParked = 256
	// DefaultMaxParkedPerClient bounds one client's parked calls.
	DefaultMaxParkedPerClient = 4
	// DefaultMaxHandles bounds the open [Handle] clients. One with no
	// instance costs a few hundred bytes; one with an instance of a Go
	// plugin a few MiB, which is why the bound is not higher (the
	// instance limits and the memory budget bound instances as for any
	// client).
	DefaultMaxHandles = 1000
)

// Errors a lease can be refused with. Each is matched with errors.Is.
var (
	// ErrBusy: the client already has the most calls waiting for one
	// plugin that it may.
	ErrBusy = errors.New("too many calls waiting for this plugin in this session")
	// ErrAtCapacity: the instance limits are reached and no instance can
	// be evicted.
	ErrAtCapacity = errors.New("server at capacity: every plugin instance is busy")
	// ErrSessionEnded: the client's session ended while the call waited.
	ErrSessionEnded = errors.New("session has ended")
	// ErrClosed: the manager is shutting down.
	ErrClosed = errors.New("shutting down")
	// ErrRetired: the plugin version was retired by a reload; run the
	// version now served instead.
	ErrRetired = errors.New("plugin version retired")
	// ErrStart: a new instance could not start (its initialisation
	// failed); the wrapped error says why. It is a failure of the call,
	// not a refusal.
	ErrStart = errors.New("instance did not start")
	// ErrParkLimit: too many calls wait for answers already.
	ErrParkLimit = errors.New("too many calls wait for a client's answer")
	// ErrEvicted is the cause of a waiting lease's context when the server
	// needed its instance for another client.
	ErrEvicted = errors.New("evicted: the server needed the instance for another client")
	// ErrUnknownKey: a [Handle] key names no client: never opened, or
	// ended (idle past the timeout, evicted, or the server restarted).
	ErrUnknownKey = errors.New("unknown or expired session handle")
	// ErrMoved, given to [Lease.Done], drops the lease's instance without
	// a notice: the client's session was taken over by another replica,
	// and its next lease here starts from the state store. Until the
	// client is seeded again ([Manager.Seed]), that plugin's next
	// instance starts from what [Options.Stored] reads from the store, or
	// the lease fails with ErrMoved when it cannot tell: nothing runs on
	// a fresh instance in place of the stored state.
	ErrMoved = errors.New("session moved to another replica")
)

// Options configures a [Manager]. The zero value gives the documented
// defaults: no limits but the queue, no idle timeout.
type Options struct {
	// Logger receives instance lifecycle messages; nil discards them.
	Logger *slog.Logger
	// Observer is told of instance events, for metrics; nil ignores them.
	Observer Observer
	// QueueLimit bounds a client's calls waiting per plugin; 0 means
	// [DefaultQueueLimit]. A call past it is refused at once with
	// [ErrBusy].
	QueueLimit int
	// MaxInstances bounds the live instances of all plugins, and
	// MaxInstancesPerPlugin those of any one plugin; 0 means no bound.
	// InstanceLimits overrides MaxInstancesPerPlugin by plugin name; its
	// key "" does for every plugin it does not name.
	MaxInstances, MaxInstancesPerPlugin int
	InstanceLimits                      map[string]int
	// MemoryBudget bounds the memory of all live instances, each counted
	// at its plugin's memory limit; 0 means no bound.
	//
	// At any of these bounds an idle instance of the tenant holding the
	// most is freed (see Tenant): one of its pooled ones, else its least
	// recently used idle one (its client's next result says so); else
	// the oldest lease waiting for a person is evicted; with none of
	// those the lease is refused with [ErrAtCapacity].
	MemoryBudget uint64
	// MaxConcurrentCalls bounds the leases running guest code at once;
	// 0 means no bound. Further leases wait for a turn; a lease waiting
	// for a person does not hold one.
	MaxConcurrentCalls int
	// PoolSize bounds the idle warm instances kept per stateless plugin,
	// across its tenants' pools (see Tenant); 0 means twice GOMAXPROCS.
	PoolSize int
	// Tenant names the tenant of a lease from its context (the host: its
	// request's). A stateless plugin's warm pool is each tenant's own: an
	// instance never passes from one tenant to another, so that a plugin
	// that only claims to keep no state cannot carry one tenant's data
	// to another. A client belongs to the tenant of its first lease (a
	// handle's, to its group: [Manager.OpenIn]), and at an instance bound
	// the instance evicted is one of the tenant holding the most (its
	// clients' and its pools' idle ones counted), so that a tenant's many
	// sessions evict their own instances first. nil: every
	// lease is of one tenant, "".
	Tenant func(ctx context.Context) string
	// IdleTimeout ends a [Client] or [Handle] key's client after this
	// long with no lease; 0 means never. [Conn] clients end only at
	// [Manager.End].
	IdleTimeout time.Duration
	// MaxHandles bounds the open [Handle] clients; 0 means
	// [DefaultMaxHandles]. Opening one past it ends a handle client that
	// holds no lease (its next request is told the handle expired): the
	// least recently used of those that served exactly one request (a
	// client that never came back with its handle), else the least
	// recently used (one opened and not yet used, its minting call on
	// the way, is the newest). With every one holding a lease, Open fails with
	// [ErrAtCapacity].
	MaxHandles int
	// MaxClients bounds the clients of [Client] keys, and
	// MaxClientsPerGroup each group's share of them ([Options.Tenant]);
	// 0 means no bound. Each is kept until the idle timeout, and without
	// a bound a client naming a new key at each request held any number
	// (a red team: 400 calls, each with a client header value of its own
	// of 32 KiB, kept 56 MiB for 30 min). A new key's client past either
	// bound ends the least recently used of its group's clients that
	// hold no lease (past the total alone, else one of the group holding
	// the most, else anyone's); with none, its lease fails with
	// [ErrAtCapacity]. A client is counted from its first lease, so one
	// that [Manager.Seed] made is bounded then.
	MaxClients, MaxClientsPerGroup int
	// MaxUnreturned bounds the handle clients whose handle was never
	// passed back (minted by one call, not used since) that keep their
	// instances, in each group ([Manager.OpenIn]) apart; 0 means
	// [DefaultMaxUnreturned]. Past it, the group's oldest ones' idle
	// instances are freed, well before MaxHandles: a client that ignores
	// handles mints one per call, and an instance is cheap to make
	// again. Their handles stay open: one passed back later gets a fresh
	// instance (or its saved state), with the reset said (ReasonEvicted).
	MaxUnreturned int
	// MaxParked bounds the calls parked for an answer in all; 0 means
	// [DefaultMaxParked]. MaxParkedPerClient bounds one client's; 0
	// means [DefaultMaxParkedPerClient].
	MaxParked, MaxParkedPerClient int
	// Saved, if set, returns the saved state of key's instance of p (a
	// state store's copy, as of its last call), or nil: an instance
	// evicted for room then comes back from it on the client's next
	// lease, and the client is told nothing, instead of starting afresh
	// with an "evicted" reset. With nil, a non-empty reason
	// replaces that one as the reset's reason (the stored state is older
	// than the instance's last call: "not-saved"). known is false when
	// the caller could not ask (the store did not answer): the lease then
	// fails with [ErrMoved], retryable, and the next one asks again; a
	// fresh start would be checkpointed over the saved state.
	Saved func(ctx context.Context, key Key, p *plugins.Plugin) (st *plugins.State, reason string, known bool)
	// Stored, if set, returns p's state as the state store holds it for
	// key's client, read now, for a plugin whose instance was dropped as
	// moved ([ErrMoved]) with no seed since: its next instance starts
	// from it (from nothing, with known and no state or reason: the
	// store holds none; afresh with a reset of that reason, with a
	// reason). under is the fence the state was read under: unless the
	// client is still seeded under it, the lease fails with ErrMoved.
	// known is false when the caller cannot tell now: the lease then
	// fails with ErrMoved, and the client's next Seed decides.
	Stored func(ctx context.Context, key Key, p *plugins.Plugin) (st *plugins.State, reason string, under uint64, known bool)
	// StoredAfterCancel: an instance discarded because its call was
	// cancelled comes back as one dropped as moved does, from what Stored
	// reads (its state as of its last call that succeeded: a client long
	// gone must not reset a state the store holds), with no reset when
	// there is one. For a store written after every call.
	StoredAfterCancel bool
	// Waits, if set, reports whether a call of p's guest may wait for a
	// person ([Lease.Pause]). Only a lease of such a plugin gets a
	// context of its own, which eviction and Close cancel (they cancel
	// only leases waiting for a person); any other lease's [Lease.Context]
	// is the one Acquire was given, ended only with it. A context of its
	// own cost every lease four allocations, and the guest's watch on it
	// (the sandbox's AfterFunc) a fifth (issue 27, item 2). nil: every
	// lease may wait. A lease Waits said will not wait that pauses all
	// the same gives back its concurrency token, but is not evictable
	// while it waits (it has nothing to cancel), and is logged.
	Waits func(p *plugins.Plugin) bool
	// Ended, if set, is called with a client's key once the client has
	// ended: by End (also for a key with no client), the idle timeout,
	// eviction past MaxHandles, or Close. What the caller keeps per
	// client goes with it here, whoever ended the client. It is called
	// without the manager's lock, and must not block.
	//
	// client is the ended client's number ([Manager.ClientNumber]); for
	// End of a key with no client, the number of the last client made,
	// of any key. The key may have a new client by then, made while the
	// old one's end waited for its calls: a caller keeping things under
	// the key keeps those of a client numbered higher (a late end forgot
	// the new client's grant answers, TestLateEndKeepsReturningClientsGrants).
	Ended func(key Key, client uint64)
}

// Observer is told of instance events. Its methods must not block.
type Observer interface {
	// InstanceStarted: an instance of plugin was made and reserved.
	InstanceStarted(plugin string)
	// InstanceClosed: an instance of plugin was freed and its
	// reservation released.
	InstanceClosed(plugin string)
	// InstanceReset: an instance was discarded, and its client's next
	// result will say why: "trap", "timeout", "cancelled", "evicted" or
	// "upgrade".
	InstanceReset(plugin, reason string)
}

type nopObserver struct{}

func (nopObserver) InstanceStarted(string)       {}
func (nopObserver) InstanceClosed(string)        {}
func (nopObserver) InstanceReset(string, string) {}

// Manager owns clients and their instances. It is safe for concurrent use.
// Close it to free every instance.
type Manager struct {
	opts Options
	log  *slog.Logger
	obs  Observer
	// gaveBack, set by tests only, runs after a failed start gave back
	// what it took and before its lease lets the slot go.
	gaveBack func()

	mu      countedMutex
	closed  bool
	clients map[Key]*client
	// numbers are the clients' numbers by key, written with clients
	// under mu and read without it (ClientNumber): every tool call asks
	// for its client's, and under many sessions mu, which each lease
	// takes twice, is the host's most contended lock.
	numbers sync.Map // Key → uint64
	// numbered is the number of the last client made (client.number).
	numbered uint64
	handles  int // clients of Handle keys
	// keyed counts the clients of Client keys in each group
	// (Options.MaxClientsPerGroup), keyedAll in all.
	keyed    map[string]int
	keyedAll int
	// handleGroups index the open handle clients by group, and
	// idleHandles those with no lease of all groups (handleindex.go).
	handleGroups map[string]*handleGroup
	idleHandles  idleHandles
	// idleClients are the clients of Client keys with no lease, least
	// recently used first, as idleHandles: the idle reaper reads the
	// front of each rather than every client.
	idleClients list.List
	lru         *list.List // of *slot holding an instance, least recently used first
	live        int
	perPlugin   map[string]int
	memory      uint64
	pools       map[poolKey]*pool // by plugin name and tenant
	// pooledIdle counts the idle pooled instances of each plugin, in all
	// its pools: PoolSize bounds it.
	pooledIdle map[string]int
	// pooledBusy counts the pooled instances leases hold, by pool: they
	// count for their tenant in the eviction ranking as the idle ones do.
	pooledBusy map[poolKey]int
	retired    map[*plugins.Plugin]bool
	// successor is what replaced each retired version whose retirement
	// runs (nil when it was removed), and incoming counts, for each
	// version, the retirements running that move instances to it: its
	// own retirement waits for them before closing it (retire.go).
	successor map[*plugins.Plugin]*plugins.Plugin
	incoming  map[*plugins.Plugin]int
	scratch   evictScratch          // evictIdleLocked's
	leases    map[*Lease]struct{}   // live leases
	waiting   *list.List            // of *Lease waiting for a person, oldest first
	parked    map[string]*parkedRun // by run ID
	watchers  int                   // goroutines waiting on changed
	changed   chan struct{}         // closed and replaced when a lease ends, if watched

	running chan struct{} // a token per running lease, when bounded
	stop    chan struct{}
	wg      sync.WaitGroup // retirements and the idle reaper
}

// countedMutex is the manager's lock, which counts the times it was taken
// (under itself: no atomic), so that tests can hold a warm call to the
// holds it takes (TestWarmLeaseTakesLockTwice, and the host's
// TestWarmCallTakesManagerLockTwice): under many sessions it is the
// host's most contended lock.
type countedMutex struct {
	sync.Mutex
	taken uint64
}

func (mu *countedMutex) Lock() {
	mu.Mutex.Lock()
	mu.taken++
}

// LockTaken is how many times the manager's lock was taken before this
// call, for tests that pin what a call costs (the host's too:
// TestWarmCallTakesManagerLockTwice).
func (m *Manager) LockTaken() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.taken - 1
}

// New returns a manager with the given options (nil means defaults).
func New(opts *Options) *Manager {
	m := &Manager{
		clients:      map[Key]*client{},
		handleGroups: map[string]*handleGroup{},
		lru:          list.New(),
		perPlugin:    map[string]int{},
		pools:        map[poolKey]*pool{},
		pooledIdle:   map[string]int{},
		pooledBusy:   map[poolKey]int{},
		scratch:      evictScratch{byTenant: map[string]int{}},
		retired:      map[*plugins.Plugin]bool{},
		successor:    map[*plugins.Plugin]*plugins.Plugin{},
		incoming:     map[*plugins.Plugin]int{},
		leases:       map[*Lease]struct{}{},
		waiting:      list.New(),
		parked:       map[string]*parkedRun{},
		changed:      make(chan struct{}),
		stop:         make(chan struct{}),
	}
	if opts != nil {
		m.opts = *opts
	}
	m.log = m.opts.Logger
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.obs = m.opts.Observer
	if m.obs == nil {
		m.obs = nopObserver{}
	}
	if n := m.opts.MaxConcurrentCalls; n > 0 {
		m.running = make(chan struct{}, n)
	}
	if t := m.opts.IdleTimeout; t > 0 {
		m.wg.Add(1)
		go m.reapIdle(t)
	}
	return m
}

func (m *Manager) queueLimit() int {
	if m.opts.QueueLimit <= 0 {
		return DefaultQueueLimit
	}
	return m.opts.QueueLimit
}

func (m *Manager) poolSize() int {
	if m.opts.PoolSize <= 0 {
		return 2 * runtime.GOMAXPROCS(0)
	}
	return m.opts.PoolSize
}

// client is one client's state: its slots, one per plugin name.
type client struct {
	key      Key
	number   uint64           // the clients are numbered in the order they are made, from 1
	slots    map[string]*slot // guarded by Manager.mu
	ended    chan struct{}    // closed when the client ends
	closed   bool             // guarded by Manager.mu
	leases   int              // leases held or waited for; guarded by Manager.mu
	lastUsed time.Time        // guarded by Manager.mu
	requests int              // leases asked for, ever; guarded by Manager.mu
	parked   int              // guarded by Manager.mu
	group    string           // its tenant: a handle's group (OpenIn), else its first lease's (Options.Tenant), as is a handle's opened in group ""; guarded by Manager.mu
	elems    handleElems      // an open handle's places in the indexes (handleindex.go); guarded by Manager.mu
	idleElem *list.Element    // a Client key's place in Manager.idleClients while it has no lease; guarded by Manager.mu
	// keyed says a Client key's client is counted in Manager.keyed, from
	// its first lease (one that Seed made has none before); guarded by
	// Manager.mu.
	keyed bool
	// seeds are the states the client's first instances start from, by
	// plugin name (see Seed); guarded by Manager.mu.
	seeds map[string]Seed
	// fence is the fence of the client's last Seed: instances started
	// under another are stale; guarded by Manager.mu.
	fence uint64
	// started are the plugins the client started an instance of since
	// its last Seed: an AnyPlugin seed is not theirs; guarded by
	// Manager.mu.
	started map[string]bool
	// moved are the plugins whose lease ended with ErrMoved, with no
	// Seed since: what their next instance must start from is in the
	// state store, not known here (Options.Stored); guarded by
	// Manager.mu.
	moved map[string]bool
}

// clientLocked returns key's client, making it on first use, and counts a
// lease coming. The caller holds m.mu.
// For a Client key's client at its first lease past the bounds on them,
// it also returns the client to end, once m.mu is let go, to make room
// (see [Options.MaxClientsPerGroup]), or, refused, the client Seed made
// to end. That is also the first lease of a client Seed made (a state
// store's claim of a new key comes before it), which was bounded by
// nothing.
func (m *Manager) clientLocked(key Key, group string) (c *client, victim *client, err error) {
	if m.closed {
		return nil, nil, ErrClosed
	}
	c, ok := m.clients[key]
	if !ok && key.kind == KindHandle {
		return nil, nil, ErrUnknownKey
	}
	if key.kind == KindClient && (!ok || !c.keyed) {
		if victim, err = m.keyedVictimLocked(group); err != nil {
			if ok && c.leases == 0 {
				// Made by Seed, refused as a new client is: ended too
				// (the caller ends victim), or it would be kept for
				// good, never idle for the reaper.
				m.forgetLocked(c)
				return nil, c, err
			}
			return nil, nil, err
		}
		if victim != nil {
			m.forgetLocked(victim) // its room is this client's now
		}
	}
	if !ok {
		c = m.newClientLocked(key, group)
	}
	if c.key.kind == KindClient && !c.keyed {
		c.group = cmp.Or(c.group, group) // Seed's knew none
		c.keyed = true
		m.countKeyedLocked(c.group, 1)
	}
	if c.key.kind == KindHandle {
		m.busyHandleLocked(c)
	}
	m.busyClientLocked(c)
	c.leases++
	c.requests++
	c.lastUsed = time.Now()
	return c, victim, nil
}

// keyedVictimLocked is the client of a Client key to end so that one more
// of group's fits within the bounds (nil: it fits), or ErrAtCapacity
// when every one that could make room holds a lease. The caller holds
// m.mu.
func (m *Manager) keyedVictimLocked(group string) (*client, error) {
	share := m.opts.MaxClientsPerGroup
	overShare := share > 0 && m.keyed[group] >= share
	if !overShare && (m.opts.MaxClients <= 0 || m.keyedAll < m.opts.MaxClients) {
		return nil, nil
	}
	if c := m.idleKeyedLocked(group); c != nil {
		return c, nil
	}
	if overShare {
		return nil, fmt.Errorf("%w: this client's subject's %d clients (by client header) are all in use, its share", ErrAtCapacity, m.keyed[group])
	}
	most, n := "", -1
	for g, k := range m.keyed {
		if k > n || k == n && g < most { // ties by name, not map order
			most, n = g, k
		}
	}
	if c := m.idleKeyedLocked(most); c != nil {
		return c, nil
	}
	if e := m.idleClients.Front(); e != nil {
		return e.Value.(*client), nil
	}
	return nil, ServerFull(ErrAtCapacity, "the clients by client header, none idle,")
}

// idleKeyedLocked is group's least recently used Client key's client
// holding no lease, nil for none. The caller holds m.mu.
func (m *Manager) idleKeyedLocked(group string) *client {
	for e := m.idleClients.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*client); c.group == group {
			return c
		}
	}
	return nil
}

// newClientLocked makes key's client, of group. The caller holds m.mu.
func (m *Manager) newClientLocked(key Key, group string) *client {
	m.numbered++
	c := &client{key: key, number: m.numbered, group: group, slots: map[string]*slot{}, ended: make(chan struct{}), lastUsed: time.Now()}
	m.clients[key] = c
	m.numbers.Store(key, c.number)
	switch key.kind {
	case KindHandle:
		m.handles++
		m.indexHandleLocked(c)
	}
	return c
}

// countKeyedLocked counts n more (or fewer) Client keys' clients in
// group. The caller holds m.mu.
func (m *Manager) countKeyedLocked(group string, n int) {
	if m.keyed == nil {
		m.keyed = map[string]int{}
	}
	m.keyedAll += n
	if m.keyed[group] += n; m.keyed[group] <= 0 {
		delete(m.keyed, group)
	}
}

// regroupKeyedLocked gives c, of no group yet, its group. The caller
// holds m.mu.
func (m *Manager) regroupKeyedLocked(c *client, group string) {
	if c.group == group {
		return // every lease of a client without tenants: no map writes
	}
	if c.keyed && m.clients[c.key] == c {
		m.countKeyedLocked(c.group, -1)
		m.countKeyedLocked(group, 1)
	}
	c.group = group
}

// forgetLocked removes c from the clients, once. The caller holds m.mu.
func (m *Manager) forgetLocked(c *client) {
	if m.clients[c.key] == c {
		switch c.key.kind {
		case KindHandle:
			m.unindexHandleLocked(c)
			m.handles--
		case KindClient:
			if c.keyed {
				m.countKeyedLocked(c.group, -1)
			}
		}
		m.busyClientLocked(c)
		delete(m.clients, c.key)
		m.numbers.Delete(c.key)
	}
}

// busyClientLocked takes a Client key's client out of idleClients: a
// lease came, or it is forgotten. The caller holds m.mu.
func (m *Manager) busyClientLocked(c *client) {
	if c.idleElem != nil {
		m.idleClients.Remove(c.idleElem)
		c.idleElem = nil
	}
}

// Open makes the client of a [Handle] key, which requests may then use
// until it ends. At [Options.MaxHandles] it first ends a handle client
// with no lease (see there which); with none, it fails with
// [ErrAtCapacity]. It fails with [ErrClosed] after Close, and is a no-op
// for a key whose client exists.
func (m *Manager) Open(key Key) error { return m.OpenIn(key, "", 0) }

// OpenIn is [Manager.Open] for a client of group (a tenant): past the
// bounds it ends only a handle client of the same group (or of none),
// never another group's, and a group may hold at most share open
// handles (0: no share of its own, only MaxHandles); past its share it
// ends one of its own, and with none idle it fails with [ErrAtCapacity].
// Group "" is Open's: its victims may be anyone's. Each group's handles
// never passed back are bounded apart ([Options.MaxUnreturned]), group
// "" being one more group.
func (m *Manager) OpenIn(key Key, group string, share int) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	if _, ok := m.clients[key]; ok {
		m.mu.Unlock()
		return nil
	}
	inGroup := 0
	if g := m.handleGroups[group]; g != nil && group != "" && key.kind == KindHandle {
		inGroup = g.open
	}
	overShare := share > 0 && inGroup >= share
	var victim *client
	if key.kind == KindHandle && (m.handles >= m.maxHandles() || overShare) {
		// Handles whose client never came back first: a client that
		// ignores handles mints one per call.
		victim = m.handleVictimLocked(group, overShare)
		if victim == nil {
			m.mu.Unlock()
			if overShare {
				return fmt.Errorf("%w: this client's %d session handles are in use, its share", ErrAtCapacity, inGroup)
			}
			return ServerFull(ErrAtCapacity, "the session handles, none idle,")
		}
		// Forgotten now, so the count makes room under this lock; its
		// instances are freed below.
		m.forgetLocked(victim)
	}
	m.newClientLocked(key, group)
	if key.kind == KindHandle {
		m.reclaimUnreturnedLocked(group)
	}
	m.mu.Unlock()
	if victim != nil {
		m.log.Info("session handle evicted: too many open", "session", victim.key.String(), "max", m.maxHandles())
		m.endClient(context.Background(), victim)
	}
	return nil
}

func (m *Manager) maxHandles() int {
	if m.opts.MaxHandles <= 0 {
		return DefaultMaxHandles
	}
	return m.opts.MaxHandles
}

// leaveLocked counts a lease of c gone. The caller holds m.mu.
func (m *Manager) leaveLocked(c *client) {
	c.leases--
	c.lastUsed = time.Now()
	switch {
	case c.leases != 0:
	case m.indexed(c):
		m.idleHandleLocked(c)
	case c.key.kind == KindClient && m.clients[c.key] == c && c.idleElem == nil:
		c.idleElem = m.idleClients.PushBack(c) // at the back: lastUsed is now
	}
}

// End ends key's client: waiting calls fail with [ErrSessionEnded], and
// its instances are freed once the leases on them are done (or ctx ends;
// whatever holds an instance then, a lease, a failing Acquire or a
// retirement, frees it as it lets go). Idle instances are freed before End
// returns, even with ctx ended. It is idempotent, and a no-op for a key
// with no client.
func (m *Manager) End(ctx context.Context, key Key) {
	m.mu.Lock()
	c, last := m.clients[key], m.numbered
	m.mu.Unlock()
	if c != nil {
		m.endClient(ctx, c)
	} else {
		m.ended(key, last) // every client of key made before now has ended
	}
}

// ended tells Options.Ended that key's client numbered client ended.
func (m *Manager) ended(key Key, client uint64) {
	if m.opts.Ended != nil {
		m.opts.Ended(key, client)
	}
}

// ClientNumber returns the number of key's live client, 0 for none. The
// manager numbers the clients it makes, of every key, in order from 1: a
// client made after another has a higher number, so that what is kept
// under a key can say whose it is (see [Options.Ended]).
//
// It takes no lock: a client in clients is live (those closed are
// forgotten at once, under the same lock), so numbers, kept with clients,
// answers for both.
func (m *Manager) ClientNumber(key Key) uint64 {
	if n, ok := m.numbers.Load(key); ok {
		return n.(uint64)
	}
	return 0
}

func (m *Manager) endClient(ctx context.Context, c *client) {
	m.mu.Lock()
	if c.closed {
		m.mu.Unlock()
		return
	}
	c.closed = true
	close(c.ended)
	m.forgetLocked(c)
	slots := make([]*slot, 0, len(c.slots))
	for _, sl := range c.slots {
		slots = append(slots, sl)
	}
	m.mu.Unlock()
	for _, sl := range slots {
		// Held for good once taken: the client is over. An idle slot is
		// taken even with ctx ended (a select with both ready would
		// leave it at random, its instance then freed by no one).
		if !sl.tryLock() {
			select {
			case sl.lock <- struct{}{}:
			case <-ctx.Done():
				continue // its holder frees the instance as it lets go (letGo)
			}
		}
		if sl.inst != nil {
			m.log.Info("instance freed", "session", c.key.String(), "plugin", sl.plugin)
			m.dropInstance(sl)
		}
	}
	m.ended(c.key, c.number)
}

// reapIdle ends Client-key clients with no lease for longer than timeout,
// until the manager closes.
func (m *Manager) reapIdle(timeout time.Duration) {
	defer m.wg.Done()
	tick := time.NewTicker(max(timeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case now := <-tick.C:
			// Checked and ended under one lock: a request that comes
			// for the client meanwhile gets a new one. The idle lists
			// are in lastUsed order, so each is read from its front
			// only as far as its first client used within timeout: a
			// tick costs the clients it ends, not every client (it
			// walked them all, under the lock every request takes).
			var idle []*client
			m.mu.Lock()
			for _, l := range []*list.List{&m.idleHandles.once, &m.idleHandles.other, &m.idleClients} {
				for e := l.Front(); e != nil; {
					c, next := e.Value.(*client), e.Next()
					if now.Sub(c.lastUsed) <= timeout {
						break
					}
					c.closed = true
					close(c.ended)
					m.forgetLocked(c) // takes it out of l
					idle = append(idle, c)
					e = next
				}
			}
			m.mu.Unlock()
			for _, c := range idle {
				m.log.Info("client idle: freeing its instances", "session", c.key.String())
				for _, sl := range c.slots {
					sl.lock <- struct{}{} // free: the client had no lease
					if sl.inst != nil {
						m.dropInstance(sl)
					}
				}
				m.ended(c.key, c.number)
			}
		}
	}
}

// Close ends every client and frees every instance: parked calls are
// abandoned, leases waiting for a person are cancelled, and running leases
// are waited for until ctx ends (they free their instances when they are
// done). New leases are refused with [ErrClosed]. It is idempotent.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.stop)
	var parked []*parkedRun
	for id, p := range m.parked {
		parked = append(parked, p)
		m.unparkLocked(id)
	}
	for e := m.waiting.Front(); e != nil; e = e.Next() {
		e.Value.(*Lease).cancel(ErrClosed)
	}
	clients := make([]*client, 0, len(m.clients))
	for _, c := range m.clients {
		clients = append(clients, c)
	}
	m.mu.Unlock()
	for _, p := range parked {
		p.abandon(ErrClosed)
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { m.endClient(ctx, c) })
	}
	wg.Wait()
	m.drainPools()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sessions: close: calls were still running: %w", err)
	}
	return nil
}

// Stats are the manager's counts at one moment.
type Stats struct {
	Live      int            // live instances
	PerPlugin map[string]int // live instances by plugin name, those with any
	Memory    uint64         // memory reserved by live instances
	Clients   int            // clients with state
	Leases    int            // live leases
	Waiting   int            // leases waiting for a person
	Queued    int            // calls waiting for a slot another call holds
	Parked    int            // calls parked for an answer
	Handles   int            // open session handles
}

// Stats reports the manager's counts.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Stats{Live: m.live, PerPlugin: map[string]int{}, Memory: m.memory, Clients: len(m.clients), Leases: len(m.leases), Waiting: m.waiting.Len(), Parked: len(m.parked), Handles: m.handles, Queued: m.queuedLocked()}
	for k, v := range m.perPlugin {
		if v > 0 {
			s.PerPlugin[k] = v
		}
	}
	return s
}

// broadcastLocked wakes the goroutines waiting for a lease to end. The
// caller holds m.mu.
func (m *Manager) broadcastLocked() {
	if m.watchers > 0 {
		close(m.changed)
		m.changed = make(chan struct{})
	}
}

// waitUntil waits until cond, checked under m.mu, holds, rechecking each
// time a lease ends, or until ctx or the manager ends.
func (m *Manager) waitUntil(ctx context.Context, cond func() bool) error {
	m.mu.Lock()
	for !cond() {
		ch := m.changed
		m.watchers++
		m.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		}
		m.mu.Lock()
		m.watchers--
		if err != nil {
			m.mu.Unlock()
			return err
		}
	}
	m.mu.Unlock()
	return nil
}

// Holds reports whether key's client has a live instance of the plugin
// named plugin: a notification for the client (its roots changed) goes
// only to instances it already has, never starting one.
func (m *Manager) Holds(key Key, plugin string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.clients[key]
	if !ok || c.closed {
		return false
	}
	sl, ok := c.slots[plugin]
	return ok && sl.elem != nil // elem is set, under m.mu, while inst is
}

// ReasonEvicted is the [Reset] reason of an instance evicted for room
// under the instance limits.
const ReasonEvicted = "evicted"

// ReasonReplicaLost is the [Reset] reason of an instance that should have
// started from a client's saved state (see [Manager.Seed]) and could not:
// the plugin cannot be snapshotted, or its version changed without a
// handoff, or the state did not restore.
const ReasonReplicaLost = "replica-lost"

// Seed is the saved state a client's first instance of a plugin starts
// from in this process: the client's session moved here from a replica
// that no longer serves it.
type Seed struct {
	// State is the instance's saved state; nil when it could not be saved
	// (Lost says why): the client's instance then starts afresh, and its
	// next result says so (a [Reset] with [ReasonReplicaLost]).
	State *plugins.State
	Lost  string
	// Reason is the [Reset] reason when the state is lost; ""
	// means [ReasonReplicaLost].
	Reason string
	// Unsaid, with State, is the reason of a reset the client may not
	// have been told of (State is what the plugin started afresh with
	// since): the instance starts from State, and says the reset.
	Unsaid string
}

// AnyPlugin names a [Seed] for each plugin the client has no seed of its
// own for, and has started no instance of since the Seed. The durable
// keeper gives one when the state store lost a session's record and it
// cannot tell which plugins the session used on other replicas: each
// says its state was lost on its first call, including one the session
// never used (no one can tell it apart). It holds a "/", which no
// plugin's name does (a name is a file's base name), so that a plugin
// named "*" is not taken for it.
const AnyPlugin = "*/"

// seedFor returns the seed of c's next instance of the plugin name: its
// own, else an AnyPlugin seed, unless name started since the Seed. The
// caller holds Manager.mu.
func (c *client) seedFor(name string) (Seed, bool) {
	if s, ok := c.seeds[name]; ok {
		return s, true
	}
	if s, ok := c.seeds[AnyPlugin]; ok && !c.started[name] {
		return s, true
	}
	return Seed{}, false
}

// Seed gives key's client the states its first instances start from, by
// plugin name, replacing any seeds it had, under fence (the claim that
// vouches for them). An instance the client holds under the same fence
// keeps going, as does one a lease is starting under it; one started
// under another fence is stale (another holder
// served the session since): an idle one is closed now, a busy one when
// its lease is done ([Lease.Stale] says so meanwhile), without a notice,
// and the plugin's next lease starts from its seed. The seed of an
// instance that keeps going is dropped: after an eviction, the instance
// starts from [Options.Saved], which knows what was saved since. Key's client is made
// if need be, except a [Handle] key's, which must be open
// ([ErrUnknownKey]).
func (m *Manager) Seed(key Key, seeds map[string]Seed, fence uint64) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	c, ok := m.clients[key]
	if !ok {
		if key.kind == KindHandle {
			m.mu.Unlock()
			return ErrUnknownKey
		}
		c = m.newClientLocked(key, "")
	}
	// An instance that stays (same fence) is newer than its seed: were
	// it evicted later, its seed would roll it back unnoticed. So is one
	// a lease is starting under fence (its lease read its seed or asks
	// Options.Saved): under another fence it is stale once started.
	seeds = maps.Clone(seeds)
	c.started = nil
	for name, sl := range c.slots {
		if (sl.inst != nil || sl.starting) && sl.fence == fence {
			delete(seeds, name)
			if c.started == nil {
				c.started = map[string]bool{}
			}
			c.started[name] = true
		}
	}
	c.seeds = seeds
	c.fence = fence
	c.moved = nil
	m.mu.Unlock()
	for _, sl := range m.slotsOf(key) {
		if sl.tryLock() {
			m.mu.Lock()
			stale := sl.inst != nil && sl.fence != fence
			m.mu.Unlock()
			if stale {
				m.dropInstance(sl)
			}
			m.letGo(sl)
		}
	}
	return nil
}

// Adopt makes the instances key's client holds under fence from current
// under fence to, as though they had started under it, and seeds the
// client under to with no seeds: a session this replica served from
// memory before any claim (from 0) keeps what its calls did once its
// first claim finds that no one else can have served it. Leases running
// on those instances go on under to (their [Lease.Stale] stays false),
// and so does an instance a lease is starting under from: it would
// otherwise record from once started, be stale, and be dropped by the
// next lease, what its call did lost without a notice. It returns the
// plugins whose instances it kept, starting ones included; a client not
// seeded under from is left as it is (nil). Not a [Handle] key's.
func (m *Manager) Adopt(key Key, from, to uint64) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.clients[key]
	if m.closed || !ok || c.closed || c.fence != from {
		return nil
	}
	var kept []string
	for name, sl := range c.slots {
		if (sl.inst != nil || sl.starting) && sl.fence == from {
			sl.fence = to
			kept = append(kept, name)
		}
	}
	for l := range m.leases {
		if l.c == c && l.sl != nil && l.fence.Load() == from {
			l.fence.Store(to)
		}
	}
	c.seeds, c.started, c.moved = nil, nil, nil
	for _, name := range kept {
		if c.started == nil {
			c.started = map[string]bool{}
		}
		c.started[name] = true
	}
	c.fence = to
	return kept
}

// Instances calls f for each of the client's instances, with its fence
// (see [Manager.Seed]), holding its slot so that no call runs meanwhile (a
// checkpoint at drain); f's error stops the walk and is returned. A busy
// slot is waited for, until ctx ends (then ctx's error is returned); an
// idle one is taken even once ctx has ended, so that a drain past its
// grace still walks the clients whose calls are over. An instance of a
// stale fence is skipped.
func (m *Manager) Instances(ctx context.Context, key Key, f func(plugin string, inst *plugins.Instance, fence uint64) error) error {
	for _, sl := range m.slotsOf(key) {
		if !sl.tryLock() {
			select {
			case sl.lock <- struct{}{}:
			case <-sl.c.ended:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		m.mu.Lock()
		inst, fence, stale := sl.inst, sl.fence, sl.fence != sl.c.fence
		m.mu.Unlock()
		var err error
		if inst != nil && inst.Err() == nil && !stale {
			err = f(sl.plugin, inst, fence)
		}
		m.letGo(sl)
		if err != nil {
			return err
		}
	}
	return nil
}

// Keys returns the keys of the clients live now.
func (m *Manager) Keys() []Key {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]Key, 0, len(m.clients))
	for k, c := range m.clients {
		if !c.closed {
			keys = append(keys, k)
		}
	}
	return keys
}

// Fence returns the fence key's client was last seeded under (see
// [Manager.Seed]), 0 for a client never seeded or none.
func (m *Manager) Fence(key Key) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.clients[key]; ok && !c.closed {
		return c.fence
	}
	return 0
}

// Has reports whether key has a live client.
func (m *Manager) Has(key Key) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.clients[key]
	return ok && !c.closed
}

// WaitIdle waits until no lease runs guest code and none is queued for a
// slot (leases waiting for a person do not count: a drain does not wait
// for people), or ctx ends.
func (m *Manager) WaitIdle(ctx context.Context) error {
	return m.waitUntil(ctx, func() bool {
		if len(m.leases) != m.waiting.Len() {
			return false
		}
		return m.queuedLocked() <= 0
	})
}

// queuedLocked counts the leases queued for a slot: a client's leases
// count those, not yet in m.leases. The caller holds m.mu.
func (m *Manager) queuedLocked() int {
	queued := 0
	for l := range m.leases {
		if l.c != nil {
			queued--
		}
	}
	for _, c := range m.clients {
		queued += c.leases
	}
	return queued
}

// slotsOf returns key's client's slots now (none for no client).
func (m *Manager) slotsOf(key Key) []*slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := m.clients[key]
	if c == nil {
		return nil
	}
	slots := make([]*slot, 0, len(c.slots))
	for _, sl := range c.slots {
		slots = append(slots, sl)
	}
	return slots
}

// Plugins returns the names of the plugins key's client holds an
// instance of, busy or not, without waiting for any.
func (m *Manager) Plugins(key Key) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.clients[key]
	if !ok || c.closed {
		return nil
	}
	var names []string
	for name, sl := range c.slots {
		if sl.elem != nil {
			names = append(names, name)
		}
	}
	return names
}
