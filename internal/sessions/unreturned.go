package sessions

import (
	"slices"
	"time"
)

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
	type held struct {
		c    *client
		used time.Time
	}
	var once []held
	for _, c := range m.clients {
		if c.key.kind != KindHandle || c.group != group || c.closed || c.leases > 0 || c.requests != 1 {
			continue
		}
		for _, sl := range c.slots {
			if sl.inst != nil {
				once = append(once, held{c, c.lastUsed})
				break
			}
		}
	}
	excess := len(once) - m.maxUnreturned()
	if excess <= 0 {
		return
	}
	slices.SortFunc(once, func(a, b held) int { return a.used.Compare(b.used) })
	for _, h := range once[:excess] {
		for _, sl := range h.c.slots {
			if sl.inst == nil || !sl.tryLock() {
				continue
			}
			if sl.inst != nil {
				m.log.Info("instance reclaimed: its session handle was never passed back", "session", h.c.key.String(), "plugin", sl.plugin)
				m.closeInstanceLocked(sl)
				sl.notice = Notice{Reset: &Reset{Reason: ReasonEvicted, Detail: "the handle was not passed back for a while, and its instance was freed for others"}}
				m.obs.InstanceReset(sl.plugin, "evicted")
			}
			sl.unlock()
		}
	}
}
