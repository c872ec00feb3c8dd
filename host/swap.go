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

// swap applies one change of the catalogue, under the reloader's lock (so
// swaps arrive in order): the retired versions are marked first, so that
// no call on their successors can run before them, then the new
// catalogue is registered. Each session's instance of a replaced plugin
// moves to the new version (its state handed over when both can) once its
// call in flight, if any, ends; a removed plugin's instances are freed.
// Relisted plugins keep their instances: the code is the same.
func (h *Host) swap(s plugins.Swap) {
	// A swap after Close (a reload that outlived the server: a
	// configuration change's rescan, POST /reload) retires into a closed
	// session layer: its instances are gone, and the plugins it no longer
	// serves are closed here. Close waits for a swap under way.
	h.swapping.Lock()
	defer h.swapping.Unlock()
	if h.isClosed() {
		ctx := context.Background()
		for old := range s.Replaced {
			_ = old.Close(ctx)
		}
		for _, old := range s.Removed {
			_ = old.Close(ctx)
		}
		return
	}
	for old, next := range s.Replaced {
		h.ses.Retire(old, next)
	}
	for _, old := range s.Removed {
		h.ses.Retire(old, nil)
	}
	h.setCatalogue(s.Next)
}
