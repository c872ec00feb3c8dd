package host

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/telemetry"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// handler returns the MCP handler of tool t. It holds t, and so its plugin
// version: a call that started before a reload finishes on that version.
func (h *Host) handler(t *plugins.Tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		start := time.Now()
		res, err := h.call(ctx, t, req)
		return h.called(ctx, t, start, res, err)
	}
}

// called counts and logs a call of t that started at start, and returns
// its result or its refusal as the go-sdk takes it. (Apart from the
// handler, whose frame is under every call's: see traceMiddleware.)
func (h *Host) called(ctx context.Context, t *plugins.Tool, start time.Time, res *mcp.CallToolResult, err error) (*mcp.CallToolResult, error) {
	name := t.Plugin().Name()
	d := time.Since(start)
	switch {
	case err != nil:
		h.metrics.call(name, "refused", d)
		h.log.Warn("call refused", "tool", t.Name, "plugin", name, "error", err)
		return nil, protocolError(err)
	case res.IsError:
		h.metrics.call(name, "tool_error", d)
	default:
		h.metrics.call(name, "ok", d)
	}
	if h.log.Enabled(ctx, slog.LevelDebug) { // its arguments cost allocations even when off
		h.log.Debug("call", "tool", t.Name, "plugin", name, "duration", d, "isError", res.IsError)
	}
	return res, nil
}

func (h *Host) call(ctx context.Context, t *plugins.Tool, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	// The access middleware checked the catalogue of the request's
	// arrival; the tool may have come with a swap since (a plugin enabled
	// live, a name moved to a plugin with a rule), so the plugin that
	// runs is checked too, as resources are (resourceHandler).
	if len(h.accessRules()) > 0 && !h.mayUse(authOf(req), t.Plugin()) {
		return nil, h.unknownTool(t.Name)
	}
	// Before anything runs: a call the client cannot take part in is
	// refused whole (MCP 2026-07-28 says a server must not rely on a
	// capability the client did not declare).
	if missing := missingCapabilities(t, req); missing != nil {
		return nil, missingCapabilityError(t.Name, missing)
	}
	if req.Params.RequestState != "" {
		return h.resume(ctx, t, req)
	}
	// The call is made ready in a function of its own, whose frame is
	// gone before the guest runs (see traceMiddleware).
	var c plugins.Call
	env, res, err := h.prepareCall(ctx, t, req, &c)
	if env == nil {
		return res, err
	}
	start := time.Now()
	if !asks(t.Plugin()) && !t.Plugin().Asks() {
		res, err := h.callTool(ctx, env.ref.key, &c, env)
		h.forgetUnseen(env.ref, err)
		env.finish(res)
		h.audit(env, res, start)
		return res, err
	}
	return h.callAsking(ctx, req, &c, env)
}

// callAsking runs c, whose guest may ask questions (its own, or for
// grants inside its ceiling), on a goroutine of its own, so that the call
// can be parked between a 2026-07-28 client's requests.
func (h *Host) callAsking(ctx context.Context, req *mcp.CallToolRequest, c *plugins.Call, env *callEnv) (*mcp.CallToolResult, error) {
	env.questions = make(chan *question)
	return h.serveRounds(ctx, req, h.startRun(ctx, env.ref.key, *c, env))
}

// prepareCall validates req, a call of t, finds its client and makes the
// call c to run, and its link to the client. Without a link (nil), the
// request is answered with res or err instead: its arguments are not
// valid, or its client is refused.
func (h *Host) prepareCall(ctx context.Context, t *plugins.Tool, req *mcp.CallToolRequest, c *plugins.Call) (env *callEnv, res *mcp.CallToolResult, err error) {
	// The session argument is the host's: the plugin's own schema and
	// the guest never see it.
	args, presented, err := splitSessionArgument(req.Params.Arguments)
	if verr := t.ValidateArguments(args); verr != nil {
		return nil, errorResult(verr.Error()), nil
	}
	ref := clientRef{}
	if err == nil {
		ref, err = h.toolClient(req, t.Plugin(), presented)
	}
	switch {
	case errors.Is(err, ErrHandle):
		return nil, errorResult(err.Error()), nil
	case err != nil:
		return nil, nil, toolError(t, err)
	case ref.refused != nil:
		return nil, h.refusedResult(ref), nil
	}
	m := withoutHandle(req.Params.Meta)
	var meta json.RawMessage
	if len(m) > 0 {
		meta, _ = json.Marshal(m)
	}
	key := ref.key
	env = h.newCallEnv(ctx, t, req, key.String())
	env.bind(ref)
	env.once = onceKey(req)
	*c = plugins.Call{
		Tool: t, Arguments: args, Meta: meta, Host: env.hostFunc,
		Context: h.callContextJSON(req.Session, key, meta),
	}
	return env, nil, nil
}

// asks reports whether p's guest may ask the client something during a
// call (a question, a sampling request, its roots). Such a guest runs on a
// goroutine of its own, so that a 2026-07-28 client's call can park.
func asks(p *plugins.Plugin) bool {
	return p.ImportsHost(abi.FuncCreateElicitation) || p.ImportsHost(abi.FuncCreateMessage) || p.ImportsHost(abi.FuncListRoots) || p.ImportsHost(abi.FuncRequestInputs)
}

// waitsForPerson is sessions.Options.Waits: whether a call of p's guest
// may wait for a person (callEnv.waitForPerson, which pauses its lease):
// one that asks the client something, or for a grant inside its ceiling.
// Only such a lease is given a context of its own, which its eviction
// while it waits cancels.
func waitsForPerson(p *plugins.Plugin) bool { return asks(p) || p.Asks() }

// callTool runs a validated call on a lease of key's instance and shapes
// its result: everything a call costs the host but the MCP transport. The
// error is a refusal (busy, at capacity, shutting down); the call's own
// failure is an isError result. env, if not nil, is the call's link to its
// client. c's Tool becomes the version the call ran on, if a swap
// retargeted it.
//
// Its frame and runGuest's are under the guest's: what only some calls do
// (a refusal's message, a replay, a checkpoint) is in functions of their
// own, so that a call's stack fits in the 8 KiB its goroutine grows to
// anyway (see traceMiddleware).
func (h *Host) callTool(ctx context.Context, key sessions.Key, c *plugins.Call, env *callEnv) (*mcp.CallToolResult, error) {
	t := c.Tool
	arrived := time.Now()
	ctx, release, err := h.admitRun(ctx, env, key, t.Plugin())
	if err != nil {
		return nil, toolError(t, err)
	}
	defer release()
	var (
		out      *abi.CallToolResult
		notice   sessions.Notice
		notSaved durable.NotSaved
	)
	// A contained call runs before its claim is checked, which its
	// checkpoint does (durable.Keeper.CheckLater); one that ran on a stale
	// instance runs again, claimed first.
	later := h.dur != nil && t.Plugin().Contained()
	for {
		var cl leased
		var claimErr error
		cl, claimErr, err = h.leaseFor(ctx, key, t, c, later)
		if claimErr != nil {
			return nil, toolError(t, claimErr)
		}
		notSaved = cl.notSaved
		if cl.unchecked && err == nil && !cl.l.Plugin().Contained() {
			// Swapped meanwhile for a version that is not contained:
			// claimed first.
			cl.l.Done(nil)
			later = false
			continue
		}
		switch {
		case cl.unchecked && (errors.Is(err, sessions.ErrStart) || errors.Is(err, sessions.ErrUnknownKey)):
			// A failure is sent only under a checked claim: run again,
			// claimed first (the instance may have started from a stale
			// state; a handle this replica let go may live on in the
			// store).
			later = false
			continue
		case errors.Is(err, sessions.ErrStart):
			// A failure of the call (its result says so), not a refusal.
		case errors.Is(err, sessions.ErrUnknownKey) && env != nil && env.ref.handle != "":
			return h.expiredResult(env)
		case isRetargetInvalid(err):
			// As prepareCall answers arguments that are not valid.
			return errorResult(err.Error()), nil
		case err != nil:
			return nil, h.refusal(t, err)
		case ctx.Err() != nil || h.postGone(ctx, env):
			// The client went away while the call waited (a request that
			// sat in a stopped process): nothing runs, so nothing resets,
			// and a retry it sent meanwhile is the only run. A reset the
			// lease carried is said by the next call (the fault suite's
			// sigstop-redis-empty: a fresh instance's one notice went
			// with such a request, and the client's next add went on
			// from it unsaid).
			cl.l.KeepNotice()
			cl.l.Done(nil)
			return nil, toolError(t, cmp.Or(ctx.Err(), context.Canceled))
		case env != nil && h.replayed(cmp.Or(cl.claim, cl.memory), env.once) != nil:
			// The call completed before (a proxy's resend, a client's retry
			// with the same idempotency key): its first result, not a
			// second run. (Unchecked, it may have completed elsewhere
			// since: a stale claim knows less, never more.)
			h.keepIfStopped(&cl, arrived)
			return h.answerReplayed(key, t, env, &cl), nil
		default:
			out, err = h.runGuest(ctx, t, c, env, &cl)
			notice = carryReset(cl.l.Notice(), notice)
			h.keepIfStopped(&cl, arrived)
			if h.postGone(ctx, env) {
				// The client went away while the call ran: no one
				// reads this result, and the next call says its notice.
				cl.l.KeepNotice()
			}
			why, res, again := h.afterGuest(ctx, key, t, out, err, env, &cl)
			if again {
				later = false
				continue
			}
			if res != nil {
				return res, nil
			}
			notSaved = cmp.Or(why, notSaved)
		}
		break
	}
	return h.shapeResult(t, env, out, err, notice, notSaved), nil
}

// keepIfStopped makes cl's lease leave its notice for the next call when
// this process was stopped since the call's request arrived: its client
// may have given up on it (its connection closed unseen, or still open),
// and the next call of the client's says the notice again; said twice
// rather than to no one. Not a third time: a notice kept so is not kept
// again by a call that arrived after it was (sessions.Lease.KeepNoticeSince).
func (h *Host) keepIfStopped(cl *leased, arrived time.Time) {
	if h.dur.StoppedSince(arrived) {
		cl.l.KeepNoticeSince(arrived)
	}
}

// carryReset is n, the notice of a call's lease, with the reset of an
// earlier attempt of the same call (prev) if n has none: an attempt that
// ran on a fresh instance and was then run again (its instance stale)
// took the instance's one notice with it, and the client, answered by the
// later attempt, must still be told its state was reset.
func carryReset(n, prev sessions.Notice) sessions.Notice {
	if n.Reset == nil {
		n.Reset = prev.Reset
	}
	return n
}

// leaseFor claims key's session and leases its instance of t's plugin
// (claimAndLease), under a span; a swap meanwhile retargets c.
func (h *Host) leaseFor(ctx context.Context, key sessions.Key, t *plugins.Tool, c *plugins.Call, later bool) (cl leased, claimErr, err error) {
	var actx context.Context
	var aspan trace.Span
	if telemetry.On() { // its attribute escapes: an allocation even when off
		actx, aspan = telemetry.Start(ctx, "wasmtools.acquire", attribute.String("wasmtools.plugin", t.Plugin().Name()))
	} else {
		actx, aspan = telemetry.Start(ctx, "")
	}
	cl, claimErr, err = h.claimAndLease(actx, key, t.Plugin(), later, func() (*plugins.Plugin, error) {
		now, err := h.current(t)
		if err != nil {
			return nil, err
		}
		if now != c.Tool {
			// Checked against the version it runs on: the guest gets
			// only arguments its own schema takes (a red team, stop 64).
			if verr := now.ValidateArguments(c.Arguments); verr != nil {
				return nil, &retargetInvalid{verr}
			}
		}
		c.Tool = now
		return now.Plugin(), nil
	})
	telemetry.End(aspan, cmp.Or(claimErr, err))
	return cl, claimErr, err
}

// retargetInvalid fails a call whose plugin was replaced while it waited
// for its instance, and whose arguments the version now served refuses.
type retargetInvalid struct{ err error }

func (e *retargetInvalid) Error() string {
	return "the tool was updated while the call waited, and its new version refuses the arguments: " + e.err.Error()
}

func (e *retargetInvalid) Unwrap() error { return e.err }

// isRetargetInvalid reports whether err is a retargetInvalid, allocating
// errors.As's target only for an error (callTool asks of every call).
func isRetargetInvalid(err error) bool {
	if err == nil {
		return false
	}
	var ri *retargetInvalid
	return errors.As(err, &ri)
}

// claims reports whether a call of p by key's client claims the session
// in the state store first: a plugin that keeps state, or one that may
// ask the person for grants when the client is a handle's, whose
// answers the session's record keeps for the replica that takes it over
// (a review, stop 64: a stateless plugin's asker forgot them there).
func claims(p *plugins.Plugin, key sessions.Key) bool {
	return !p.Stateless() || p.Asks() && key.Kind() == sessions.KindHandle
}

// toolError is err, refusing a call of t.
func toolError(t *plugins.Tool, err error) error {
	return fmt.Errorf("tool %q: %w", t.Name, err)
}

// refusal is the error refusing a call of t that could not lease its
// instance.
func (h *Host) refusal(t *plugins.Tool, err error) error {
	if errors.Is(err, sessions.ErrBusy) {
		return fmt.Errorf("tool %q: %w (limit %d): wait for earlier calls to finish", t.Name, err, cmp.Or(h.opts.QueueLimit, DefaultQueueLimit))
	}
	return toolError(t, err)
}

// answerReplayed answers a call that completed before with its first result.
func (h *Host) answerReplayed(key sessions.Key, t *plugins.Tool, env *callEnv, cl *leased) *mcp.CallToolResult {
	res := h.replayed(cmp.Or(cl.claim, cl.memory), env.once)
	noticeMeta(cl.l.Notice(), &res.Meta) // an instance reset since says so here too
	cl.l.Done(nil)
	h.log.Info("call answered from its first run", "tool", t.Name, "session", key.String())
	return res
}

// runGuest runs call c of t on cl's instance, under a span.
func (h *Host) runGuest(ctx context.Context, t *plugins.Tool, c *plugins.Call, env *callEnv, cl *leased) (*abi.CallToolResult, error) {
	l := cl.l
	env.attach(l)
	gctx, gspan := h.guestSpan(ctx, t, env, l)
	stop := h.dur.KeepAlive(cl.claim)
	out, err := l.Instance().CallTool(gctx, c)
	stop()
	telemetry.End(gspan, err)
	if err == nil {
		env.afterCall(l)
	}
	env.attach(nil)
	return out, err
}

// guestSpan is the context of a guest's run on l: l's, with ctx's span,
// and a span of its own. With spans off, l's context, acquired under ctx
// (leaseFor's span is then none), carries ctx's span (a client's remote
// one, or none) already: no layer puts it back (a WithValue a call).
func (h *Host) guestSpan(ctx context.Context, t *plugins.Tool, env *callEnv, l *sessions.Lease) (context.Context, trace.Span) {
	cctx := l.Context()
	if telemetry.On() {
		cctx = telemetry.Under(cctx, ctx) // the guest's span beside the lease's, not under it
	}
	if env != nil && t.Plugin().Asks() {
		cctx = sandbox.WithAsker(cctx, env) // grants inside the ceiling are asked for
	}
	if !telemetry.On() { // the name and attributes cost allocations even when off
		return telemetry.Start(cctx, "")
	}
	return telemetry.Start(cctx, "wasmtools.guest "+t.Name, attribute.String("wasmtools.plugin", t.Plugin().Name()), attribute.String("wasmtools.plugin.sha256", t.Plugin().SHA256()))
}

// afterGuest checks and keeps what the guest's run did (its error is
// err), and ends the lease: with a store, its checkpoint, before the
// result is sent. It reports why the state was not saved, if it was not;
// a result when the checkpoint failed, which the call answers with; or
// again, when the instance was stale and the call must run again.
func (h *Host) afterGuest(ctx context.Context, key sessions.Key, t *plugins.Tool, out *abi.CallToolResult, err error, env *callEnv, cl *leased) (why durable.NotSaved, res *mcp.CallToolResult, again bool) {
	l := cl.l
	var cerr error
	switch {
	case err == nil && h.dur != nil:
		why, cerr = h.checkpoint(ctx, key, t, out, env, cl)
	case cl.unchecked:
		// A failure is checked too: it may be as stale as a result.
		why, cerr = h.dur.CheckSince(ctx, key, cl.claim, l, cl.started)
	}
	if errors.Is(cerr, durable.ErrRunAgain) {
		l.Done(sessions.ErrMoved)
		h.log.Info("call ran on a stale instance: run again, its session claimed first", "tool", t.Name, "session", key.String())
		return "", nil, true
	}
	if cerr != nil {
		if errors.Is(cerr, durable.ErrOutcomeUnknown) {
			l.Done(err) // kept: it may hold the only copy of the call's effect
		} else {
			l.Done(sessions.ErrMoved)
		}
		res := errorResult(fmt.Sprintf("tool %q: %v", t.Name, cerr))
		res.Meta = mcp.Meta{MetaNotSaved: map[string]any{"reason": why}}
		if durable.LostHere(cerr) {
			// The plugin starts afresh: said here too, as the fault
			// suite's sigstop-redis-empty found the fresh instance's one
			// notice taken by a request that sat in the stopped process
			// and answered no one.
			noticeMeta(sessions.Notice{Reset: &sessions.Reset{Reason: durable.ReasonStoreLost, Detail: "the state store lost this session's saved state"}}, &res.Meta)
		}
		h.metrics.notSaved.WithLabelValues(string(why)).Inc()
		return why, res, false
	}
	if h.unheard(ctx, env) {
		// The client went away while the state was saved (a checkpoint
		// waits for the store, seconds on a starved machine): no one
		// reads this result either, and the next call says its notice.
		l.KeepNotice()
	}
	l.Done(err)
	return why, nil, false
}

// checkpoint saves the state of a call that succeeded before its result
// is sent: a replica killed after it loses nothing the client was told.
// The result goes in the same write, under the call's at-most-once key.
func (h *Host) checkpoint(ctx context.Context, key sessions.Key, t *plugins.Tool, out *abi.CallToolResult, env *callEnv, cl *leased) (durable.NotSaved, error) {
	var first *durable.Once
	if env != nil && env.once != "" {
		if r, cerr := toMCP(out); cerr == nil {
			// The reset the result says goes with it: a retry answered
			// from it says it too, the call's own answer having perhaps
			// reached no one.
			noticeMeta(cl.l.Notice(), &r.Meta)
			b, _ := json.Marshal(r)
			first = &durable.Once{Key: env.once, Result: b}
		}
	}
	if cl.memory != nil {
		// Not checkpointed (the store is away), but its key is kept (a
		// retry during the outage gets this result), and its state is
		// saved when the store is back.
		h.dur.ServedFromMemory(key, cl.memory, t.Plugin().Name(), first)
	}
	if cl.unchecked {
		return h.dur.AfterUncheckedCall(ctx, key, cl.claim, cl.l, first, cl.started)
	}
	return h.dur.AfterCall(ctx, key, cl.claim, cl.l, first)
}

// shapeResult is a call's result as the client gets it: the guest's
// result (out), or its failure (err), with what the host adds.
func (h *Host) shapeResult(t *plugins.Tool, env *callEnv, out *abi.CallToolResult, err error, notice sessions.Notice, notSaved durable.NotSaved) *mcp.CallToolResult {
	var res *mcp.CallToolResult
	if err != nil {
		res = failureResult(t, err)
	} else if res, err = toMCP(out); err != nil {
		res = errorResult(fmt.Sprintf("tool %q: plugin %q returned a result that is not valid MCP: %v", t.Name, t.Plugin().Name(), err))
	}
	noticeMeta(notice, &res.Meta)
	if notSaved != "" && err == nil {
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		res.Meta[MetaNotSaved] = map[string]any{"reason": notSaved}
		h.metrics.notSaved.WithLabelValues(string(notSaved)).Inc()
	}
	env.attachRecords(res)
	capResult(res, h.maxRunes())
	if env != nil {
		h.sessionResult(env.ref, t.Plugin().Name(), res)
	}
	return res
}

// failureResult turns a failed call into an isError result for the model.
// One whose guest produced no result says so in _meta[MetaFailed].
func failureResult(t *plugins.Tool, err error) *mcp.CallToolResult {
	name := t.Plugin().Name()
	var ge *sandbox.GuestError
	var te *sandbox.TrapError
	failed := func(msg, how string) *mcp.CallToolResult {
		res := errorResult(msg)
		res.Meta = mcp.Meta{MetaFailed: how}
		return res
	}
	switch {
	case errors.As(err, &ge):
		return errorResult(fmt.Sprintf("tool %q failed: %s", t.Name, ge.Message))
	case errors.Is(err, context.DeadlineExceeded):
		return failed(fmt.Sprintf("tool %q timed out and was stopped; plugin %q's state for this session was reset", t.Name, name), "timeout")
	case errors.Is(err, context.Canceled):
		// With a state store the next call goes on from the state saved
		// after the last call that succeeded; without one, or if that
		// state was not saved, it starts afresh and its result says so
		// (stateReset).
		return failed(fmt.Sprintf("tool %q was cancelled and its effect was not kept; plugin %q's state for this session goes back to before the call, or is reset if that was not saved", t.Name, name), "cancelled")
	case errors.As(err, &te):
		return failed(fmt.Sprintf("tool %q crashed (%s); plugin %q's state for this session was reset", t.Name, te.Reason(), name), "trap")
	default:
		return errorResult(fmt.Sprintf("tool %q failed: %v", t.Name, err))
	}
}

func errorResult(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: msg}}, IsError: true}
}

// toMCP converts the guest's result to the SDK's types. Plain text blocks,
// nearly every block a tool returns, are converted directly; a result with
// any other block goes through the SDK's decoder, which knows every content
// type but costs a 32 KiB buffer per call.
func toMCP(r *abi.CallToolResult) (*mcp.CallToolResult, error) {
	res := &mcp.CallToolResult{IsError: r.IsError, Content: make([]mcp.Content, 0, len(r.Content))}
	for _, raw := range r.Content {
		if text, ok := plainText(raw); ok {
			res.Content = append(res.Content, &mcp.TextContent{Text: text})
			continue
		}
		var block struct {
			Type        string          `json:"type"`
			Text        string          `json:"text"`
			Annotations json.RawMessage `json:"annotations"`
			Meta        json.RawMessage `json:"_meta"`
		}
		if err := json.Unmarshal(raw, &block); err != nil {
			return nil, fmt.Errorf("content block: %w", err)
		}
		if block.Type != "text" || block.Annotations != nil || block.Meta != nil {
			return toMCPSlow(r)
		}
		res.Content = append(res.Content, &mcp.TextContent{Text: block.Text})
	}
	if len(r.StructuredContent) > 0 {
		res.StructuredContent = r.StructuredContent
	}
	if len(r.Meta) > 0 {
		if err := json.Unmarshal(r.Meta, &res.Meta); err != nil {
			return nil, fmt.Errorf("_meta: %w", err)
		}
	}
	dropHostMeta(res)
	return res, nil
}

// plainText returns the text of raw when raw is a text block and nothing
// else, written as encoding/json writes one ({"type":"text","text":"..."}),
// its text without escapes: what toMCP would decode, without a decoder.
// It reports false for any other block, which toMCP decodes.
func plainText(raw []byte) (string, bool) {
	const head, tail = `{"type":"text","text":"`, `"}`
	if len(raw) < len(head)+len(tail) || string(raw[:len(head)]) != head || string(raw[len(raw)-len(tail):]) != tail {
		return "", false
	}
	text := raw[len(head) : len(raw)-len(tail)]
	for _, c := range text {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(text) {
		return "", false
	}
	return string(text), true
}

// dropHostMeta removes the _meta keys of the host's namespace from a
// guest's result: only the host says that state was reset or records were
// written, so a client can trust them.
func dropHostMeta(res *mcp.CallToolResult) {
	for k := range res.Meta {
		if strings.HasPrefix(k, MetaPrefix) {
			delete(res.Meta, k)
		}
	}
}

func toMCPSlow(r *abi.CallToolResult) (*mcp.CallToolResult, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	var res mcp.CallToolResult
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	dropHostMeta(&res)
	return &res, nil
}

func (h *Host) maxRunes() int {
	switch n := h.opts.MaxResultRunes; {
	case n == 0:
		return DefaultMaxResultRunes
	case n < 0:
		return -1
	default:
		return n
	}
}

// capResult keeps res within limit runes, counted across everything the
// guest put in it: each content block (a text block counts its text plus
// the runes of its JSON without the text, a non-text block the runes of its
// JSON; both a comma), the structured content, the guest's own _meta keys (the runes of
// each key and value in JSON) and the records of the call
// (_meta[MetaRecords], the runes of each in JSON). They are kept in that
// order while they fit: a text block is cut to fit, and anything else that
// does not fit is dropped whole. The host's other _meta keys (a reset, an
// upgrade) are not counted: they are small and the host's. A note at the
// end says what was left out.
func capResult(res *mcp.CallToolResult, limit int) {
	// The number of blocks is bounded whatever the character limit: a
	// result of thousands of empty blocks fits 50 000 characters.
	overBlocks := 0
	if n := len(res.Content); n > MaxResultBlocks {
		overBlocks = n - MaxResultBlocks
		res.Content = res.Content[:MaxResultBlocks]
	}
	if limit < 0 {
		if overBlocks > 0 {
			res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf("[wasmtools: the result had more than %d content blocks: %d dropped]", MaxResultBlocks, overBlocks)})
		}
		return
	}
	left := limit
	kept := res.Content[:0] // filtered in place: a block is written at or before where it was read
	cut, dropped := 0, 0
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			n := utf8.RuneCountInString(tc.Text)
			over := blockOverhead(tc)
			if over >= left {
				dropped++
				left = 0
				continue
			}
			left -= over
			if n > left {
				runes := []rune(tc.Text)
				cut += n - left
				tc.Text = string(runes[:left])
				n = left
			}
			left -= n
			kept = append(kept, tc)
			continue
		}
		b, _ := json.Marshal(c)
		n := utf8.RuneCount(b) + 1 // and a comma
		if n > left {
			dropped++
			continue
		}
		left -= n
		kept = append(kept, c)
	}
	structured := false
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if n := utf8.RuneCount(b); n > left {
			res.StructuredContent = nil
			structured = true
		} else {
			left -= n
		}
	}
	metaDropped := 0
	keys := make([]string, 0, len(res.Meta))
	for k := range res.Meta {
		if !strings.HasPrefix(k, MetaPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		kb, _ := json.Marshal(k)
		vb, _ := json.Marshal(res.Meta[k])
		if n := utf8.RuneCount(kb) + utf8.RuneCount(vb) + 2; n > left {
			delete(res.Meta, k)
			metaDropped++
		} else {
			left -= n
		}
	}
	recordsDropped := 0
	if records, ok := res.Meta[MetaRecords].([]abi.Record); ok {
		i := 0
		for ; i < len(records); i++ {
			b, _ := json.Marshal(records[i])
			n := utf8.RuneCount(b) + 1
			if n > left {
				break
			}
			left -= n
		}
		if recordsDropped = len(records) - i; i == 0 {
			delete(res.Meta, MetaRecords)
		} else {
			res.Meta[MetaRecords] = records[:i]
		}
	}
	if cut == 0 && dropped == 0 && !structured && metaDropped == 0 && recordsDropped == 0 && overBlocks == 0 {
		return
	}
	note := fmt.Sprintf("[wasmtools: the result was over the %d-character limit:", limit)
	if overBlocks > 0 {
		note = fmt.Sprintf("[wasmtools: the result had more than %d content blocks: %d dropped;", MaxResultBlocks, overBlocks)
		if cut > 0 || dropped > 0 || structured || metaDropped > 0 || recordsDropped > 0 {
			note += fmt.Sprintf(" and it was over the %d-character limit:", limit)
		}
	}
	if cut > 0 {
		note += fmt.Sprintf(" %d characters of text cut;", cut)
	}
	if dropped > 0 {
		note += fmt.Sprintf(" %d content blocks dropped;", dropped)
	}
	if structured {
		note += " structured content dropped;"
	}
	if metaDropped > 0 {
		note += fmt.Sprintf(" %d _meta keys dropped;", metaDropped)
	}
	if recordsDropped > 0 {
		note += fmt.Sprintf(" %d records left out of _meta;", recordsDropped)
	}
	note = note[:len(note)-1] + "]"
	res.Content = append(kept, &mcp.TextContent{Text: note})
}

// blockOverhead is what a text block costs besides its text: the runes of
// its JSON with the text left out, and of the comma after it; 26 for a
// plain block.
func blockOverhead(tc *mcp.TextContent) int {
	if tc.Meta == nil && tc.Annotations == nil {
		return len(`{"type":"text","text":""},`)
	}
	b, _ := json.Marshal(&mcp.TextContent{Meta: tc.Meta, Annotations: tc.Annotations})
	return utf8.RuneCount(b) + 1
}

// MetaIdempotencyKey is the _meta key of a tools/call's idempotency key
// (a string of 1 to 128 bytes): with a state store and the after-call
// checkpoint policy, a call of a session that carries the key of a call
// that completed in that session is not run again; its first result is
// returned (kept with the session's checkpoint, in the same write: the
// last 8 results per plugin, at most 32 KiB of them; of the 512 calls
// before those, only the keys are kept, and such a call is refused as run
// before, not run again).
const MetaIdempotencyKey = MetaPrefix + "idempotencyKey"

// resendHeader carries, from the HTTP layer to the call, a digest of a
// tools/call POST's body (its JSON-RPC id, tool and arguments): a
// proxy's resend of the same POST is the same call, answered once.
const resendHeader = "X-Wasmtools-Resend"

// onceKey is req's at-most-once key: its idempotency key, else the
// digest of its POST (a resend), else "".
func onceKey(req *mcp.CallToolRequest) string {
	if k, ok := req.Params.Meta[MetaIdempotencyKey].(string); ok && k != "" && len(k) <= 128 {
		return "k:" + k
	}
	if req.Extra != nil && req.Extra.Header != nil {
		if d := req.Extra.Header.Get(resendHeader); d != "" {
			return "r:" + d
		}
	}
	return ""
}

// detachedCall marks the context of a call that runs detached from the
// request that started it (a task: tasks.go).
type detachedCall struct{}

// liveHeader carries, from the HTTP layer to a stateful session's call,
// a token naming the POST's own context (see Host.posts).
const liveHeader = "X-Wasmtools-Post"

// postGone reports whether the HTTP request that carried env's call has
// ended (its client closed the connection) before the call ran.
func (h *Host) postGone(ctx context.Context, env *callEnv) bool {
	token := postToken(ctx, env)
	if token == "" {
		return false
	}
	// Not there: the POST was answered already (a task runs on after
	// its POST): nothing says the client is gone.
	v, ok := h.posts.Load(token)
	return ok && v.(context.Context).Err() != nil
}

// unheard reports whether the HTTP request that carried env's call, not
// answered yet, has ended without its answer: its client closed the
// connection, or its handler returned since (it does once its client
// left, and forgets the request's token).
func (h *Host) unheard(ctx context.Context, env *callEnv) bool {
	token := postToken(ctx, env)
	if token == "" {
		return false
	}
	v, ok := h.posts.Load(token)
	return !ok || v.(context.Context).Err() != nil
}

// postToken is the liveHeader token of the POST that carried env's call,
// "" if none.
func postToken(ctx context.Context, env *callEnv) string {
	if ctx.Value(detachedCall{}) != nil {
		// A task's call runs on after its POST was answered (and its
		// client may have hung up): it is not the POST's.
		return ""
	}
	if env == nil || env.req == nil || env.req.Extra == nil || env.req.Extra.Header == nil {
		return ""
	}
	return env.req.Extra.Header.Get(liveHeader)
}

// leased is a request's claim on its session and its lease of an
// instance (claimAndLease).
type leased struct {
	claim    *durable.Claim // nil without a store, or when served from memory
	memory   *durable.Claim // served from memory: for at-most-once only
	notSaved durable.NotSaved
	l        *sessions.Lease
	// unchecked: claim is not checked yet (durable.Keeper.CheckLater);
	// the call's checkpoint, or CheckSince, checks it. started is when
	// the request claimed its session.
	unchecked bool
	started   time.Time
}

// maxReclaims is how many times a request claims its session again when
// the session moved while the request waited for its instance.
const maxReclaims = 3

// claimAndLease claims key's session with a state store (taking it over,
// if another replica served it) and then leases its instance of p
// (retarget: see Host.acquire). claimErr is the claim's failure, with
// nothing leased; err the lease's. A session that moved while the request
// waited behind another call is claimed again, which takes it over from
// the store, up to maxReclaims times (replicas taking a session in turn
// can move it again meanwhile); then err is sessions.ErrMoved, answered
// as the retryable -32053, and nothing ran.
//
// later asks for a claim checked after the call instead, if the keeper
// has one that may be (durable.Keeper.CheckLater): the caller checks it
// with the call's checkpoint.
func (h *Host) claimAndLease(ctx context.Context, key sessions.Key, p *plugins.Plugin, later bool, retarget func() (*plugins.Plugin, error)) (cl leased, claimErr, err error) {
	for attempt := 0; ; attempt++ {
		cl = leased{started: time.Now()}
		if later && attempt == 0 && !p.Stateless() {
			if c := h.dur.CheckLater(key); c != nil {
				cl.claim, cl.unchecked = c, true
			}
		}
		if claims(p, key) && !cl.unchecked {
			c, cerr := h.dur.BeforeCall(ctx, key)
			switch {
			case errors.Is(cerr, durable.ErrServedFromMemory):
				cl.notSaved, cl.memory = durable.NotSavedUnavailable, c
			case cerr != nil:
				return cl, cerr, nil
			default:
				cl.claim = c
			}
		}
		cl.l, err = h.acquire(ctx, key, p, retarget)
		if !errors.Is(err, sessions.ErrMoved) || attempt == maxReclaims {
			return cl, nil, err
		}
	}
}
