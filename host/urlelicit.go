package host

import (
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
	// plugin, maxIssuedSessions the sessions remembered and
	// maxIssuedSessionsPerTenant one tenant's (with Options.Tenants):
	// past them the oldest go (their completions are then dropped), the
	// tenant's holding the most (tenantFIFO), so that one tenant's
	// sessions never push out another's. A session's IDs go when its
	// client ends (Host.clientEnded).
	maxIssuedPerScope          = 32
	maxIssuedSessions          = 4096
	maxIssuedSessionsPerTenant = maxIssuedSessions / 4
)

// issuedURLs remembers the URL elicitation IDs each plugin issued in
// each session, and paces each plugin's completions. It is safe for
// concurrent use.
type issuedURLs struct {
	mu      sync.Mutex
	ids     map[string]map[string][]string // session label -> plugin -> IDs, oldest first
	bound   tenantFIFO[string]             // of session labels
	plugins map[string]*tokenBucket
}

// end forgets the IDs issued in session (its label): its client ended.
func (u *issuedURLs) end(session string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.ids, session)
	u.bound.remove(session)
}

// issueURLs remembers the URL elicitations among params as issued by e's
// plugin in e's session.
func (e *callEnv) issueURLs(params ...*mcp.ElicitParams) {
	tenant := e.tenant()
	u := &e.h.urls
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range params {
		if p == nil || p.Mode != "url" || p.ElicitationID == "" {
			continue
		}
		if u.ids == nil {
			u.ids = map[string]map[string][]string{}
			u.bound.total, u.bound.perTenant = maxIssuedSessions, maxIssuedSessionsPerTenant
		}
		for _, s := range u.bound.add(e.sess, tenant) {
			delete(u.ids, s)
		}
		byPlugin := u.ids[e.sess]
		if byPlugin == nil {
			byPlugin = map[string][]string{}
			u.ids[e.sess] = byPlugin
		}
		ids := append(byPlugin[e.plugin.Name()], p.ElicitationID)
		if len(ids) > maxIssuedPerScope {
			ids = ids[1:]
		}
		byPlugin[e.plugin.Name()] = ids
	}
}

// spendURL reports whether e may send the completion of elicitation id:
// issued by e's plugin in e's session and not completed yet, within the
// call's and the plugin's rates. The ID is spent when it may.
func (e *callEnv) spendURL(id string) (ok bool, why string) {
	u := &e.h.urls
	u.mu.Lock()
	defer u.mu.Unlock()
	ids := u.ids[e.sess][e.plugin.Name()]
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
	if u.plugins == nil {
		u.plugins = map[string]*tokenBucket{}
	}
	pb := u.plugins[e.plugin.Name()]
	if pb == nil {
		b := newTokenBucket(completePluginBurst, completePluginPerSecond)
		pb = &b
		u.plugins[e.plugin.Name()] = pb
	}
	e.mu.Lock()
	if e.completions.burst == 0 {
		e.completions = newTokenBucket(completeCallBurst, completeCallPerSecond)
	}
	callOK := e.completions.take()
	e.mu.Unlock()
	if !callOK || !pb.take() {
		return false, "over the rate of completions"
	}
	u.ids[e.sess][e.plugin.Name()] = append(ids[:i:i], ids[i+1:]...)
	return true, ""
}
