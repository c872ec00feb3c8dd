package sessions

import (
	"cmp"
	"container/list"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/plugins"
)

// reserve counts a new instance of p against the limits. At a limit it
// frees an idle instance of the tenant holding the most (Options.Tenant):
// one of its pooled ones, else its least recently used idle one; else
// evicts the oldest lease waiting for a person, of that tenant first, and
// waits for it to end; with none of those it refuses with
// [ErrAtCapacity]. self is the slot asking (held by the caller, so never
// a candidate); nil for a pooled instance.
func (m *Manager) reserve(ctx context.Context, p *plugins.Plugin, self *slot) error {
	name, mem := p.Name(), p.MemoryLimit()
	m.mu.Lock()
	if b := m.opts.MemoryBudget; b > 0 && mem > b {
		m.mu.Unlock()
		return fmt.Errorf("%w: plugin %q's memory limit (%d bytes) is over the whole memory budget (%d bytes)", ErrAtCapacity, name, mem, b)
	}
	for {
		overall, perPlugin, memory := m.atLimitLocked(name, mem)
		if !overall && !perPlugin && !memory {
			break
		}
		match := func(plugin string) bool { return !perPlugin || plugin == name }
		if m.evictIdleLocked(self, match) {
			continue
		}
		victim := m.oldestWaitingLocked(match)
		if victim == nil {
			err := ServerFull(ErrAtCapacity, limitsNamed(name, overall, perPlugin, memory))
			m.mu.Unlock()
			return err
		}
		m.evictLocked(victim)
		m.mu.Unlock()
		// Until its Done has discarded the instance, not only begun: a
		// wake-up in between would find the limit still reached and the
		// victim's slot held, and evict the next waiting call too.
		if err := m.waitUntil(ctx, func() bool { return victim.released }); err != nil {
			return err
		}
		m.mu.Lock()
	}
	m.live++
	m.perPlugin[name]++
	m.memory += mem
	m.mu.Unlock()
	return nil
}

// pluginLimit is the bound of plugin's live instances: its own in
// InstanceLimits (which may exceed MaxInstancesPerPlugin: the operator
// named it), else the smaller of InstanceLimits[""] (every other
// plugin's) and MaxInstancesPerPlugin; 0 for none. The caller holds m.mu.
func (m *Manager) pluginLimit(plugin string) int {
	if n := m.opts.InstanceLimits[plugin]; n > 0 {
		return n
	}
	n, all := m.opts.InstanceLimits[""], m.opts.MaxInstancesPerPlugin
	if n <= 0 || all > 0 && all < n {
		return all
	}
	return n
}

// PluginLimit is the bound of plugin's live instances (see
// Options.InstanceLimits); 0 for none.
func (m *Manager) PluginLimit(plugin string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pluginLimit(plugin)
}

// SetInstanceLimits replaces Options.InstanceLimits (the configuration
// changed): no instance is made past the new bounds. Instances live over
// a lowered bound are not freed for it: an acquire past it evicts an idle
// one first, else is refused with ErrAtCapacity, until enough end.
func (m *Manager) SetInstanceLimits(limits map[string]int) {
	m.mu.Lock()
	m.opts.InstanceLimits = maps.Clone(limits)
	m.mu.Unlock()
}

func (m *Manager) atLimitLocked(plugin string, mem uint64) (overall, perPlugin, memory bool) {
	overall = m.opts.MaxInstances > 0 && m.live >= m.opts.MaxInstances
	perPlugin = m.pluginLimit(plugin) > 0 && m.perPlugin[plugin] >= m.pluginLimit(plugin)
	memory = m.opts.MemoryBudget > 0 && m.memory+mem > m.opts.MemoryBudget
	return
}

// limitsNamed names the instance limits reached, with no figure of what
// the server holds (ServerFull).
func limitsNamed(plugin string, overall, perPlugin, memory bool) string {
	var named []string
	if overall {
		named = append(named, "the live instances")
	}
	if perPlugin {
		named = append(named, fmt.Sprintf("plugin %q's live instances", plugin))
	}
	if memory {
		named = append(named, "the bytes of the memory budget reserved")
	}
	return strings.Join(named, ", ")
}

// unreserve gives back what reserve(p) took: p is the plugin (the
// version) of the instance going away.
func (m *Manager) unreserve(p *plugins.Plugin) {
	m.mu.Lock()
	m.unreserveLocked(p)
	m.mu.Unlock()
}

func (m *Manager) unreserveLocked(p *plugins.Plugin) {
	m.live--
	m.perPlugin[p.Name()]--
	if m.perPlugin[p.Name()] == 0 {
		delete(m.perPlugin, p.Name())
	}
	m.memory -= p.MemoryLimit()
}

// evictIdleLocked frees an idle instance whose plugin match accepts, of
// the tenant holding the most instances (then the next), and reports
// whether it found one: the tenant's pooled one first (a cold start
// later, no state lost), else its least recently used idle one. Another
// tenant's pooled instance is not freed first: it was, and a tenant
// holding most of the instances freed another's only warm one with each
// new session of its own. Slots are only try-locked, so this never waits
// for a lease. The caller holds m.mu.
//
// One pass over the pools and the LRU list finds each tenant's count and
// its first candidates (the instances its stateless calls hold count too,
// TestBusyPooledInstancesCountForTheirTenant), so an eviction costs
// O(instances + tenants) under the lock: a scan of the list per tenant
// cost instances × tenants when the tenants ranked first held only busy
// instances.
func (m *Manager) evictIdleLocked(self *slot, match func(string) bool) bool {
	sc := &m.scratch
	clear(sc.byTenant)
	sc.all = sc.all[:0]
	of := func(tenant string) *candidates {
		i, ok := sc.byTenant[tenant]
		if !ok {
			i = len(sc.all)
			sc.byTenant[tenant] = i
			sc.all = append(sc.all, candidates{tenant: tenant})
		}
		return &sc.all[i]
	}
	for k, pl := range m.pools {
		if match(k.plugin) && len(pl.idle) > 0 {
			c := of(k.tenant)
			c.held += len(pl.idle)
			if c.pooled == nil {
				c.pooled = &k
			}
		}
	}
	for k, n := range m.pooledBusy {
		if match(k.plugin) {
			of(k.tenant).held += n
		}
	}
	for e := m.lru.Front(); e != nil; e = e.Next() {
		sl := e.Value.(*slot)
		if !match(sl.plugin) {
			continue
		}
		c := of(sl.c.group)
		c.held++
		if c.idle == nil && sl != self && len(sl.lock) == 0 {
			c.idle = e
		}
	}
	// Only tenants with a candidate can lose one: the rest are passed
	// over in the ranking anyway.
	ranked := slices.DeleteFunc(sc.all, func(c candidates) bool { return c.pooled == nil && c.idle == nil })
	slices.SortFunc(ranked, func(a, b candidates) int {
		return cmp.Or(cmp.Compare(b.held, a.held), strings.Compare(a.tenant, b.tenant))
	})
	defer clear(ranked) // keeps no slot reachable until the next eviction
	for _, c := range ranked {
		if c.pooled != nil {
			m.freePooledLocked(*c.pooled)
			return true
		}
		if m.evictIdleOfLocked(self, match, c.tenant, c.idle) {
			return true
		}
	}
	return false
}

// evictScratch is what evictIdleLocked gathers, kept between its calls
// for their capacity: a map and a slice as large as the tenants holding
// instances, grown again at every eviction, cost as much as the pass.
// Guarded by Manager.mu.
type evictScratch struct {
	byTenant map[string]int // index in all
	all      []candidates
}

// candidates are what one tenant could lose at a bound.
type candidates struct {
	tenant string
	held   int           // its instances match accepts, pooled ones included
	pooled *poolKey      // one of its pools with an idle instance
	idle   *list.Element // its least recently used slot that was free
}

// tenantsByInstancesLocked returns the tenants holding instances of the
// plugins match accepts, their clients' and their pools' idle ones, the
// one holding the most first (by name among equals): eviction takes from
// them in that order (evictIdleLocked ranks them so too), so that a
// tenant's many sessions evict their own instances before another
// tenant's. The caller holds m.mu.
func (m *Manager) tenantsByInstancesLocked(match func(string) bool) []string {
	held := map[string]int{}
	for e := m.lru.Front(); e != nil; e = e.Next() {
		if sl := e.Value.(*slot); match(sl.plugin) {
			held[sl.c.group]++
		}
	}
	for k, pl := range m.pools {
		if match(k.plugin) {
			held[k.tenant] += len(pl.idle)
		}
	}
	for k, n := range m.pooledBusy {
		if match(k.plugin) {
			held[k.tenant] += n
		}
	}
	tenants := slices.Collect(maps.Keys(held))
	slices.SortFunc(tenants, func(a, b string) int { return cmp.Or(cmp.Compare(held[b], held[a]), strings.Compare(a, b)) })
	return tenants
}

// evictIdleOfLocked evicts tenant's least recently used idle instance
// among those match accepts, but self's, from the LRU list's element
// from on (its first that was free when evictIdleLocked looked: a lease
// may have taken it since, and then the next goes); it reports whether it
// did. The caller holds m.mu.
func (m *Manager) evictIdleOfLocked(self *slot, match func(string) bool, tenant string, from *list.Element) bool {
	for e := from; e != nil; e = e.Next() {
		sl := e.Value.(*slot)
		if sl.c.group != tenant || sl == self || !match(sl.plugin) || !sl.tryLock() {
			continue
		}
		m.log.Info("instance evicted", "session", sl.c.key.String(), "plugin", sl.plugin, "reason", "instance limit")
		m.closeInstanceLocked(sl)
		sl.notice = Notice{Reset: &Reset{Reason: ReasonEvicted, Detail: "the instance was idle and the server needed room for another"}}
		m.obs.InstanceReset(sl.plugin, "evicted")
		sl.unlock()
		return true
	}
	return false
}

// oldestWaitingLocked returns the lease that has waited longest for a
// person among those match accepts, of the tenant holding the most
// instances (then the next), or nil.
func (m *Manager) oldestWaitingLocked(match func(string) bool) *Lease {
	// One pass over the waiting leases (not one per tenant).
	var oldest *Lease
	first := map[string]*Lease{}
	for e := m.waiting.Front(); e != nil; e = e.Next() {
		if l := e.Value.(*Lease); !l.evicted && match(l.plugin.Name()) {
			if oldest == nil {
				oldest = l
			}
			if _, ok := first[l.tenant()]; !ok {
				first[l.tenant()] = l
			}
		}
	}
	if oldest == nil {
		return nil
	}
	for _, tenant := range m.tenantsByInstancesLocked(match) {
		if l := first[tenant]; l != nil {
			return l
		}
	}
	return oldest // a pooled instance's, whose tenant holds no other
}

// tenant is the tenant of l: its client's, or its pool's.
func (l *Lease) tenant() string {
	if l.c != nil {
		return l.c.group
	}
	return l.pool.tenant
}

// evictLocked stops a lease waiting for a person: its context is cancelled
// with [ErrEvicted], a parked call is abandoned, and its instance is reset
// when the lease is done. The caller holds m.mu.
func (m *Manager) evictLocked(l *Lease) {
	l.evicted = true
	if l.waitElem != nil {
		m.waiting.Remove(l.waitElem)
		l.waitElem = nil
	}
	m.log.Info("waiting call evicted", "plugin", l.plugin.Name(), "reason", "instance limit")
	if p := l.park; p != nil {
		m.unparkLocked(p.id)
		go p.abandon(ErrEvicted)
	}
	l.cancel(ErrEvicted)
}

// dropInstance frees the slot's instance. The caller holds the slot.
func (m *Manager) dropInstance(sl *slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if sl.inst != nil {
		m.closeInstanceLocked(sl)
	}
}

// closeInstanceLocked closes the slot's instance and releases its
// reservation. The caller holds the slot and m.mu.
func (m *Manager) closeInstanceLocked(sl *slot) {
	_ = sl.inst.Close(context.Background())
	p := sl.inst.Plugin()
	sl.inst = nil
	if sl.elem != nil {
		m.lru.Remove(sl.elem)
		sl.elem = nil
		m.instanceGoneLocked(sl.c)
	}
	m.unreserveLocked(p)
	m.obs.InstanceClosed(p.Name())
}

// discard frees the slot's instance after it failed, recording why for the
// client's next lease. The caller holds the slot.
func (m *Manager) discard(sl *slot, reason, detail string) {
	if sl.inst == nil {
		return
	}
	m.log.Info("instance reset", "session", sl.c.key.String(), "plugin", sl.plugin, "reason", reason, "detail", detail)
	m.dropInstance(sl)
	sl.notice = Notice{Reset: &Reset{Reason: reason, Detail: detail}}
	m.obs.InstanceReset(sl.plugin, reason)
}
