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
	mu  sync.Mutex
	ids map[string][]string // scope (urlScope) -> IDs, oldest first
	// clients are the numbers of the session-layer clients whose IDs
	// each scope holds (sessions.Manager.ClientNumber, 0 for none), as
	// the grant book's: a key's client that ended and came back is
	// another, and its old client's late end must not forget its IDs.
	clients map[string]uint64
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

// end forgets the IDs issued in session (its label): its client
// numbered client ended. Those of a later client of its key stay.
func (u *issuedURLs) end(session string, client uint64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for scope := range u.ids {
		if strings.HasPrefix(scope, session+"\x00") && u.clients[scope] <= client {
			u.forgetLocked(scope)
		}
	}
}

// forgetLocked forgets scope's IDs. u.mu is held.
func (u *issuedURLs) forgetLocked(scope string) {
	delete(u.ids, scope)
	delete(u.clients, scope)
	u.bound.remove(scope)
}

// scopeIDs returns scope's IDs for the client numbered client: none when
// they are an earlier client's of the key (ended, its end not come yet,
// as it waits for that client's calls), which are forgotten, or a later
// one's (client is an ended client's, whose call still runs). IDs issued
// while the key had no client (0: calls of a stateless plugin, on pooled
// instances) are the session's, and so its live client's, numbered
// live: not an ended client's late call's. u.mu is held.
func (u *issuedURLs) scopeIDs(scope string, client, live uint64) []string {
	ids, ok := u.ids[scope]
	switch {
	case ok && u.clients[scope] != 0 && u.clients[scope] < client:
		u.forgetLocked(scope)
		return nil
	case u.later(scope, client, live):
		return nil
	}
	return ids
}

// later reports whether scope's IDs are of a client after the one
// numbered client: a later one's, or the session's (issued while the key
// had no client) once the key's live client, numbered live, is a later
// one. u.mu is held.
func (u *issuedURLs) later(scope string, client, live uint64) bool {
	c := u.clients[scope]
	return client != 0 && (c > client || c == 0 && client < live)
}

// client is the number of e's session-layer client, 0 for none: the
// client whose instance e's guest runs on, which may have ended while
// it runs and its key come back as another client (whose grants and URL
// IDs are not this call's); else, a pooled instance or none, the key's
// client when the call began (bind), for the same reason
// (TestOldClientsPooledCallKeepsOutOfReturningClients).
func (e *callEnv) client() uint64 {
	if l := e.currentLease(); l != nil && l.Client() != 0 {
		return l.Client()
	}
	return e.began
}

// issueURLs remembers the URL elicitations among params as issued by e's
// plugin in e's session.
func (e *callEnv) issueURLs(params ...*mcp.ElicitParams) {
	tenant, scope, client := e.tenant(), e.urlScope(), e.client()
	live := e.h.ses.ClientNumber(e.ref.key)
	u := &e.h.urls
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range params {
		if p == nil || p.Mode != "url" || p.ElicitationID == "" {
			continue
		}
		if u.ids == nil {
			u.ids, u.clients = map[string][]string{}, map[string]uint64{}
			u.bound.total, u.bound.perTenant = maxIssuedScopes, maxIssuedScopesPerTenant
		}
		u.scopeIDs(scope, client, live) // an earlier client's forgotten
		if u.later(scope, client, live) {
			// An ended client's call: its IDs are no later client's to
			// complete.
			continue
		}
		for _, s := range u.bound.add(scope, tenant) {
			delete(u.ids, s)
			delete(u.clients, s)
		}
		ids := append(u.ids[scope], p.ElicitationID)
		if len(ids) > maxIssuedPerScope {
			ids = ids[1:]
		}
		u.ids[scope] = ids
		u.clients[scope] = max(u.clients[scope], client)
	}
}

// spendURL reports whether e may send the completion of elicitation id:
// issued by e's plugin in e's session and not completed yet, within the
// call's and the plugin's rates. The ID is spent when it may.
func (e *callEnv) spendURL(id string) (ok bool, why string) {
	client, live := e.client(), e.h.ses.ClientNumber(e.ref.key)
	u := &e.h.urls
	u.mu.Lock()
	defer u.mu.Unlock()
	scope := e.urlScope()
	ids := u.scopeIDs(scope, client, live)
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
