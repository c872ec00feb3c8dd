package host

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Prompts, resources and completion from v2 plugins. They run on the
// session's instance of their plugin, as tool calls do, so a prompt or a
// resource can show the session's guest state.

// callContext is hyper-mcp's request context for the guest: a request
// number, the request's _meta (meta, without the session handle; {} when
// there is none), and wasmtools' own fields: the request's session ID, or
// the label of its session handle (never the handle itself), and the
// protocol version.
func (h *Host) callContext(ss *mcp.ServerSession, key sessions.Key, meta map[string]any) abi.CallContext {
	var b json.RawMessage
	if len(meta) > 0 {
		b, _ = json.Marshal(meta)
	}
	return h.callContextJSON(ss, key, b)
}

// callContextJSON is callContext with the _meta already encoded (nil for
// none), so that a tool call encodes it once for both places it goes.
func (h *Host) callContextJSON(ss *mcp.ServerSession, key sessions.Key, meta json.RawMessage) abi.CallContext {
	cc := abi.CallContext{ID: h.requests.Add(1), Meta: json.RawMessage(`{}`), SessionID: sessionID(ss, key)}
	if len(meta) > 0 {
		cc.Meta = meta
	}
	if ip := ss.InitializeParams(); ip != nil {
		cc.ProtocolVersion = ip.ProtocolVersion
	}
	return cc
}

// request runs a v2 request export on a lease of key's instance of p and
// decodes the result into out. A plugin replaced meanwhile serves the
// request from its new version. env, if not nil, serves the guest's host
// functions (a guest that may ask questions runs on a goroutine of its
// own, see ask).
func (h *Host) request(ctx context.Context, key sessions.Key, p *plugins.Plugin, export string, params any, cc abi.CallContext, out any, env *callEnv) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	// Admitted as a tool call is: it runs the guest as one does.
	ctx, release, err := h.admitRun(ctx, env, key, p)
	if err != nil {
		return fmt.Errorf("plugin %q: %w", p.Name(), err)
	}
	defer release()
	cl, claimErr, err := h.claimAndLease(ctx, key, p, false, func() (*plugins.Plugin, error) { return h.currentPlugin(p) })
	if err = cmp.Or(claimErr, err); err != nil {
		return fmt.Errorf("plugin %q: %w", p.Name(), err)
	}
	claim, l := cl.claim, cl.l
	var hostFunc sandbox.HostFunc
	if env != nil {
		hostFunc = env.hostFunc
		env.attach(l)
	}
	result, runErr := l.Instance().Request(l.Context(), export, raw, cc, hostFunc)
	if runErr == nil {
		env.afterCall(l) // a list change the guest announced
	}
	env.attach(nil)
	notSaved := cl.notSaved
	if runErr == nil && h.dur != nil {
		// A prompt or resource may change the guest's state too.
		if cl.memory != nil {
			h.dur.ServedFromMemory(key, cl.memory, l.Plugin().Name(), nil)
		}
		why, cerr := h.dur.AfterCall(ctx, key, claim, l, nil)
		if cerr != nil {
			l.Done(sessions.ErrMoved)
			return fmt.Errorf("plugin %q: %w", p.Name(), cerr)
		}
		notSaved = cmp.Or(why, notSaved)
	}
	l.Done(runErr)
	if runErr != nil {
		h.log.Debug("request failed", "plugin", p.Name(), "export", export, "err", runErr)
		var te *sandbox.TrapError
		if errors.As(runErr, &te) {
			// The client sees why in a line, never wazero's wording or
			// the Wasm stack trace (those are in the log with -v).
			return fmt.Errorf("plugin %q: %s crashed (%s); its state for this session was reset", p.Name(), export, te.Reason())
		}
		return fmt.Errorf("plugin %q: %s: %w", p.Name(), export, runErr)
	}
	if err := json.Unmarshal(result, out); err != nil {
		return fmt.Errorf("plugin %q: %s returned a result that is not valid MCP: %w", p.Name(), export, err)
	}
	if notSaved != "" {
		// Said as a tool call's result says it (shapeResult): a prompt,
		// resource or completion may change the state too, and its
		// client is owed the same warning (a review, stop 57).
		if r, ok := out.(interface {
			GetMeta() map[string]any
			SetMeta(map[string]any)
		}); ok {
			meta := r.GetMeta()
			if meta == nil {
				meta = map[string]any{}
			}
			meta[MetaNotSaved] = map[string]any{"reason": string(notSaved)}
			r.SetMeta(meta)
			h.metrics.notSaved.WithLabelValues(string(notSaved)).Inc()
		}
	}
	return nil
}

func (h *Host) promptHandler(pr *plugins.Prompt) mcp.PromptHandler {
	return func(ctx context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		params := *req.Params
		params.Name = pr.OwnName
		params.Meta = withoutHandle(params.Meta)
		// The host answers the questions; the guest gets its answers.
		params.InputResponses, params.RequestState = nil, ""
		p, name := pr.Plugin(), "prompt "+pr.Name
		kept := 0
		for k, v := range params.Arguments {
			kept += len(k) + len(v)
		}
		round := roundReq{ss: req.Session, responses: req.Params.InputResponses, state: req.Params.RequestState, canPark: true, kept: kept}
		v, parked, err := h.serveRequest(ctx, p, name, round, requestAsCall(req.Session, req.Params.Meta, req.Extra), func(ctx context.Context, key sessions.Key, env *callEnv) (any, error) {
			var res mcp.GetPromptResult
			err := h.request(ctx, key, p, abi.ExportGetPrompt, &params, h.callContext(req.Session, key, params.Meta), &res, env)
			return &res, err
		})
		if parked != nil {
			return &mcp.GetPromptResult{InputRequests: parked.requests, RequestState: parked.state}, nil
		}
		if err != nil {
			return nil, protocolError(err) // busy, state unavailable: retryable
		}
		return v.(*mcp.GetPromptResult), nil
	}
}

func (h *Host) resourceHandler(p *plugins.Plugin) mcp.ResourceHandler {
	return func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		if len(h.accessRules()) > 0 && !h.mayUse(authOf(req), p) {
			// A templated URI: the access middleware could not tell
			// its plugin (access.go).
			return nil, mcp.ResourceNotFoundError(req.Params.URI)
		}
		params := *req.Params
		params.Meta = withoutHandle(params.Meta)
		params.InputResponses, params.RequestState = nil, ""
		round := roundReq{ss: req.Session, responses: req.Params.InputResponses, state: req.Params.RequestState, canPark: true, kept: len(params.URI)}
		v, parked, err := h.serveRequest(ctx, p, "resource "+params.URI, round, requestAsCall(req.Session, req.Params.Meta, req.Extra), func(ctx context.Context, key sessions.Key, env *callEnv) (any, error) {
			var res mcp.ReadResourceResult
			err := h.request(ctx, key, p, abi.ExportReadResource, &params, h.callContext(req.Session, key, params.Meta), &res, env)
			return &res, err
		})
		if parked != nil {
			return &mcp.ReadResourceResult{InputRequests: parked.requests, RequestState: parked.state}, nil
		}
		if err != nil {
			return nil, protocolError(err)
		}
		return v.(*mcp.ReadResourceResult), nil
	}
}

// serveRequest serves a prompt get, resource read or completion (name
// says which) of plugin p: work runs the guest on the lease of the
// request's client. A plugin that may ask questions runs on a goroutine
// of its own, as a tool call does, and a 2026-07-28 client's request is
// parked at a question and resumed by its retry (round.state set); others
// run inline. Either way the guest has the host functions of a tool call.
func (h *Host) serveRequest(ctx context.Context, p *plugins.Plugin, name string, round roundReq, asCall *mcp.CallToolRequest, work func(context.Context, sessions.Key, *callEnv) (any, error)) (any, *parkedRound, error) {
	if round.state != "" {
		r, err := h.unpark(name, round.state, subjectOf(asCall.Extra))
		if err != nil {
			return nil, nil, err
		}
		r.env.follow(ctx, asCall)
		r.pending.replyFrom(round.responses)
		r.pending = nil
		return h.requestRounds(ctx, round, r)
	}
	key, err := h.requestKey(round.ss, asCall.Extra, asCall.Params.Meta)
	if err != nil {
		return nil, nil, err
	}
	env := h.newRequestEnv(ctx, p, name, asCall, key.String())
	env.began = h.ses.ClientNumber(key) // whose, on a pooled instance (client)
	if !asks(p) {
		v, err := work(ctx, key, env)
		env.finish(nil)
		return v, nil, err
	}
	env.questions = make(chan *question)
	r := h.startRequestRun(ctx, env, func(gctx context.Context) (any, error) { return work(gctx, key, env) })
	r.kept += round.kept
	return h.requestRounds(ctx, round, r)
}

func (h *Host) requestRounds(ctx context.Context, round roundReq, r *run) (any, *parkedRound, error) {
	out, parked, err := h.rounds(ctx, round, r)
	switch {
	case parked != nil:
		return nil, parked, nil
	case err != nil:
		return nil, nil, err
	}
	return out.value, nil, out.err
}

// complete answers completion/complete from the plugin that serves the
// prompt or resource template the reference names, if it exports
// complete; otherwise with no suggestions.
func (h *Host) complete(ctx context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
	cat := h.Catalogue()
	p, ok := completedPlugin(cat, req.Params)
	if !ok || !p.HasExport(abi.ExportComplete) {
		return noCompletion(), nil
	}
	params := *req.Params
	params.Meta = withoutHandle(params.Meta)
	if params.Ref.Type == "ref/prompt" { // the guest knows it by its own name
		pr, _ := cat.Prompt(params.Ref.Name)
		r := *params.Ref
		r.Name = pr.OwnName
		params.Ref = &r
	}
	wire, err := completeParams(&params)
	if err != nil {
		return nil, err
	}
	// A completion's result has no input requests: a 2026-07-28 client
	// cannot be asked (canPark false); an older one is asked as the guest
	// runs.
	round := roundReq{ss: req.Session, canPark: false}
	v, _, err := h.serveRequest(ctx, p, "completion", round, requestAsCall(req.Session, req.Params.Meta, req.Extra), func(ctx context.Context, key sessions.Key, env *callEnv) (any, error) {
		var res mcp.CompleteResult
		err := h.request(ctx, key, p, abi.ExportComplete, wire, h.callContext(req.Session, key, params.Meta), &res, env)
		return &res, err
	})
	if err != nil {
		return nil, protocolError(err) // busy, state unavailable: retryable
	}
	res := v.(*mcp.CompleteResult)
	if res.Completion.Values == nil {
		res.Completion.Values = []string{}
	}
	return res, nil
}

// completedPlugin is the plugin serving the prompt or resource (template)
// that a completion's reference names, if any in cat does.
func completedPlugin(cat *plugins.Catalogue, params *mcp.CompleteParams) (*plugins.Plugin, bool) {
	if cat == nil || params == nil || params.Ref == nil {
		return nil, false
	}
	switch ref := params.Ref; ref.Type {
	case "ref/prompt":
		return pluginOf(cat.Prompt(ref.Name))
	case "ref/resource":
		if t, ok := cat.ResourceTemplate(ref.URI); ok {
			return t.Plugin(), true
		}
		return pluginOf(cat.Resource(ref.URI))
	}
	return nil, false
}

// noCompletion is the answer to a completion no plugin serves: no
// suggestions.
func noCompletion() *mcp.CompleteResult {
	return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}}}
}

// completeParams is params as hyper-mcp hands them to a plugin: ref.type
// without its "ref/" prefix ("prompt", "resource").
func completeParams(params *mcp.CompleteParams) (json.RawMessage, error) {
	b, err := json.Marshal(params)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if ref, ok := m["ref"].(map[string]any); ok {
		if t, ok := ref["type"].(string); ok {
			ref["type"] = strings.TrimPrefix(t, "ref/")
		}
	}
	return json.Marshal(m)
}

// setPrompts registers the prompts, resources and resource templates of
// cat, removing those of old that are gone.
func (h *Host) setPrompts(old, cat *plugins.Catalogue) {
	type entries struct {
		prompts   map[string]*plugins.Prompt
		resources map[string]*plugins.Resource
		templates map[string]*plugins.ResourceTemplate
	}
	collect := func(c *plugins.Catalogue) entries {
		e := entries{map[string]*plugins.Prompt{}, map[string]*plugins.Resource{}, map[string]*plugins.ResourceTemplate{}}
		if c == nil {
			return e
		}
		for _, p := range c.Plugins() {
			for _, pr := range p.Prompts() {
				e.prompts[pr.Name] = pr
			}
			for _, r := range p.Resources() {
				e.resources[r.URI] = r
			}
			for _, r := range p.ResourceTemplates() {
				e.templates[r.URITemplate] = r
			}
		}
		return e
	}
	was, now := collect(old), collect(cat)
	var gonePrompts, goneResources, goneTemplates []string
	for name := range was.prompts {
		if _, ok := now.prompts[name]; !ok {
			gonePrompts = append(gonePrompts, name)
		}
	}
	for uri := range was.resources {
		if _, ok := now.resources[uri]; !ok {
			goneResources = append(goneResources, uri)
		}
	}
	for uri := range was.templates {
		if _, ok := now.templates[uri]; !ok {
			goneTemplates = append(goneTemplates, uri)
		}
	}
	if len(gonePrompts) > 0 {
		for _, s := range h.servers() {
			s.RemovePrompts(gonePrompts...)
		}
	}
	if len(goneResources) > 0 {
		for _, s := range h.servers() {
			s.RemoveResources(goneResources...)
		}
	}
	if len(goneTemplates) > 0 {
		for _, s := range h.servers() {
			s.RemoveResourceTemplates(goneTemplates...)
		}
	}
	for name, pr := range now.prompts {
		if was.prompts[name] == pr {
			continue
		}
		for _, s := range h.servers() {
			var mp mcp.Prompt // one each: the SDK keeps it
			if err := json.Unmarshal(pr.Def, &mp); err != nil {
				h.log.Error("prompt not served", "prompt", name, "plugin", pr.Plugin().Name(), "error", err)
				break
			}
			s.AddPrompt(&mp, h.promptHandler(pr))
		}
	}
	for uri, r := range now.resources {
		if was.resources[uri] == r {
			continue
		}
		for _, s := range h.servers() {
			var mr mcp.Resource
			if err := json.Unmarshal(r.Def, &mr); err != nil {
				h.log.Error("resource not served", "uri", uri, "plugin", r.Plugin().Name(), "error", err)
				break
			}
			s.AddResource(&mr, h.resourceHandler(r.Plugin()))
		}
	}
	for uri, r := range now.templates {
		if was.templates[uri] == r {
			continue
		}
		for _, s := range h.servers() {
			var mt mcp.ResourceTemplate
			if err := json.Unmarshal(r.Def, &mt); err != nil {
				h.log.Error("resource template not served", "uriTemplate", uri, "plugin", r.Plugin().Name(), "error", err)
				break
			}
			s.AddResourceTemplate(&mt, h.resourceHandler(r.Plugin()))
		}
	}
}

// keepEmptyText makes a resources/read result send an empty text
// resource as "text": "". The go-sdk's ResourceContents omits an empty
// text, and clients that validate the result (the TypeScript SDK, the MCP
// Inspector) then reject it as neither text nor blob.
func keepEmptyText(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		res, err := next(ctx, method, req)
		if r, ok := res.(*mcp.ReadResourceResult); ok && err == nil {
			for _, c := range r.Contents {
				if c != nil && c.Text == "" && c.Blob == nil {
					return emptyTextResult{r}, nil
				}
			}
		}
		return res, err
	}
}

// emptyTextResult is a ReadResourceResult whose contents without text or
// blob are sent with "text": "".
type emptyTextResult struct{ *mcp.ReadResourceResult }

func (r emptyTextResult) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(r.ReadResourceResult)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	contents, _ := m["contents"].([]any)
	for _, c := range contents {
		if c, ok := c.(map[string]any); ok && c["text"] == nil && c["blob"] == nil {
			c["text"] = ""
		}
	}
	return json.Marshal(m)
}
