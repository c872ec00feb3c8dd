package sessions

import (
	"context"
	"fmt"
	"time"

	"github.com/wasmtools/wasmtools/plugins"
)

// pool holds the idle warm instances of one stateless plugin (by name),
// shared by every client of one tenant (Options.Tenant). Instances of a
// retired version are never put back. A pool with no idle instance is
// dropped, so that pools come and go with their tenants; PoolSize bounds
// the idle instances of a plugin across all its tenants' pools
// (Manager.pooledIdle), so that they do not grow with the tenants.
type pool struct {
	idle []*plugins.Instance // guarded by Manager.mu
}

// poolKey names a pool: its plugin's name and its tenant.
type poolKey struct{ plugin, tenant string }

// poolOf is the key of the pool a lease of p under ctx uses.
func (m *Manager) poolOf(ctx context.Context, p *plugins.Plugin) poolKey {
	return poolKey{plugin: p.Name(), tenant: m.tenantOf(ctx)}
}

// tenantOf is Options.Tenant's answer for ctx, "" without it.
func (m *Manager) tenantOf(ctx context.Context) string {
	if m.opts.Tenant == nil {
		return ""
	}
	return m.opts.Tenant(ctx)
}

// acquirePooled leases an idle pooled instance of p, or a new one.
func (m *Manager) acquirePooled(ctx context.Context, p *plugins.Plugin) (*Lease, error) {
	l := &Lease{m: m, plugin: p, start: time.Now(), pool: m.poolOf(ctx, p)}
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return nil, ErrClosed
	case m.isRetiredLocked(p):
		m.mu.Unlock()
		return nil, ErrRetired
	}
	m.leases[l] = struct{}{}
	var stale []*plugins.Instance
	if pl := m.pools[l.pool]; pl != nil {
		for l.inst == nil && len(pl.idle) > 0 {
			inst := pl.idle[len(pl.idle)-1]
			pl.idle = pl.idle[:len(pl.idle)-1]
			m.pooledIdle[l.pool.plugin]--
			if inst.Plugin().SameCode(p) {
				l.inst = inst
			} else {
				stale = append(stale, inst)
			}
		}
		if len(pl.idle) == 0 {
			delete(m.pools, l.pool)
		}
	}
	if l.inst != nil {
		m.pooledBusy[l.pool]++
	}
	m.mu.Unlock()
	m.closePooled(stale)
	fail := func(err error) (*Lease, error) {
		m.mu.Lock()
		delete(m.leases, l)
		m.broadcastLocked()
		m.mu.Unlock()
		return nil, err
	}
	if l.inst == nil {
		if err := m.reserve(ctx, p, nil); err != nil {
			return fail(err)
		}
		inst, err := p.NewInstance(ctx)
		if err != nil {
			m.unreserve(p)
			return fail(fmt.Errorf("%w: %w", ErrStart, err))
		}
		m.mu.Lock()
		l.inst = inst
		m.pooledBusy[l.pool]++
		m.mu.Unlock()
		m.obs.InstanceStarted(p.Name())
		m.log.Debug("pooled instance created", "plugin", p.Name(), "sha256", p.SHA256())
	}
	if err := m.firstToken(ctx, l); err != nil {
		m.donePooled(l, "")
		return fail(err)
	}
	l.ctx, l.cancel = m.leaseContext(ctx, p)
	return l, nil
}

// donePooled puts a pooled lease's instance back, if it is usable, of the
// version served, and the pool has room; otherwise it frees it.
func (m *Manager) donePooled(l *Lease, reason string) {
	inst := l.inst
	m.mu.Lock()
	var trimmed []*plugins.Instance
	if reason == "" && m.poolableLocked(inst) && m.pooledIdle[l.pool.plugin] >= m.poolSize() {
		// At the plugin's bound: the tenant holding the most idle
		// instances of it gives up its oldest.
		if k, pl := m.largestPoolLocked(l.pool.plugin); pl != nil {
			trimmed = append(trimmed, pl.idle[0])
			pl.idle = pl.idle[1:]
			m.pooledIdle[k.plugin]--
			if len(pl.idle) == 0 {
				delete(m.pools, k)
			}
		}
	}
	if reason == "" && m.poolBackLocked(l) {
		m.mu.Unlock()
		m.closePooled(trimmed)
		return
	}
	m.unbusyLocked(l.pool)
	m.mu.Unlock()
	if reason != "" {
		m.obs.InstanceReset(inst.Plugin().Name(), reason)
	}
	m.closePooled(append(trimmed, inst))
}

// poolBackLocked puts a pooled lease's usable instance back in its pool
// when the plugin's pools have room, and reports whether it did; with
// false it changed nothing. Done calls it first, in its one hold, and
// donePooled when that frees nothing. The caller holds m.mu.
func (m *Manager) poolBackLocked(l *Lease) bool {
	if !m.poolableLocked(l.inst) || m.pooledIdle[l.pool.plugin] >= m.poolSize() {
		return false
	}
	m.unbusyLocked(l.pool)
	pl := m.pools[l.pool]
	if pl == nil {
		pl = &pool{}
		m.pools[l.pool] = pl
	}
	pl.idle = append(pl.idle, l.inst)
	m.pooledIdle[l.pool.plugin]++
	return true
}

// poolableLocked reports whether inst may go back to a pool: usable, of a
// version served, the manager open. The caller holds m.mu.
func (m *Manager) poolableLocked(inst *plugins.Instance) bool {
	return inst.Err() == nil && !m.closed && !m.isRetiredLocked(inst.Plugin())
}

// unbusyLocked counts a pooled lease of pool k gone. The caller holds m.mu.
func (m *Manager) unbusyLocked(k poolKey) {
	if m.pooledBusy[k]--; m.pooledBusy[k] <= 0 {
		delete(m.pooledBusy, k)
	}
}

// largestPoolLocked is the pool of plugin holding the most idle
// instances, or nil. The caller holds m.mu.
func (m *Manager) largestPoolLocked(plugin string) (poolKey, *pool) {
	var key poolKey
	var largest *pool
	for k, pl := range m.pools {
		if k.plugin == plugin && len(pl.idle) > 0 && (largest == nil || len(pl.idle) > len(largest.idle)) {
			key, largest = k, pl
		}
	}
	return key, largest
}

// closePooled frees pooled instances that no lease holds.
func (m *Manager) closePooled(insts []*plugins.Instance) {
	for _, inst := range insts {
		_ = inst.Close(context.Background())
		m.unreserve(inst.Plugin())
		m.obs.InstanceClosed(inst.Plugin().Name())
	}
}

// freePooledLocked frees the oldest idle instance of pool k, which has
// one. The caller holds m.mu.
func (m *Manager) freePooledLocked(k poolKey) {
	pl := m.pools[k]
	inst := pl.idle[0]
	pl.idle = pl.idle[1:]
	m.pooledIdle[k.plugin]--
	if len(pl.idle) == 0 {
		delete(m.pools, k)
	}
	_ = inst.Close(context.Background())
	m.unreserveLocked(inst.Plugin())
	m.obs.InstanceClosed(k.plugin)
}

// drainPools frees every idle pooled instance.
func (m *Manager) drainPools() {
	m.mu.Lock()
	var all []*plugins.Instance
	for k, pl := range m.pools {
		all = append(all, pl.idle...)
		delete(m.pools, k)
	}
	clear(m.pooledIdle)
	m.mu.Unlock()
	m.closePooled(all)
}
