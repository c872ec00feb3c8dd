package sessions

import (
	"context"

	"github.com/wasmtools/wasmtools/plugins"
)

// Retire takes plugin version old out of service after a reload: next is
// the version that replaces it (nil when the plugin was removed). From now
// on leases on old are refused with [ErrRetired]; idle pooled instances of
// old are freed; each client's instance of old is moved to next (its state
// handed over when both versions export the handoff pair, else dropped, and
// the client's next result says which) once the lease on it, if any, is
// done. old is closed when no lease runs it any more. Retire returns at
// once and owns old from then on.
//
// Call Retire before serving the catalogue with next, so that no lease on
// next can run before old is marked.
//
// Retirements of successive versions overlap (a file replaced again while
// the first replacement still moves instances): an instance moves to the
// newest version, following what replaced next, and a version is closed
// only once every retirement moving instances to it is done.
func (m *Manager) Retire(old, next *plugins.Plugin) {
	m.mu.Lock()
	m.retired[old] = true
	m.successor[old] = next
	if next != nil {
		m.incoming[next]++
	}
	var stale []*plugins.Instance
	for k, pl := range m.pools {
		if k.plugin != old.Name() {
			continue
		}
		kept := pl.idle[:0]
		for _, inst := range pl.idle {
			if inst.Plugin().SameCode(old) {
				stale = append(stale, inst)
				m.pooledIdle[k.plugin]--
			} else {
				kept = append(kept, inst)
			}
		}
		pl.idle = kept
		if len(kept) == 0 {
			delete(m.pools, k)
		}
	}
	var slots []*slot
	for _, c := range m.clients {
		if sl, ok := c.slots[old.Name()]; ok {
			slots = append(slots, sl)
		}
	}
	m.wg.Add(1)
	m.mu.Unlock()
	m.closePooled(stale)
	go func() {
		defer m.wg.Done()
		m.retire(old, next, slots)
	}()
}

func (m *Manager) retire(old, next *plugins.Plugin, slots []*slot) {
	defer func() {
		m.mu.Lock()
		if next != nil {
			if m.incoming[next]--; m.incoming[next] == 0 {
				delete(m.incoming, next)
			}
		}
		m.broadcastLocked() // next's own retirement may wait for this one
		m.mu.Unlock()
	}()
	// Idle instances move now; busy ones once their lease is done (or
	// by the next lease on next, which moves them itself).
	var busy []*slot
	for _, sl := range slots {
		if !sl.tryLock() {
			busy = append(busy, sl)
			continue
		}
		m.moveOff(sl, old, m.newest(next))
		m.letGo(sl)
	}
	// A lease runs the code of the plugin it was acquired on (a slot's
	// instance of older code is moved off first, holding the slot, which
	// the loop over busy slots below waits for). A retirement of an
	// older version may still move an instance to old (it took the slot
	// before old was marked, or after this one's loops passed the
	// slot): old stays open until it is done.
	runsOld := func() bool {
		if m.incoming[old] > 0 {
			return true
		}
		for l := range m.leases {
			if l.plugin.SameCode(old) {
				return true
			}
		}
		return false
	}
	stop, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-m.stop:
		case <-stop.Done():
		}
		cancel()
	}()
	err := m.waitUntil(stop, func() bool { return !runsOld() })
	cancel()
	if err != nil {
		return // closing: Close frees everything
	}
	for _, sl := range busy {
		select {
		case sl.lock <- struct{}{}:
		case <-sl.c.ended:
			continue // ending the client frees its instances
		}
		m.moveOff(sl, old, m.newest(next))
		m.letGo(sl)
	}
	if err := old.Close(context.Background()); err != nil {
		m.log.Warn("close retired plugin", "plugin", old.Name(), "sha256", old.SHA256(), "error", err)
	}
	m.mu.Lock()
	delete(m.retired, old)
	delete(m.successor, old)
	m.mu.Unlock()
}

// newest returns the version an instance moving to p goes to: p, or, when
// p was retired since, what replaced it, and so on (nil when a version on
// the way was removed). The caller holds the slot it moves, so a
// retirement that marks the version returned after this finds the slot
// busy, and moves the instance on once it is let go. A version retired
// and closed outside a retirement that runs (one closed by its owner) is
// returned as is: the hand-off into it fails, and the instance starts
// afresh (moveOff).
func (m *Manager) newest(p *plugins.Plugin) *plugins.Plugin {
	m.mu.Lock()
	defer m.mu.Unlock()
	for range len(m.successor) { // bounded, were a version ever retired into an older one
		q, ok := m.successor[p]
		if p == nil || !ok {
			break
		}
		p = q
	}
	return p
}

// isRetiredLocked reports whether leases on p are refused: it, or a
// plugin with its code, was retired, or its code closed. A plugin relisted
// (plugins.Plugin.Relist) is served in place of p with p's code, and a
// reload retires that one: a lease on p (a call that found its tool before
// the relist) ran the retired code, and moved its session's instance back
// onto it (TestRelistedThenReplacedRefusesOldPlugin: a red team, stop 64).
// The caller holds m.mu.
func (m *Manager) isRetiredLocked(p *plugins.Plugin) bool {
	if m.retired[p] || p.Closed() {
		return true
	}
	for r := range m.retired {
		if r.SameCode(p) {
			return true
		}
	}
	return false
}

// moveOff moves the slot's instance, if it runs old's code, to next:
// its state is handed over when both versions export the handoff pair,
// else it is dropped. The client's next lease says which. The caller
// holds the slot.
func (m *Manager) moveOff(sl *slot, old, next *plugins.Plugin) {
	inst := sl.inst
	if inst == nil || !inst.Plugin().SameCode(old) {
		return
	}
	ctx := context.Background()
	from := inst.Plugin()
	detail := "the plugin was removed"
	if next != nil {
		detail = "the plugin was replaced by version " + next.SHA256()
		if from.CarriesStateTo(next) {
			fresh, err := m.handOff(ctx, inst, next)
			if err == nil {
				_ = inst.Close(ctx)
				m.mu.Lock()
				sl.inst = fresh // same plugin name: the instance counts stay
				m.memory = m.memory - from.MemoryLimit() + next.MemoryLimit()
				m.mu.Unlock()
				sl.notice = Notice{Upgraded: &Upgrade{SHA256: next.SHA256()}}
				m.log.Info("instance upgraded with its state", "session", sl.c.key.String(), "plugin", old.Name(), "sha256", next.SHA256())
				return
			}
			detail += "; its state could not be handed over: " + err.Error()
			m.log.Warn("state handoff failed: a fresh instance follows", "session", sl.c.key.String(), "plugin", old.Name(), "error", err)
		}
	}
	m.log.Info("instance retired", "session", sl.c.key.String(), "plugin", old.Name(), "sha256", old.SHA256(), "detail", detail)
	m.dropInstance(sl)
	sl.notice = Notice{Reset: &Reset{Reason: "upgrade", Detail: detail}}
	m.obs.InstanceReset(sl.plugin, "upgrade")
}

// handOff moves inst's state to a new instance of next: the whole guest,
// snapshotted by the host, when next is the same code (a configuration
// change), else the guest's own snapshot, which another version reads.
func (m *Manager) handOff(ctx context.Context, inst *plugins.Instance, next *plugins.Plugin) (*plugins.Instance, error) {
	var st *plugins.State
	var err error
	if inst.Plugin().SHA256() == next.SHA256() && next.CanSnapshot() == nil {
		st, err = inst.SaveState(ctx)
	} else {
		st, err = inst.SaveGuestState(ctx)
	}
	if err != nil {
		return nil, err
	}
	return next.RestoreState(ctx, st)
}
