package host

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
)

// Per-tenant shares of the bounds the clients share (issue 26): a tenant
// is an authenticated subject, and all clients without a subject together
// are one more. One tenant exhausting its share leaves the others theirs.

// tenantOf is the tenant of subject ("" for none): a keyed digest, so that
// a subject's name (any string) never shows in logs or keys.
func (h *Host) tenantOf(subject string) string {
	if subject == "" {
		return noSubjectTenant // as below, without an allocation per call
	}
	return "tenant:" + h.subjectTag(subject)
}

// noSubjectTenant is the tenant of the clients without a subject.
const noSubjectTenant = "tenant:-"

// pooled reports whether tenant is the clients without a subject: a
// refusal past its share says what the share is, never what the tenant
// holds, which is every other such client's use too (a subject's
// figures are its own: its refusals say them).
func pooled(tenant string) bool { return tenant == noSubjectTenant }

// shareTenant is the tenant whose share subject's request counts against:
// tenantOf with tenants, and without them "", everyone's.
func (h *Host) shareTenant(subject string) string {
	if !h.opts.Tenants {
		return ""
	}
	return h.tenantOf(subject)
}

// shares counts what each tenant holds of one bound. It is safe for
// concurrent use.
type shares struct {
	mu   sync.Mutex
	held map[string]int
}

// take counts one more for tenant if it holds fewer than max, and
// reports whether it did.
func (s *shares) take(tenant string, max int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant] >= max {
		return false
	}
	if s.held == nil {
		s.held = map[string]int{}
	}
	s.held[tenant]++
	return true
}

// give counts one fewer for tenant.
func (s *shares) give(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant]--; s.held[tenant] <= 0 {
		delete(s.held, tenant)
	}
}

// byteShares counts bytes held under a bound in all and each tenant's
// share of it: the parked calls' requests (elicit.go), refused at once
// past a bound (take), and the request bodies being read and served
// (bodies.go), which wait a while for room first (await). It is safe for
// concurrent use.
type byteShares struct {
	mu    sync.Mutex
	total int
	held  map[string]int
	room  chan struct{} // closed when bytes are given back; nil with no one waiting
}

// take counts n more bytes for tenant unless the total would pass
// maxTotal or tenant's pass share (share <= 0: no share), refusing with
// an error matching sessions.ErrParkLimit that says which, as the count
// of parked calls refuses.
func (b *byteShares) take(tenant string, n, maxTotal, share int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.tryLocked(tenant, n, maxTotal, share):
		return nil
	case b.total+n > maxTotal:
		return sessions.ServerFull(sessions.ErrParkLimit, "the bytes parked calls keep of their requests")
	case pooled(tenant):
		return fmt.Errorf("%w: the parked calls of the clients without a subject, together, keep their share of %d bytes of their requests; this one would keep %d more", sessions.ErrParkLimit, share, n)
	default:
		return fmt.Errorf("%w: this client's subject's keep %d bytes of their requests, and this one %d more; its share is %d", sessions.ErrParkLimit, b.held[tenant], n, share)
	}
}

// Which bound of a byteShares refused (await), as a metric's label.
const (
	boundTotal = "total"
	boundShare = "per_subject"
)

// await counts n more bytes for tenant as take does, but past a bound
// waits up to patience for bytes to be given back (or until ctx ends).
// It returns "" when it counted them, else the bound that refused them
// at its last try: boundTotal or boundShare.
func (b *byteShares) await(ctx context.Context, tenant string, n, maxTotal, share int, patience time.Duration) (refused string) {
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.tryLocked(tenant, n, maxTotal, share) {
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return ""
		}
		refused = boundShare
		if b.total+n > maxTotal {
			refused = boundTotal
		}
		if b.room == nil {
			b.room = make(chan struct{})
		}
		room := b.room
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(patience)
			defer timer.Stop()
		}
		select {
		case <-room:
		case <-timer.C:
			return refused
		case <-ctx.Done():
			return refused
		}
	}
}

// tryLocked counts n more bytes for tenant if they stay within maxTotal
// and share (share <= 0: no share), and reports whether it did. b.mu is
// held.
func (b *byteShares) tryLocked(tenant string, n, maxTotal, share int) bool {
	if b.total+n > maxTotal || share > 0 && b.held[tenant]+n > share {
		return false
	}
	if b.held == nil {
		b.held = map[string]int{}
	}
	b.total += n
	b.held[tenant] += n
	return true
}

// sum is the bytes counted in all.
func (b *byteShares) sum() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// give ends what take or await counted of n bytes for tenant, and wakes
// the callers of await waiting for room.
func (b *byteShares) give(tenant string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total -= n
	if b.held[tenant] -= n; b.held[tenant] <= 0 {
		delete(b.held, tenant)
	}
	if b.room != nil {
		close(b.room)
		b.room = nil
	}
}

// heldInstances counts, for each tenant and plugin, the instances its
// calls in flight hold (calls of one client queue on one instance: they
// count once), and for each tenant the memory limits of them all: what
// pluginShares bounds. It is safe for concurrent use.
type heldInstances struct {
	mu    sync.Mutex
	calls map[string]map[string]int // tenant and plugin -> instance -> calls in flight
	bytes map[string]int            // tenant -> memory limits of the instances held
}

// instanceOf names the instance a call of p for key holds: the client's
// own, or, for a plugin that keeps no state (a pooled instance for each
// call), one of its own.
func instanceOf(key sessions.Key, p *plugins.Plugin) string {
	if p.Stateless() || key == (sessions.Key{}) {
		return "call:" + strconv.FormatUint(callSeq.Add(1), 10)
	}
	return key.String()
}

// callSeq numbers the calls that hold an instance of their own.
var callSeq atomic.Uint64

// take counts a call of tenant's on instance inst of plugin, of m bytes:
// refused (an error matching sessions.ErrBusy) when it needs an instance
// the tenant's share does not allow: more than n of plugin's (n > 0), or
// more than bytes of memory in all (bytes > 0; a first instance always).
func (s *heldInstances) take(tenant, plugin, inst string, n, m, bytes int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	group := tenant + "\x00" + plugin
	if s.calls[group][inst] > 0 {
		s.calls[group][inst]++
		return nil
	}
	switch held := s.bytes[tenant]; {
	case n > 0 && len(s.calls[group]) >= n:
		return fmt.Errorf("%w: this client's subject's calls in flight hold %d instances of plugin %q, its share", sessions.ErrBusy, n, plugin)
	case bytes > 0 && held > 0 && held+m > bytes && pooled(tenant):
		return fmt.Errorf("%w: the calls in flight of the clients without a subject, together, hold instances of their share of the memory budget, %d bytes", sessions.ErrBusy, bytes)
	case bytes > 0 && held > 0 && held+m > bytes:
		return fmt.Errorf("%w: this client's subject's calls in flight hold instances of %d bytes of memory, its share of the memory budget is %d", sessions.ErrBusy, held, bytes)
	}
	if s.calls == nil {
		s.calls, s.bytes = map[string]map[string]int{}, map[string]int{}
	}
	if s.calls[group] == nil {
		s.calls[group] = map[string]int{}
	}
	s.calls[group][inst] = 1
	s.bytes[tenant] += m
	return nil
}

// give ends what take counted.
func (s *heldInstances) give(tenant, plugin, inst string, m int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	group := tenant + "\x00" + plugin
	if s.calls[group][inst]--; s.calls[group][inst] > 0 {
		return
	}
	delete(s.calls[group], inst)
	if len(s.calls[group]) == 0 {
		delete(s.calls, group)
	}
	if s.bytes[tenant] -= m; s.bytes[tenant] <= 0 {
		delete(s.bytes, tenant)
	}
}

// count is what tenant holds.
func (s *shares) count(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[tenant]
}

// callShare is each tenant's share of the calls in flight
// ([Options.MaxCallsPerSubject]); by default a quarter of the smallest of
// MaxInstances and MaxConcurrentCalls, and 0 (no share) when neither is
// set. A call in flight holds an instance (a parked one too), so one
// tenant's busy calls can never take every instance.
func (h *Host) callShare() int {
	if !h.opts.Tenants {
		return 0
	}
	if h.opts.MaxCallsPerSubject > 0 {
		return h.opts.MaxCallsPerSubject
	}
	least := 0
	for _, b := range []int{h.opts.MaxInstances, h.opts.MaxConcurrentCalls} {
		if b > 0 && (least == 0 || b < least) {
			least = b
		}
	}
	if least == 0 {
		return 0
	}
	return max(least/4, 1)
}

// pluginShares are each tenant's shares of the bounds of plugin p that a
// call in flight holds an instance of: its instances (a quarter of
// [Options.InstanceLimits] for p, else of MaxInstancesPerPlugin) and the
// memory budget's bytes (a quarter of [Options.MemoryBudget], an instance
// counted at p's memory limit, as the budget counts it); 0 for a bound not
// set. callShare alone missed them: with --max-instances-per-plugin 4 and
// --max-instances 64, bob's 4 calls, well within his share of 16, held
// every instance of the plugin, and alice's call was refused (a review:
// TestPerPluginBoundsShared).
func (h *Host) pluginShares(p *plugins.Plugin) (instances, bytes int) {
	if !h.opts.Tenants || p == nil {
		return 0, 0
	}
	if bound := h.ses.PluginLimit(p.Name()); bound > 0 { // as the session layer reads it
		instances = max(bound/4, 1)
	}
	if b := h.opts.MemoryBudget; b > 0 && p.MemoryLimit() > 0 {
		bytes = int(min(b/4, uint64(math.MaxInt)))
	}
	return instances, bytes
}

// maxRateTenants bounds the tenants whose call rates are tracked; past
// it, the tenants whose buckets are full (idle) are forgotten.
const maxRateTenants = 4096

// admitRun admits a request that runs a guest of p on key's instance (a
// tool call, prompt get, resource read or completion; env is its link to
// its client, nil for none) as its client's subject's: over HTTP, it
// counts against the subject's shares ([Host.admitCall]), so that a
// subject past them is refused whichever request it sends; key's store
// record is the subject's tenant's, whichever request writes it first;
// and the returned context says, with tenants, whose the request is
// ([requestTenant]): the pool its stateless plugin's instance comes from,
// the tenant whose instances an eviction for it takes first, and for a
// session it takes over from another replica, its handle's group
// ([Host.openAdopted]) and its grant answers ([grantBook.restore]).
// release must be called once the request's lease is done.
func (h *Host) admitRun(ctx context.Context, env *callEnv, key sessions.Key, p *plugins.Plugin) (_ context.Context, release func(), err error) {
	release = func() {}
	_, req := env.current()
	if req == nil {
		return ctx, release, nil
	}
	if req.Extra != nil && req.Extra.Header != nil { // over HTTP
		if release, err = h.admitCall(subjectOf(req.Extra), p, key); err != nil {
			return ctx, nil, err
		}
	}
	// Only a session a store keeps (h.storeBytes) is attributed.
	attribute := !p.Stateless() && h.storeBytes != nil
	if !attribute && !h.opts.Tenants {
		return ctx, release, nil // a keyed digest saved on the fast path
	}
	tenant := h.tenantOf(subjectOf(req.Extra))
	if attribute {
		h.storeBytes.attribute(durable.StoreID(key), tenant)
	}
	if h.opts.Tenants {
		ctx = context.WithValue(ctx, tenantKey{}, tenant)
	}
	return ctx, release, nil
}

// tenantKey is the context key of the tenant of a request that may take
// a session over from another replica (with Options.Tenants): see
// [Host.admitRun].
type tenantKey struct{}

// requestTenant is sessions.Options.Tenant: the tenant admitRun says the
// request is, "" for requests it did not see (none that run a guest for a
// client). Each tenant's requests lease a stateless plugin's instances
// from a pool of the tenant's own: a plugin declares itself stateless (its
// wasmtools.stateless section), and an untrusted one may say so falsely;
// with one pool, an instance that kept one tenant's arguments served the
// next tenant's call, a channel between tenants that no grant gave it. And
// at an instance bound, the tenant holding the most instances loses one
// first.
func requestTenant(ctx context.Context) string {
	tenant, _ := ctx.Value(tenantKey{}).(string)
	return tenant
}

// openAdopted opens the client of a handle this replica takes over from
// the store (durable.Options.OpenHandle) in the group of the tenant of
// the request taking it (admitRun), as mintHandle opened it on the
// replica that minted it: the handle says whose it is, and the request
// was checked against it. In no group, any tenant's new handle could
// evict it (sessions.Manager.OpenIn).
func (h *Host) openAdopted(ctx context.Context, key sessions.Key) error {
	group, _ := ctx.Value(tenantKey{}).(string)
	return h.ses.OpenIn(key, group, h.handleShare())
}

// admitCall counts a request over HTTP by subject ("" for none) against
// its tenant's shares: the calls it has in flight ([Host.callShare]) and
// its calls per second ([Options.CallsPerSecondPerSubject]). Past either
// it fails with an error matching sessions.ErrBusy (CodeBusy, retry);
// else release must be called once the call has ended.
func (h *Host) admitCall(subject string, p *plugins.Plugin, key sessions.Key) (release func(), err error) {
	tenant := h.tenantOf(subject)
	if r := h.opts.CallsPerSecondPerSubject; r > 0 {
		h.rateMu.Lock()
		if h.rates == nil {
			h.rates = map[string]*rate.Limiter{}
		}
		if len(h.rates) >= maxRateTenants {
			for k, l := range h.rates {
				if l.Tokens() >= float64(l.Burst()) {
					delete(h.rates, k)
				}
			}
		}
		l := h.rates[tenant]
		if l == nil {
			l = rate.NewLimiter(rate.Limit(r), max(int(r), 1))
			h.rates[tenant] = l
		}
		ok := l.Allow()
		h.rateMu.Unlock()
		if !ok {
			return nil, fmt.Errorf("%w: this client's subject makes more than %g calls per second, its share", sessions.ErrBusy, r)
		}
	}
	// What was taken, given back by release; the closures only on the
	// paths that take something (the common path allocates nothing).
	var taken []func()
	if share := h.callShare(); share > 0 {
		if !h.callShares.take(tenant, share) {
			return nil, fmt.Errorf("%w: this client's subject has %d calls in flight, its share", sessions.ErrBusy, share)
		}
		taken = append(taken, func() { h.callShares.give(tenant) })
	}
	if n, bytes := h.pluginShares(p); n > 0 || bytes > 0 {
		inst := instanceOf(key, p)
		m := int(min(p.MemoryLimit(), uint64(math.MaxInt)))
		if err := h.held.take(tenant, p.Name(), inst, n, m, bytes); err != nil {
			giveAll(taken)
			return nil, err
		}
		taken = append(taken, func() { h.held.give(tenant, p.Name(), inst, m) })
	}
	if len(taken) == 0 {
		return noRelease, nil
	}
	gives := taken
	var once sync.Once
	return func() { once.Do(func() { giveAll(gives) }) }, nil
}

// noRelease is admitCall's release when nothing was taken.
func noRelease() {}

func giveAll(gives []func()) {
	for _, give := range gives {
		give()
	}
}

// Defaults of the state store's byte budgets ([Options.StoreBytesPerRecord]
// and the others): what one session's record, one tenant's records and
// all records may hold. The shipped Kubernetes Redis has 1 GiB.
const (
	DefaultStoreBytesPerRecord = 64 << 20
	DefaultStoreBytesPerTenant = 128 << 20
	DefaultStoreBytesTotal     = 768 << 20
	// maxInitializeRecord bounds a stateful session's MCP record (its
	// initialize parameters): a client's capabilities are a few KiB.
	maxInitializeRecord = 256 << 10
)

// ErrStoreBudget is matched (errors.Is) by a write to the state store
// refused by a byte budget: the record's, its tenant's or the total. The
// state is then not saved (the call's result is marked notSaved
// "over-budget"), and the session goes on from this replica's memory.
var ErrStoreBudget = errors.New("state store budget exceeded")

// storeBudget counts the bytes each session's record holds in the state
// store, by tenant, and refuses a write past a budget. A record counts
// until its session ends or its store TTL lapses unwritten. It is safe
// for concurrent use.
//
// With a store that counts the tenants' bytes itself (shared: Redis,
// which replicas share), only the per-record budget is checked here; the
// tenant's and the total are the store's, checked in the script that
// writes (quota): counted here, in each replica's memory, a tenant
// stored its share once per replica (a red team, stop 67).
type storeBudget struct {
	perRecord, perTenant, total int
	shared                      bool

	mu      sync.Mutex
	tenant  map[string]string               // store ID -> tenant (attribute)
	assumed map[string]bool                 // store IDs written before any attribution: the anonymous tenant's until one comes
	records map[string]map[string]*recBytes // tenant -> store ID -> bytes
	held    map[string]int                  // tenant -> bytes
	sum     int
	// unscanned counts down the attributions met at maxAttributed
	// until forgetUnwrittenLocked scans again: a scan per 8,192 of them,
	// not one each (a map full of written records, or one newcomer
	// forgotten per scan, would otherwise cost a scan of 131,072 entries
	// per request, under the lock every checkpoint takes).
	unscanned int
}

type recBytes struct {
	fields  map[string]int
	bytes   int
	expires time.Time
}

// newStoreBudget makes the budgets; tenants false leaves out the
// per-tenant one (every client is one tenant).
func newStoreBudget(perRecord, perTenant, total int, tenants bool) *storeBudget {
	if !tenants {
		perTenant = -1
	}
	return &storeBudget{
		perRecord: cmp.Or(perRecord, DefaultStoreBytesPerRecord), perTenant: cmp.Or(perTenant, DefaultStoreBytesPerTenant), total: cmp.Or(total, DefaultStoreBytesTotal),
		tenant: map[string]string{}, assumed: map[string]bool{}, records: map[string]map[string]*recBytes{}, held: map[string]int{},
	}
}

// maxAttributed bounds the records whose tenant is remembered before
// they are written; past it a record counts as the anonymous tenant's.
const maxAttributed = 1 << 17

// attribute says whose the record id is: the tenant of the requests that
// write it. A record never attributed counts as the anonymous tenant's;
// one written before its first attribution counted as the anonymous
// tenant's until then, and its bytes now move to tenant (a write by a
// path that does not attribute must not pin a subject's record on the
// anonymous clients for good).
func (b *storeBudget) attribute(id, tenant string) {
	if b == nil || id == "" {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	was, ok := b.tenant[id]
	if !ok && len(b.tenant) >= maxAttributed {
		if b.unscanned--; b.unscanned <= 0 {
			b.forgetUnwrittenLocked()
		}
	}
	switch {
	case !ok && len(b.tenant) < maxAttributed:
		b.tenant[id] = tenant
	case ok && b.assumed[id]:
		delete(b.assumed, id)
		b.tenant[id] = tenant
		if r := b.records[was][id]; r != nil && was != tenant {
			b.dropLocked(was, id, r)
			if b.records[tenant] == nil {
				b.records[tenant] = map[string]*recBytes{}
			}
			b.records[tenant][id] = r
			b.held[tenant] += r.bytes
			b.sum += r.bytes
		}
	}
}

// reserve counts field of record id at size bytes, to be kept for ttl,
// and returns how to undo it (the write failed); past a budget it fails
// with an error matching [ErrStoreBudget] that says which.
func (b *storeBudget) reserve(id, field string, size int, ttl time.Duration, anonymous string) (undo func(), err error) {
	if b == nil {
		return func() {}, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	tenant, recs, r := b.recordLocked(id, anonymous, now)
	delta := size - r.fields[field]
	switch {
	case field == "mcp" && size > maxInitializeRecord:
		return nil, fmt.Errorf("%w: the session's MCP record (its initialize parameters) is %d bytes, over %d", ErrStoreBudget, size, maxInitializeRecord)
	case r.bytes+delta > b.perRecord:
		return nil, fmt.Errorf("%w: the session's stored state would be %d bytes, over %d for one session", ErrStoreBudget, r.bytes+delta, b.perRecord)
	case delta > 0 && !b.shared && b.perTenant > 0 && b.held[tenant]+delta > b.perTenant:
		return nil, fmt.Errorf("%w: this client's subject stores %d bytes, and this state %d more; its share is %d", ErrStoreBudget, b.held[tenant], delta, b.perTenant)
	case delta > 0 && !b.shared && b.sum+delta > b.total:
		for t := range b.records { // the other tenants' lapsed records first
			b.pruneLocked(t, now)
		}
		if b.sum+delta > b.total {
			return nil, sessions.ServerFull(ErrStoreBudget, "the bytes of sessions stored")
		}
	}
	prev, prevExp := r.fields[field], r.expires
	_, had := r.fields[field]
	r.fields[field] = size
	r.bytes += delta
	r.expires = now.Add(ttl)
	recs[id] = r
	b.held[tenant] += delta
	b.sum += delta
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.records[tenant][id] != r {
			return
		}
		if had {
			r.fields[field] = prev
		} else {
			delete(r.fields, field)
		}
		r.bytes -= delta
		r.expires = prevExp
		b.held[tenant] -= delta
		b.sum -= delta
	}, nil
}

// quota is what a write of record id counts against in a store that
// counts the tenants' bytes itself: the record's tenant (anonymous until
// attribute says whose it is, as reserve counts it) and the budgets.
// A guess (the anonymous tenant, not yet attributed here) leaves a record
// the store counts as a tenant's already that tenant's: another replica
// attributed it.
func (b *storeBudget) quota(id, anonymous string) statestore.Quota {
	b.mu.Lock()
	tenant, ok := b.tenant[id]
	assumed := !ok || b.assumed[id]
	b.mu.Unlock()
	if !ok {
		tenant = anonymous
	}
	return statestore.Quota{Tenant: tenant, Assumed: assumed, PerTenant: int64(max(b.perTenant, 0)), Total: int64(b.total)}
}

// storeQuota is observed's quota: with a store that counts the tenants'
// bytes itself, what each write counts against; else nil.
func (h *Host) storeQuota() func(id string) statestore.Quota {
	if !h.storeBytes.shared {
		return nil
	}
	return func(id string) statestore.Quota { return h.storeBytes.quota(id, h.tenantOf("")) }
}

// recordLocked returns record id's tenant (anonymous for a record not
// seen before, until attribute says whose it is), that tenant's
// records, pruned of lapsed ones, and the record's counts: a new one,
// not yet among them, when it has none.
func (b *storeBudget) recordLocked(id, anonymous string, now time.Time) (string, map[string]*recBytes, *recBytes) {
	tenant, ok := b.tenant[id]
	if !ok {
		tenant = anonymous
		b.tenant[id] = tenant
		b.assumed[id] = true
	}
	b.pruneLocked(tenant, now)
	recs := b.records[tenant]
	if recs == nil {
		recs = map[string]*recBytes{}
		b.records[tenant] = recs
	}
	r := recs[id]
	if r == nil {
		r = &recBytes{fields: map[string]int{}}
	}
	return tenant, recs, r
}

// count sets the bytes counted for field of record id to size, with no
// check against the budgets: what the store may hold after a write that
// failed or got no answer (durable.Options.Count).
func (b *storeBudget) count(id, field string, size int, ttl time.Duration, anonymous string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	tenant, recs, r := b.recordLocked(id, anonymous, now)
	recs[id] = r
	delta := size - r.fields[field]
	r.fields[field] = size
	r.bytes += delta
	if exp := now.Add(ttl); exp.After(r.expires) {
		r.expires = exp
	}
	b.held[tenant] += delta
	b.sum += delta
}

// release forgets record id (its session ended, its record deleted).
func (b *storeBudget) release(id string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	tenant := b.tenant[id]
	delete(b.tenant, id)
	delete(b.assumed, id)
	if r := b.records[tenant][id]; r != nil {
		b.dropLocked(tenant, id, r)
	}
}

// forgetUnwrittenLocked forgets the tenants of records never written
// (a request admitted whose session wrote nothing: a handle that ended,
// a call refused after its admission). Nothing else forgets them, and a
// review found that a tenant's many such requests could fill the map, so
// that every later record went unattributed, charged to the anonymous
// pool's budget. One written later is attributed again by its next
// request. b.mu is held.
func (b *storeBudget) forgetUnwrittenLocked() {
	for id, tenant := range b.tenant {
		if b.records[tenant][id] == nil {
			delete(b.tenant, id)
			delete(b.assumed, id)
		}
	}
	b.unscanned = maxAttributed / 16
}

// pruneLocked forgets tenant's records whose TTL lapsed (the store has
// dropped them). b.mu is held.
func (b *storeBudget) pruneLocked(tenant string, now time.Time) {
	for id, r := range b.records[tenant] {
		if now.After(r.expires) {
			b.dropLocked(tenant, id, r)
			delete(b.tenant, id)
			delete(b.assumed, id)
		}
	}
}

func (b *storeBudget) dropLocked(tenant, id string, r *recBytes) {
	delete(b.records[tenant], id)
	if len(b.records[tenant]) == 0 {
		delete(b.records, tenant)
	}
	b.held[tenant] -= r.bytes
	if b.held[tenant] <= 0 {
		delete(b.held, tenant)
	}
	b.sum -= r.bytes
}

// SetInstanceLimits replaces [Options.InstanceLimits], the bounds of each
// plugin's live instances, when the configuration changes: no instance is
// made past the new bounds from then on.
func (h *Host) SetInstanceLimits(limits map[string]int) {
	h.ses.SetInstanceLimits(limits)
}
