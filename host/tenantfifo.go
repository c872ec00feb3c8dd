package host

import (
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// tenantFIFO bounds a table kept per session (grant answers, issued URL
// elicitation IDs) so that one tenant's sessions can push out only its
// own: each tenant holds at most perTenant entries, and all at most
// total; past either, the oldest entry of the tenant holding the most
// goes (its own, past its share). Tenant "" (a host without tenants, or a
// session whose tenant is not known yet) has no share of its own, only
// the total. Its owner's lock guards it.
type tenantFIFO[K comparable] struct {
	total, perTenant int
	tenant           map[K]string
	order            map[string][]K // each tenant's keys, oldest first
}

// add counts key as tenant's (moving it there if it was counted for
// another; tenant "" leaves a counted key where it is) and returns the
// keys to forget to stay within the bounds, key never among them.
func (f *tenantFIFO[K]) add(key K, tenant string) (drop []K) {
	if f.tenant == nil {
		f.tenant, f.order = map[K]string{}, map[string][]K{}
	}
	if t, ok := f.tenant[key]; ok {
		if t == tenant || tenant == "" {
			return nil
		}
		f.remove(key)
	}
	if tenant != "" && len(f.order[tenant]) >= f.perTenant {
		drop = append(drop, f.popOldest(tenant))
	}
	for len(f.tenant) >= f.total {
		drop = append(drop, f.popOldest(f.largest()))
	}
	f.tenant[key] = tenant
	f.order[tenant] = append(f.order[tenant], key)
	return drop
}

// largest is the tenant holding the most entries.
func (f *tenantFIFO[K]) largest() string {
	most, n := "", -1
	for t, keys := range f.order {
		if len(keys) > n {
			most, n = t, len(keys)
		}
	}
	return most
}

func (f *tenantFIFO[K]) popOldest(tenant string) K {
	key := f.order[tenant][0]
	f.remove(key)
	return key
}

// remove forgets key, if counted.
func (f *tenantFIFO[K]) remove(key K) {
	t, ok := f.tenant[key]
	if !ok {
		return
	}
	delete(f.tenant, key)
	keys := slices.DeleteFunc(f.order[t], func(k K) bool { return k == key })
	if len(keys) == 0 {
		delete(f.order, t)
	} else {
		f.order[t] = keys
	}
}

// tenant is the tenant a table kept per session counts the call's
// session as: its request's subject's, or "" without Options.Tenants
// (every client is then one tenant, and only the total bounds it).
func (e *callEnv) tenant() string {
	if !e.h.opts.Tenants {
		return ""
	}
	_, req := e.current()
	var extra *mcp.RequestExtra
	if req != nil {
		extra = req.Extra
	}
	return e.h.tenantOf(subjectOf(extra))
}
