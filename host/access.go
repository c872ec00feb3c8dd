package host

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/gob"
	"fmt"
	"maps"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/plugins"
)

// AccessRule says who may list and use a plugin's tools, prompts and
// resources: a request whose authenticated subject is one of Subjects,
// or whose access token holds one of Scopes, or whose token's claims
// match one of Claims (claim name = value; a list claim matches when it
// holds the value). A rule that names no one allows no one. Requests
// without a subject (the shared token, no token) match only Subjects
// containing "".
type AccessRule struct {
	Subjects []string
	Scopes   []string
	Claims   map[string]string
}

// allows reports whether the rule allows the request's token.
func (r AccessRule) allows(ti *authInfo) bool {
	if slices.Contains(r.Subjects, ti.subject) {
		return true
	}
	for _, s := range r.Scopes {
		if slices.Contains(ti.scopes, s) {
			return true
		}
	}
	for k, want := range r.Claims {
		switch v := ti.claims[k].(type) {
		case string:
			if v == want {
				return true
			}
		case []any:
			for _, e := range v {
				if s, ok := e.(string); ok && s == want {
					return true
				}
			}
		}
	}
	return false
}

// authInfo is what the access rules read of a request's token.
type authInfo struct {
	subject string
	scopes  []string
	claims  map[string]any
}

func authOf(req mcp.Request) *authInfo {
	ai := &authInfo{}
	if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
		ai.subject, ai.scopes = extra.TokenInfo.UserID, extra.TokenInfo.Scopes
		ai.claims, _ = extra.TokenInfo.Extra["claims"].(map[string]any)
	}
	return ai
}

// accessRules are the access rules in force ([Options.PluginAccess], then
// [Host.SetPluginAccess]'s): nil for none.
func (h *Host) accessRules() map[string]AccessRule {
	if m := h.access.Load(); m != nil {
		return *m
	}
	return nil
}

// SetPluginAccess replaces the access rules ([Options.PluginAccess]) when
// the configuration changes: each request after it is checked under the
// new rules (lists, calls, reads, subscriptions' updates). A call running
// finishes; a session that subscribed to a resource before any rule was
// set gets its updates only if the new rules let everyone have them.
func (h *Host) SetPluginAccess(rules map[string]AccessRule) {
	rules = maps.Clone(rules)
	h.access.Store(&rules)
}

// mayUse reports whether the request may use plugin p: p has no rule,
// or its rule allows the request.
func (h *Host) mayUse(ai *authInfo, p *plugins.Plugin) bool {
	rule, ok := h.accessRules()[p.Name()]
	return !ok || rule.allows(ai)
}

// accessMiddleware applies [Options.PluginAccess]: the lists a request
// gets show only what it may use, and using anything else is refused
// exactly as a name the server does not know (the SDK's own errors), so
// that a plugin outside one's grant cannot be told from one that does not
// exist. It is the outermost middleware: a call refused here never
// becomes a task.
func (h *Host) accessMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		cat := h.Catalogue()
		if len(h.accessRules()) == 0 || cat == nil {
			if h.opts.Tenants {
				h.watchingTenant(req)
			}
			return next(ctx, method, req)
		}
		return h.accessChecked(ctx, next, method, req, cat)
	}
}

// accessChecked is accessMiddleware's handling of a request when some
// plugins are not everyone's: in a function of its own, so that the
// middleware's frame, under every call's, stays small (see
// traceMiddleware).
func (h *Host) accessChecked(ctx context.Context, next mcp.MethodHandler, method string, req mcp.Request, cat *plugins.Catalogue) (mcp.Result, error) {
	ai := authOf(req)
	switch r := req.(type) {
	case *mcp.CallToolRequest:
		if t, ok := cat.Tool(r.Params.Name); ok && !h.mayUse(ai, t.Plugin()) {
			return nil, h.unknownTool(r.Params.Name)
		}
	case *mcp.GetPromptRequest:
		if p, ok := cat.Prompt(r.Params.Name); ok && !h.mayUse(ai, p.Plugin()) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown prompt %q", r.Params.Name)}
		}
	case *mcp.ReadResourceRequest:
		if res, ok := cat.Resource(r.Params.URI); ok && !h.mayUse(ai, res.Plugin()) {
			return nil, mcp.ResourceNotFoundError(r.Params.URI)
		}
	case *mcp.CompleteRequest:
		if p, ok := completedPlugin(cat, r.Params); ok && !h.mayUse(ai, p) {
			return noCompletion(), nil // as complete answers a reference it does not know
		}
	case *mcp.SubscribeRequest:
		if r.Params != nil && !h.mayWatch(ai, cat, r.Params.URI) {
			return nil, mcp.ResourceNotFoundError(r.Params.URI)
		}
		h.watching(r.Session, ai)
	case *mcp.SubscriptionsListenRequest:
		// A 2026-07-28 client's subscriptions: those it may not have are
		// left out of what the server acknowledges.
		if n := r.Params; n != nil && n.Notifications != nil && len(n.Notifications.ResourceSubscriptions) > 0 {
			n.Notifications.ResourceSubscriptions = slices.DeleteFunc(slices.Clone(n.Notifications.ResourceSubscriptions), func(uri string) bool { return !h.mayWatch(ai, cat, uri) })
			h.watching(r.Session, ai)
		}
	}
	hidden := func(p *plugins.Plugin, ok bool) bool { return ok && !h.mayUse(ai, p) }
	switch r := req.(type) {
	case *mcp.ListToolsRequest:
		if r.Params == nil {
			r.Params = &mcp.ListToolsParams{}
		}
		return visiblePage(ctx, next, method, req, &r.Params.Cursor,
			func(res *mcp.ListToolsResult) (*[]*mcp.Tool, *string) { return &res.Tools, &res.NextCursor },
			func(t *mcp.Tool) (string, bool) { return t.Name, hidden(pluginOf(cat.Tool(t.Name))) })
	case *mcp.ListPromptsRequest:
		if r.Params == nil {
			r.Params = &mcp.ListPromptsParams{}
		}
		return visiblePage(ctx, next, method, req, &r.Params.Cursor,
			func(res *mcp.ListPromptsResult) (*[]*mcp.Prompt, *string) { return &res.Prompts, &res.NextCursor },
			func(p *mcp.Prompt) (string, bool) { return p.Name, hidden(pluginOf(cat.Prompt(p.Name))) })
	case *mcp.ListResourcesRequest:
		if r.Params == nil {
			r.Params = &mcp.ListResourcesParams{}
		}
		return visiblePage(ctx, next, method, req, &r.Params.Cursor,
			func(res *mcp.ListResourcesResult) (*[]*mcp.Resource, *string) { return &res.Resources, &res.NextCursor },
			func(r *mcp.Resource) (string, bool) { return r.URI, hidden(pluginOf(cat.Resource(r.URI))) })
	case *mcp.ListResourceTemplatesRequest:
		if r.Params == nil {
			r.Params = &mcp.ListResourceTemplatesParams{}
		}
		return visiblePage(ctx, next, method, req, &r.Params.Cursor,
			func(res *mcp.ListResourceTemplatesResult) (*[]*mcp.ResourceTemplate, *string) {
				return &res.ResourceTemplates, &res.NextCursor
			},
			func(r *mcp.ResourceTemplate) (string, bool) {
				return r.URITemplate, hidden(pluginOf(cat.ResourceTemplate(r.URITemplate)))
			})
	}
	return next(ctx, method, req)
}

// visiblePage serves a list request a page of the entries it may see:
// the go-sdk's pages (each of mcp.DefaultPageSize entries, its cursor the
// name of the page's last) are read from the request's cursor on, and
// their hidden entries left out, until a page's worth is kept or the list
// ends; the cursor given back names the last entry kept. Filtering the
// go-sdk's page alone handed a request outside a plugin's rule the name
// that ended the page, a hidden one as often as not, and, from a cursor
// of its own making, the count of hidden entries among the next page's
// (TestPluginAccessListCursor).
func visiblePage[R mcp.Result, T any](ctx context.Context, next mcp.MethodHandler, method string, req mcp.Request, cursor *string, fields func(R) (*[]T, *string), entry func(T) (name string, hidden bool)) (mcp.Result, error) {
	kept := []T{} // none is [] on the wire, as the go-sdk sends it, not null
	for {
		out, err := next(ctx, method, req)
		if err != nil {
			return out, err
		}
		res, ok := out.(R)
		if !ok {
			return out, nil
		}
		items, nextCursor := fields(res)
		for _, it := range *items {
			name, hidden := entry(it)
			if hidden {
				continue
			}
			if kept = append(kept, it); len(kept) == mcp.DefaultPageSize {
				c, err := encodeCursor(name)
				if err != nil {
					return nil, err
				}
				*items, *nextCursor = kept, c
				return out, nil
			}
		}
		if *nextCursor == "" {
			*items = kept
			return out, nil
		}
		*cursor = *nextCursor
	}
}

// pageToken is what a go-sdk list cursor holds (the go-sdk's own
// unexported type, which gob reads by its fields' names).
type pageToken struct{ LastUID string }

// encodeCursor is the go-sdk's cursor of a page ending with uid.
func encodeCursor(uid string) (string, error) {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(pageToken{LastUID: uid}); err != nil {
		return "", err
	}
	return base64.URLEncoding.EncodeToString(b.Bytes()), nil
}

// mayWatch reports whether the request may subscribe to uri, and be told
// it changed: uri is a resource of a plugin in cat, or matches one's
// resource template, and the request may use every plugin it is one of.
// A URI no plugin serves is refused too, so that a subscription refused
// by the rules cannot be told from one to a URI that does not exist.
func (h *Host) mayWatch(ai *authInfo, cat *plugins.Catalogue, uri string) bool {
	owned := false
	if r, ok := cat.Resource(uri); ok {
		if !h.mayUse(ai, r.Plugin()) {
			return false
		}
		owned = true
	}
	for _, p := range cat.Plugins() {
		if p.MatchesTemplate(uri) {
			if !h.mayUse(ai, p) {
				return false
			}
			owned = true
		}
	}
	return owned
}

// watching keeps the token of ss's subscriptions (ai) until ss ends, for
// watchFilter. A session's subject is its first request's (the go-sdk
// refuses a request of another subject on it).
func (h *Host) watching(ss *mcp.ServerSession, ai *authInfo) {
	if _, had := h.watchers.Swap(ss, ai); had || !h.track() {
		return
	}
	go func() {
		defer h.wg.Done()
		_ = ss.Wait()
		h.watchers.Delete(ss)
	}()
}

// watchingTenant keeps the subject of a session that subscribes, with
// Options.Tenants and no access rules (accessChecked does with them), for
// watchFilter.
func (h *Host) watchingTenant(req mcp.Request) {
	switch r := req.(type) {
	case *mcp.SubscribeRequest:
		h.watching(r.Session, authOf(req))
	case *mcp.SubscriptionsListenRequest:
		if n := r.Params; n != nil && n.Notifications != nil && len(n.Notifications.ResourceSubscriptions) > 0 {
			h.watching(r.Session, authOf(req))
		}
	}
}

// watchFilter sends a resource update only to sessions that may use the
// plugins serving its URI (mayWatch), as the catalogue is now: the go-sdk
// tells every session subscribed to the URI, and a reload may have given
// it to a plugin the session's subject may not use. With Options.Tenants,
// only to sessions of the tenant whose instance changed: another tenant's
// instances did not (each client has its own), and a review found bob
// told of every change alice's calls made to her own instance, a channel
// between tenants (TestResourceUpdatesStayWithTheirTenant).
func (h *Host) watchFilter(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method != "notifications/resources/updated" {
			return next(ctx, method, req)
		}
		params, _ := req.GetParams().(*mcp.ResourceUpdatedNotificationParams)
		from, tagged := "", false
		if params != nil {
			if from, tagged = params.Meta[metaUpdateFrom].(string); tagged {
				// Taken out of a copy: the SDK hands the same params
				// (or their Meta) to every subscriber.
				out := *params
				out.Meta = maps.Clone(params.Meta)
				delete(out.Meta, metaUpdateFrom)
				if len(out.Meta) == 0 {
					out.Meta = nil
				}
				params = &out
				ss, ok := req.GetSession().(*mcp.ServerSession)
				if !ok {
					return nil, nil
				}
				req = &mcp.ServerRequest[*mcp.ResourceUpdatedNotificationParams]{Session: ss, Params: params}
			}
		}
		if !tagged && len(h.accessRules()) == 0 {
			return next(ctx, method, req)
		}
		ai := &authInfo{} // a session that never subscribed here: a client without a subject
		if v, ok := h.watchers.Load(req.GetSession()); ok {
			ai = v.(*authInfo)
		}
		if tagged && h.tenantOf(ai.subject) != from {
			return nil, nil
		}
		if len(h.accessRules()) == 0 {
			return next(ctx, method, req)
		}
		if cat := h.Catalogue(); params == nil || cat == nil || !h.mayWatch(ai, cat, params.URI) {
			return nil, nil
		}
		return next(ctx, method, req)
	}
}

// pluginOf is the plugin of a catalogue entry, as a lookup returns it.
func pluginOf[T interface{ Plugin() *plugins.Plugin }](v T, ok bool) (*plugins.Plugin, bool) {
	if !ok {
		return nil, false
	}
	return v.Plugin(), true
}

// setCacheable marks the lists private when they differ by subject
// (with access rules), so that no shared cache serves one subject's list
// to another (2026-07-28 cacheScope).
func (h *Host) setCacheable(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
	if len(h.accessRules()) > 0 {
		c.CacheScope = "private"
	}
}
