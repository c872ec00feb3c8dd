package host

import (
	"context"

	"github.com/wasmtools/wasmtools/plugins"
)

// MetaUpgraded is the _meta key of the first result a session gets from a
// new version of a plugin whose state was handed over from the old one:
// {"sha256": new version, "state": "restored"}. When the state could not
// be handed over, the result carries [MetaStateReset] with reason
// "upgrade" instead.
const MetaUpgraded = MetaPrefix + "upgraded"

// Swap serves a new catalogue from a plugin reload and retires the
// instances of the plugins it no longer holds: each session's instance of
// a replaced plugin is retired once its call in flight (if any) ends, its
// state handed to an instance of the new version when both versions export
// the snapshot/restore pair; instances of removed plugins are freed. Swap
// returns at once; the retired plugins are closed once their instances are
// done with.
func (h *Host) Swap(s plugins.Swap) {
	h.SetCatalogue(s.Next)
	for old, next := range s.Replaced {
		h.retire(old, next)
	}
	for _, old := range s.Removed {
		h.retire(old, nil)
	}
}

// retire moves every session off old, in the background, then closes it.
func (h *Host) retire(old, next *plugins.Plugin) {
	h.mu.Lock()
	h.retired[old] = true
	var slots []*slot
	for _, s := range h.sessions {
		if sl, ok := s.slots[old.Name()]; ok {
			slots = append(slots, sl)
		}
	}
	h.wg.Add(1)
	h.mu.Unlock()
	h.drainPool(old)
	go func() {
		defer h.wg.Done()
		for _, sl := range slots {
			select {
			case sl.lock <- struct{}{}: // the call in flight, if any, has ended
			case <-sl.sess.ended:
				continue // the session's end frees its instances
			}
			h.moveOff(sl, old, next)
			<-sl.lock
		}
		if err := old.Close(context.Background()); err != nil {
			h.log.Warn("close retired plugin", "plugin", old.Name(), "sha256", old.SHA256(), "error", err)
		}
		h.mu.Lock()
		delete(h.retired, old)
		h.mu.Unlock()
	}()
}

// moveOff retires the slot's instance of old, handing its state to a new
// instance of next when both can. The caller holds the slot.
func (h *Host) moveOff(sl *slot, old, next *plugins.Plugin) {
	inst := sl.inst
	if inst == nil || !inst.Plugin().SameCode(old) {
		return
	}
	ctx := context.Background()
	detail := "the plugin was removed"
	if next != nil {
		detail = "the plugin was replaced by version " + next.SHA256()
		if old.HandsOffState() && next.HandsOffState() {
			fresh, err := h.handOff(ctx, inst, next)
			if err == nil {
				_ = inst.Close(ctx)
				h.mu.Lock()
				sl.inst = fresh // same plugin name: the instance counts stay
				h.memory = h.memory - old.MemoryLimit() + next.MemoryLimit()
				h.mu.Unlock()
				sl.upgraded = map[string]any{"sha256": next.SHA256(), "state": "restored"}
				h.log.Info("instance upgraded with its state", "session", sl.sess.id, "plugin", old.Name(), "sha256", next.SHA256())
				return
			}
			detail += "; its state could not be handed over: " + err.Error()
			h.log.Warn("state handoff failed: a fresh instance follows", "session", sl.sess.id, "plugin", old.Name(), "error", err)
		}
	}
	h.log.Info("instance retired", "session", sl.sess.id, "plugin", old.Name(), "sha256", old.SHA256(), "detail", detail)
	h.dropInstance(sl, "upgrade")
	sl.reset = map[string]any{"reason": "upgrade", "detail": detail}
}

// handOff moves inst's state to a new instance of next.
func (h *Host) handOff(ctx context.Context, inst *plugins.Instance, next *plugins.Plugin) (*plugins.Instance, error) {
	snap, err := inst.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	fresh, err := next.NewInstance(ctx)
	if err != nil {
		return nil, err
	}
	if err := fresh.Restore(ctx, snap); err != nil {
		_ = fresh.Close(ctx)
		return nil, err
	}
	return fresh, nil
}
