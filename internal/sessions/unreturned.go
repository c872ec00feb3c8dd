package sessions

// DefaultMaxUnreturned is Options.MaxUnreturned's default.
const DefaultMaxUnreturned = 64

func (m *Manager) maxUnreturned() int {
	if m.opts.MaxUnreturned <= 0 {
		return DefaultMaxUnreturned
	}
	return m.opts.MaxUnreturned
}

// reclaimUnreturnedLocked frees the idle instances of the oldest handle
// clients of group whose handle never came back (one request, no lease),
// past Options.MaxUnreturned of them holding instances. The bound is each
// group's own: another group's one-shot handles never cost this group's
// instances. The clients stay open. Slots are only try-locked, so this
// never waits. The caller holds m.mu.
func (m *Manager) reclaimUnreturnedLocked(group string) {
	g := m.handleGroups[group]
	if g == nil {
		return
	}
	excess := g.unreturned.Len() - m.maxUnreturned()
	for e := g.unreturned.Front(); e != nil && excess > 0; excess-- {
		c := e.Value.(*client)
		e = e.Next() // c leaves the list as its last instance is freed
		for _, sl := range c.slots {
			if sl.inst == nil || !sl.tryLock() {
				continue
			}
			if sl.inst != nil {
				m.log.Info("instance reclaimed: its session handle was never passed back", "session", c.key.String(), "plugin", sl.plugin)
				m.closeInstanceLocked(sl)
				sl.notice = Notice{Reset: &Reset{Reason: ReasonEvicted, Detail: "the handle was not passed back for a while, and its instance was freed for others"}}
				m.obs.InstanceReset(sl.plugin, "evicted")
			}
			sl.unlock()
		}
	}
}
