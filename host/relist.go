package host

import (
	"context"

	"github.com/wasmtools/wasmtools/plugins"
)

// relist reads the tool list again from inst, the instance whose guest
// said (notify_tool_list_changed) that its list changed, and serves it.
// Instances of the plugin keep running: the code is the same. A list that
// fails to load, or collides with another plugin's tools, is logged and the
// old list kept. The caller holds inst's slot.
func (h *Host) relist(ctx context.Context, inst *plugins.Instance) {
	p := inst.Plugin()
	cur := h.Catalogue()
	var old *plugins.Plugin
	for _, q := range cur.Plugins() {
		if q.Name() == p.Name() && q.SameCode(p) {
			old = q
		}
	}
	if old == nil {
		return // replaced or removed meanwhile
	}
	fresh, err := old.Relist(ctx, inst)
	if err != nil {
		h.log.Error("plugin tool list not updated", "plugin", p.Name(), "error", err)
		return
	}
	list := cur.Plugins()
	for i, q := range list {
		if q == old {
			list[i] = fresh
		}
	}
	cat, rejected := plugins.NewCatalogue(list)
	for _, r := range rejected {
		if r.Plugin == fresh {
			h.log.Error("plugin tool list not updated", "plugin", p.Name(), "error", r.Err)
			return
		}
	}
	h.log.Info("plugin tool list updated", "plugin", p.Name(), "tools", len(fresh.Tools()))
	h.SetCatalogue(cat)
}
