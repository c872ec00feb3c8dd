package host

import (
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds of notify_url_elicitation_completed (issue 26: a guest looping
// on it sent tens of thousands of notifications per call, for IDs it
// never issued). A completion is forwarded only for an elicitation ID
// that the same plugin's URL elicitation issued in the same session, once
// (the ID is then spent), within a rate per call and per plugin; the rest
// are dropped, counted in the log.
const (
	completeCallBurst       = 8
	completeCallPerSecond   = 1
	completePluginBurst     = 32
	completePluginPerSecond = 4
	// maxIssuedPerScope bounds the IDs remembered per session and
	// plugin (a scope), maxIssuedScopes the scopes remembered and
	// maxIssuedScopesPerTenant one tenant's (with Options.Tenants): past
	// them the oldest go (their completions are then dropped), the
	// tenant's holding the most (tenantFIFO), so that one tenant's
	// sessions never push out another's. A session's IDs go when its
	// client ends (Host.clientEnded). With IDs of at most
	// maxElicitationID bytes, that is 32 MiB at the most.
	maxIssuedPerScope        = 32
	maxIssuedScopes          = 4096
	maxIssuedScopesPerTenant = maxIssuedScopes / 4
	// maxElicitationID bounds a URL elicitation's ID, issued or
	// completed.
	maxElicitationID = 256
)

// issuedURLs remembers the URL elicitation IDs each plugin issued in
// each session, and paces each plugin's completions. It is safe for
// concurrent use.
type issuedURLs struct {
	mu      sync.Mutex
	ids     map[string][]string     // scope (urlScope) -> IDs, oldest first
	bound   tenantFIFO[string]      // of scopes
	plugins map[string]*tokenBucket // plugin and tenant -> completions' budget
}

// pluginBudget returns the budget of plugin's completions for tenant ("":
// every client's, without Options.Tenants): each tenant has the plugin's
// whole rate, as it has its host functions' (budgetOf), so that one
// tenant's completions never use up another's (a review found alice's 32
// completions of her own IDs dropping bob's one). Past maxBudgets kept,
// the full ones (idle) are forgotten, and with none full a new tenant's
// budget is its alone, for this completion, kept by no one. u.mu is held.
func (u *issuedURLs) pluginBudget(plugin, tenant string) *tokenBucket {
	if u.plugins == nil {
		u.plugins = map[string]*tokenBucket{}
	}
	key := plugin + "\x00" + tenant
	if pb := u.plugins[key]; pb != nil {
		return pb
	}
	if len(u.plugins) >= maxBudgets {
		for k, b := range u.plugins {
			if b.refill(); b.tokens >= b.burst {
				delete(u.plugins, k)
			}
		}
	}
	b := newTokenBucket(completePluginBurst, completePluginPerSecond)
	if len(u.plugins) < maxBudgets {
		u.plugins[key] = &b
	}
	return &b
}

// urlScope is the session (its label) and plugin an env's URL
// elicitations belong to.
func (e *callEnv) urlScope() string { return e.sess + "\x00" + e.plugin.Name() }

// end forgets the IDs issued in session (its label): its client ended.
func (u *issuedURLs) end(session string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for scope := range u.ids {
		if strings.HasPrefix(scope, session+"\x00") {
			delete(u.ids, scope)
			u.bound.remove(scope)
		}
	}
}

// issueURLs remembers the URL elicitations among params as issued by e's
// plugin in e's session.
func (e *callEnv) issueURLs(params ...*mcp.ElicitParams) {
	tenant, scope := e.tenant(), e.urlScope()
	u := &e.h.urls
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range params {
		if p == nil || p.Mode != "url" || p.ElicitationID == "" {
			continue
		}
		if u.ids == nil {
			u.ids = map[string][]string{}
			u.bound.total, u.bound.perTenant = maxIssuedScopes, maxIssuedScopesPerTenant
		}
		for _, s := range u.bound.add(scope, tenant) {
			delete(u.ids, s)
		}
		ids := append(u.ids[scope], p.ElicitationID)
		if len(ids) > maxIssuedPerScope {
			ids = ids[1:]
		}
		u.ids[scope] = ids
	}
}

// spendURL reports whether e may send the completion of elicitation id:
// issued by e's plugin in e's session and not completed yet, within the
// call's and the plugin's rates. The ID is spent when it may.
func (e *callEnv) spendURL(id string) (ok bool, why string) {
	u := &e.h.urls
	u.mu.Lock()
	defer u.mu.Unlock()
	scope := e.urlScope()
	ids := u.ids[scope]
	i := -1
	for j, v := range ids {
		if v == id {
			i = j
			break
		}
	}
	if i < 0 {
		return false, "not an ID this plugin's URL elicitation issued in this session (or completed already)"
	}
	pb := u.pluginBudget(e.plugin.Name(), e.tenant())
	e.mu.Lock()
	if e.completions.burst == 0 {
		e.completions = newTokenBucket(completeCallBurst, completeCallPerSecond)
	}
	callOK := e.completions.take()
	e.mu.Unlock()
	if !callOK || !pb.take() {
		return false, "over the rate of completions"
	}
	u.ids[scope] = append(ids[:i:i], ids[i+1:]...)
	return true, ""
}
