package host

import (
	"bytes"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// DefaultAbandonAfter is how long a call whose question is with a
// 2026-07-28 client waits for the answer before it is stopped and its
// instance reset. The answer comes once a person has answered: human time.
const DefaultAbandonAfter = 30 * time.Minute

// DefaultMaxParkedBytes is the default of [Options.MaxParkedBytes]: 16
// parked calls of 4 MiB of arguments each, far more of small ones.
const DefaultMaxParkedBytes = 64 << 20

// ErrRequestState is matched by the error for a retried call whose request
// state is tampered with, expired, or names no waiting call.
var ErrRequestState = errors.New("invalid request state")

// run is a tool call, prompt get, resource read or completion whose guest
// runs on a goroutine of its own, because it may ask questions: for a
// client before 2026-07-28 the host asks them with elicitation/create
// (sampling/createMessage, roots/list) while the guest runs; for a
// 2026-07-28 client the run is parked between requests.
type run struct {
	id       string
	name     string        // the env's name, signed into the request state
	tool     *plugins.Tool // nil but for a tool call
	env      *callEnv
	cancel   context.CancelCauseFunc
	done     chan runResult
	start    time.Time
	round    int       // the client's requests so far, the first included
	pending  *question // the question a parked run waits on
	answered string    // the key the last retry answered
	// subject is the authenticated subject of the request that started
	// the run: only a retry of the same subject resumes it.
	subject string
	// parkedBy is the tenant whose share the run's parking holds, ""
	// when it holds none.
	parkedBy string
	// kept is what the run keeps of the request that started it while it
	// lives (keptBytes), parkedBytes what its parking holds of the parked
	// bytes, for the tenant parkedBytesBy; 0 when it holds none.
	kept          int
	parkedBytes   int
	parkedBytesBy string
}

type runResult struct {
	res   *mcp.CallToolResult // a tool call's
	value any                 // a prompt's, resource's or completion's result
	err   error
}

// parkedRound is the end of a request whose run is parked: the input
// requests that ask its question, and the state the retry brings back.
type parkedRound struct {
	requests mcp.InputRequestMap
	state    string
}

// roundReq is what a run's rounds need of the request that carries one.
type roundReq struct {
	ss        *mcp.ServerSession
	responses mcp.InputResponseMap
	state     string
	// canPark is false where the result has no input requests (a
	// completion): a 2026-07-28 client cannot be asked there.
	canPark bool
	// kept is what the run keeps of the request besides its _meta when
	// that is not a tool call's arguments: a prompt's arguments, a
	// resource's URI.
	kept int
}

func roundOf(req *mcp.CallToolRequest) roundReq {
	return roundReq{ss: req.Session, responses: req.Params.InputResponses, state: req.Params.RequestState, canPark: true}
}

func newRun(name string, env *callEnv, cancel context.CancelCauseFunc) *run {
	var idb [12]byte
	rand.Read(idb[:])
	var subject string
	var kept int
	if _, req := env.current(); req != nil {
		subject, kept = subjectOf(req.Extra), keptBytes(req)
	}
	return &run{id: hex.EncodeToString(idb[:]), name: name, env: env, cancel: cancel, done: make(chan runResult, 1), start: time.Now(), round: 1, subject: subject, kept: kept}
}

// keptBytes is what a call keeps of req while it is parked: its
// arguments' bytes and its _meta at what it costs kept decoded (as
// MaxMetaCost counts it).
func keptBytes(req *mcp.CallToolRequest) int {
	if req == nil || req.Params == nil {
		return 0
	}
	n := len(req.Params.Arguments)
	if len(req.Params.Meta) > 0 {
		n += metaCost(req.Params.Meta, MaxMetaCost)
	}
	return n
}

// startRequestRun starts work, a prompt get, resource read or completion
// whose guest may ask questions, as startRun does a tool call.
func (h *Host) startRequestRun(ctx context.Context, env *callEnv, work func(context.Context) (any, error)) *run {
	gctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	r := newRun(env.name, env, cancel)
	go func() {
		v, err := work(gctx)
		r.done <- runResult{value: v, err: err}
	}()
	return r
}

// startRun starts the guest of call c on its own goroutine, on a context
// that outlives the request (its values kept) and ends when the run is
// cancelled.
func (h *Host) startRun(ctx context.Context, key sessions.Key, c plugins.Call, env *callEnv) *run {
	gctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	r := newRun(c.Tool.Name, env, cancel)
	r.tool = c.Tool
	go func() {
		res, err := h.callTool(gctx, key, &c, env)
		h.forgetUnseen(env.ref, err)
		r.done <- runResult{res: res, err: err}
	}()
	return r
}

// serveRounds waits for a tool call's run to finish, asking its questions
// of the client as they come. For a 2026-07-28 client a question parks the
// run and ends the request with an input-required result.
func (h *Host) serveRounds(ctx context.Context, req *mcp.CallToolRequest, r *run) (*mcp.CallToolResult, error) {
	out, parked, err := h.rounds(ctx, roundOf(req), r)
	switch {
	case parked != nil:
		return &mcp.CallToolResult{InputRequests: parked.requests, RequestState: parked.state}, nil
	case err != nil:
		return nil, err
	}
	return out.res, out.err
}

// rounds serves one request of run r: it waits for the run to finish,
// asking its questions as they come, or for a 2026-07-28 client parks it
// at its first question that this request does not answer.
func (h *Host) rounds(ctx context.Context, req roundReq, r *run) (runResult, *parkedRound, error) {
	multiRound := protocolOfSession(req.ss) >= sessionlessProtocol
	used := map[string]bool{} // inputResponses keys answered in this request
	if req.state != "" && r.answered != "" {
		for _, k := range strings.Split(r.answered, ",") {
			used[k] = true
		}
	}
	for {
		select {
		case out := <-r.done:
			r.env.finish(out.res)
			h.audit(r.env, out.res, r.start)
			return out, nil, nil
		case q := <-r.env.questions:
			if ans, unsupported := h.refuseQuestion(req.ss, q, r, multiRound); ans != "" {
				r.env.refused.Add(1)
				if unsupported && q.answer != nil {
					q.answer <- declineWith(ans)
				} else {
					q.refuse(ans)
				}
				continue
			}
			// A round counts once for a 2026-07-28 client (its bound is
			// on requests); each question counts for an older one.
			r.env.asked += q.size(multiRound)
			if !multiRound {
				// Bounded as a parked call is: a question no one answers
				// would hold the call, its instance and this goroutine
				// for as long as the client kept the request open.
				actx, done := h.asks.add(ctx)
				abandon := cmp.Or(h.opts.AbandonAfter, DefaultAbandonAfter)
				actx, stop := context.WithTimeoutCause(actx, abandon, fmt.Errorf("%w %v", errAbandoned, abandon))
				q.put.Store(true)
				q.askLegacy(actx, req.ss)
				stop()
				done()
				continue
			}
			// A 2026-07-28 client may answer ahead: a response under
			// the question's key in this request's inputResponses (a
			// retry of a stateless client, or several answers at once).
			if q.answeredIn(req.responses, used) {
				q.put.Store(true)
				q.replyFrom(req.responses)
				continue
			}
			if !req.canPark {
				r.env.refused.Add(1)
				q.refuse("a " + sessionlessProtocol + " client cannot be asked during a completion")
				continue
			}
			parked, err := h.park(r, q)
			if err != nil {
				r.env.refused.Add(1)
				q.refuse(err.Error())
				continue
			}
			q.put.Store(true)
			return runResult{}, parked, nil
		case <-ctx.Done():
			r.cancel(context.Canceled)
			out := <-r.done
			r.env.finish(out.res)
			return runResult{}, nil, ctx.Err()
		}
	}
}

func protocolOf(req *mcp.CallToolRequest) string { return protocolOfSession(req.Session) }

func protocolOfSession(ss *mcp.ServerSession) string {
	if ip := ss.InitializeParams(); ip != nil {
		return ip.ProtocolVersion
	}
	return ""
}

// refuseQuestion says why a question cannot be asked of the client, or
// returns "". unsupported is set when the client lacks the capability.
func (h *Host) refuseQuestion(ss *mcp.ServerSession, q *question, r *run, multiRound bool) (why string, unsupported bool) {
	var caps *mcp.ClientCapabilities
	if ip := ss.InitializeParams(); ip != nil {
		caps = ip.Capabilities
	}
	if q.batch != nil {
		q.dropUnsupported(caps)
		if len(q.batch) == 0 {
			return "the client offers none of what was asked", true
		}
	}
	switch {
	case q.batch != nil:
	case q.sampling != nil && (caps == nil || caps.Sampling == nil):
		return "the client does not offer sampling", true
	case q.sampling != nil:
	case q.roots != nil && (caps == nil || caps.RootsV2 == nil):
		return "the client does not offer roots", true
	case q.roots != nil:
	case caps == nil || caps.Elicitation == nil:
		return "the client does not offer elicitation", true
	case q.params.Mode == "url" && caps.Elicitation.URL == nil:
		return `the client does not offer "url" elicitation`, true
	case q.params.Mode == "form" && caps.Elicitation.Form == nil && caps.Elicitation.URL != nil:
		return `the client does not offer "form" elicitation`, true
	}
	switch {
	case multiRound && r.env.asked >= h.maxQuestions():
		return fmt.Sprintf("a call may ask a client at most %d questions (it makes at most %d requests of a call)", h.maxQuestions(), h.maxQuestions()+1), false
	case !multiRound && r.env.asked+q.size(false) > maxLegacyQuestions:
		return fmt.Sprintf("a call may ask at most %d questions", maxLegacyQuestions), false
	}
	return "", false
}

func (h *Host) maxQuestions() int {
	if h.opts.MaxQuestions > 0 {
		return h.opts.MaxQuestions
	}
	return defaultMaxQuestions
}

// cancelWith is the answer to a question the host would not ask (an
// invalid request, too many questions): "cancel", with why in error.
func cancelWith(msg string) *abi.ElicitResult {
	return &abi.ElicitResult{Action: abi.ActionCancel, Error: msg}
}

// declineWith is the answer to a question the client cannot be asked (it
// offers no elicitation, or not in the mode asked), as hyper-mcp gives it:
// "decline" with the reason in content.error; error has it too, for
// wasmtools' guest library.
func declineWith(msg string) *abi.ElicitResult {
	return &abi.ElicitResult{Action: abi.ActionDecline, Content: map[string]any{"error": msg}, Error: msg}
}

// askLegacy asks a client before 2026-07-28 with elicitation/create (the
// SDK checks its capabilities and validates a form answer), or with
// sampling/createMessage.
func (q *question) askLegacy(ctx context.Context, ss *mcp.ServerSession) {
	if q.batch != nil {
		q.askBatchLegacy(ctx, ss)
		return
	}
	if q.roots != nil {
		res, err := ss.ListRoots(ctx, q.roots)
		if err != nil {
			q.refuse("roots/list failed: " + withdrawn(ctx, err))
			return
		}
		q.rooted <- res
		return
	}
	if q.sampling != nil {
		res, err := ss.CreateMessage(ctx, q.sampling)
		if err != nil {
			q.refuse("sampling failed: " + withdrawn(ctx, err))
			return
		}
		q.sampled <- sampledOf(res)
		return
	}
	res, err := ss.Elicit(ctx, q.params)
	if err != nil {
		q.refuse("elicitation failed: " + withdrawn(ctx, err))
		return
	}
	q.answer <- &abi.ElicitResult{Action: res.Action, Content: res.Content}
}

// refuse answers the question at once with why it was not asked.
func (q *question) refuse(msg string) {
	if q.batch != nil {
		for k := range q.batch {
			q.errs[k] = msg
		}
		q.batched <- q.answers()
		return
	}
	if q.roots != nil {
		q.rooted <- &mcp.ListRootsResult{Roots: []*mcp.Root{}, Meta: mcp.Meta{"dev.wasmtools/error": msg}}
		return
	}
	if q.sampling != nil {
		q.sampled <- &abi.CreateMessageResult{Error: msg}
		return
	}
	q.answer <- cancelWith(msg)
}

// reply answers the question with the client's input response.
func (q *question) reply(resp mcp.InputResponse) {
	if q.roots != nil {
		res, ok := resp.(*mcp.ListRootsResult)
		if !ok || res == nil {
			q.refuse("the client's retry carried no answer to the roots request")
			return
		}
		q.rooted <- res
		return
	}
	if q.sampling != nil {
		q.sampled <- sampledOf(resp)
		return
	}
	q.answer <- answerOf(resp, q)
}

// request is the question as an input request.
// size is how many questions q counts for: one a round for a 2026-07-28
// client, one a request for an older one.
func (q *question) size(multiRound bool) int {
	if q.batch == nil || multiRound {
		return 1
	}
	return len(q.batch)
}

// requests are the input requests that ask q of a 2026-07-28 client.
func (q *question) requests() mcp.InputRequestMap {
	if q.batch != nil {
		return maps.Clone(q.batch) // the result's holder may change its map (a task, as answers come)
	}
	return mcp.InputRequestMap{q.key: q.request()}
}

// answeredIn reports whether responses answer q (every request of a
// batch), with keys not yet used in this request; it marks them used.
func (q *question) answeredIn(responses mcp.InputResponseMap, used map[string]bool) bool {
	keys := []string{q.key}
	if q.batch != nil {
		keys = slices.Collect(maps.Keys(q.batch))
	}
	for _, k := range keys {
		if _, ok := responses[k]; !ok || used[k] {
			return false
		}
	}
	for _, k := range keys {
		used[k] = true
	}
	return true
}

// replyFrom answers q with the client's responses.
func (q *question) replyFrom(responses mcp.InputResponseMap) {
	if q.batch != nil {
		q.replyBatch(responses)
		return
	}
	q.reply(responses[q.key])
}

func (q *question) request() mcp.InputRequest {
	if q.roots != nil {
		return q.roots
	}
	if q.sampling != nil {
		return q.sampling
	}
	return q.params
}

// sampledOf turns a client's sampling answer into the guest's result.
func sampledOf(resp any) *abi.CreateMessageResult {
	switch resp.(type) {
	case *mcp.CreateMessageResult, *mcp.CreateMessageWithToolsResult:
	default:
		return &abi.CreateMessageResult{Error: "the client's retry carried no answer to the sampling request"}
	}
	b, err := json.Marshal(resp)
	if err != nil {
		return &abi.CreateMessageResult{Error: "sampling: " + err.Error()}
	}
	var w struct {
		Role       string          `json:"role"`
		Model      string          `json:"model"`
		StopReason string          `json:"stopReason"`
		Content    json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return &abi.CreateMessageResult{Error: "sampling: " + err.Error()}
	}
	if c := bytes.TrimSpace(w.Content); len(c) > 0 && c[0] == '[' {
		var blocks []json.RawMessage
		if json.Unmarshal(c, &blocks) == nil && len(blocks) == 1 {
			w.Content = blocks[0]
		}
	}
	return &abi.CreateMessageResult{Role: w.Role, Model: w.Model, StopReason: w.StopReason, Content: w.Content}
}

// park keeps the run waiting for the client's answer to q, in the
// session layer (which caps parked calls and may evict them), and returns
// the input-required result that asks it.
func (h *Host) park(r *run, q *question) (*parkedRound, error) {
	abandon := cmp.Or(h.opts.AbandonAfter, DefaultAbandonAfter)
	l := r.env.currentLease()
	if l == nil {
		return nil, errors.New("the call cannot be parked")
	}
	tenant := h.shareTenant(r.subject)
	if h.opts.Tenants {
		if !h.parkedShares.take(tenant, h.parkedShare()) {
			return nil, fmt.Errorf("%w: this client's subject has %d, its share", sessions.ErrParkLimit, h.parkedShare())
		}
		r.parkedBy = tenant
	}
	// A parked call keeps the request that started it (its arguments
	// are the guest's input) and, from its second round, the retry it
	// was last served on: bounded in bytes as in number, since each may
	// be 4 MiB and the count alone let 256 of them keep 1 GiB.
	cost := r.kept
	if r.round > 1 {
		_, req := r.env.current()
		cost += keptBytes(req)
	}
	cost = max(cost, 1)
	if err := h.parkedBytes.take(tenant, cost, h.maxParkedBytes(), h.parkedBytesShare()); err != nil {
		h.releasePark(r)
		return nil, err
	}
	r.parkedBytes, r.parkedBytesBy = cost, tenant
	r.round++
	r.pending = q
	if err := l.Park(r.id, r, abandon, func(cause error) { h.abandonRun(r, cause) }); err != nil {
		r.round--
		r.pending = nil
		h.releasePark(r)
		return nil, err
	}
	state := h.signState(r.id, r.round, time.Now().Add(abandon), r.name)
	h.log.Info("call parked for an answer", "run", r.name, "session", r.env.sess, "round", r.round)
	return &parkedRound{requests: q.requests(), state: state}, nil
}

// abandonRun stops a parked run whose client did not come back in time,
// or that was evicted, or whose server is shutting down.
func (h *Host) abandonRun(r *run, cause error) {
	h.releasePark(r)
	h.log.Info("parked call abandoned", "run", r.name, "session", r.env.sess, "cause", cause)
	r.cancel(fmt.Errorf("%w: %w", context.Canceled, cause))
	out := <-r.done
	r.env.finish(out.res)
	h.audit(r.env, out.res, r.start)
}

// resume continues a parked run with the answer the client's retried call
// carries.
func (h *Host) resume(ctx context.Context, t *plugins.Tool, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	r, err := h.unpark(t.Name, req.Params.RequestState, subjectOf(req.Extra))
	if err != nil {
		return nil, err
	}
	r.env.follow(ctx, req)
	r.pending.replyFrom(req.Params.InputResponses)
	r.pending = nil
	return h.serveRounds(ctx, req, r)
}

// unpark takes the run that state names, signed for name, from the
// session layer, and marks the keys its question is answered under. Only
// the subject that started the run resumes it: another subject's retry
// with the same state is refused as a state that names no waiting call,
// and the run stays parked for its own client.
func (h *Host) unpark(name, state, subject string) (*run, error) {
	id, round, err := h.verifyState(state, name)
	if err != nil {
		return nil, err
	}
	v, ok := h.ses.Unpark(id, func(v any) bool { r := v.(*run); return r.round == round && r.subject == subject })
	if !ok {
		return nil, fmt.Errorf("%w: it names no call waiting for an answer (finished, abandoned, or answered already)", ErrRequestState)
	}
	r := v.(*run)
	r.answered = r.pending.key
	h.releasePark(r)
	return r, nil
}

// parkedShare is each tenant's share of the parked calls
// ([Options.MaxParkedPerSubject]).
func (h *Host) parkedShare() int {
	if h.opts.MaxParkedPerSubject > 0 {
		return h.opts.MaxParkedPerSubject
	}
	return max(cmp.Or(h.opts.MaxParked, sessions.DefaultMaxParked)/4, 1)
}

// maxParkedBytes is [Options.MaxParkedBytes].
func (h *Host) maxParkedBytes() int { return cmp.Or(h.opts.MaxParkedBytes, DefaultMaxParkedBytes) }

// parkedBytesShare is each tenant's share of the parked bytes
// ([Options.MaxParkedBytesPerSubject]), 0 (none) without tenants.
func (h *Host) parkedBytesShare() int {
	if !h.opts.Tenants {
		return 0
	}
	if h.opts.MaxParkedBytesPerSubject > 0 {
		return h.opts.MaxParkedBytesPerSubject
	}
	return max(h.maxParkedBytes()/4, 1)
}

// releasePark gives back the share r's parking took, once. Whoever takes
// r out of the session layer (the retry that unparks it, or its
// abandonment) calls it; the session layer makes that one goroutine.
func (h *Host) releasePark(r *run) {
	if r.parkedBy != "" {
		h.parkedShares.give(r.parkedBy)
		r.parkedBy = ""
	}
	if r.parkedBytes > 0 {
		h.parkedBytes.give(r.parkedBytesBy, r.parkedBytes)
		r.parkedBytes, r.parkedBytesBy = 0, ""
	}
}

// answerOf turns the client's response into the guest's answer, checking
// a form answer against the requested schema.
func answerOf(resp mcp.InputResponse, q *question) *abi.ElicitResult {
	er, ok := resp.(*mcp.ElicitResult)
	if !ok || er == nil {
		return cancelWith("the client's retry carried no answer to the question")
	}
	switch er.Action {
	case abi.ActionAccept, abi.ActionDecline, abi.ActionCancel:
	default:
		return cancelWith(fmt.Sprintf("the client answered with unknown action %q", er.Action))
	}
	if er.Action == abi.ActionAccept && q.params.Mode == "form" {
		if err := validateAnswer(q.schema, er.Content); err != nil {
			return cancelWith("the answer does not match the requested schema: " + err.Error())
		}
	}
	return &abi.ElicitResult{Action: er.Action, Content: er.Content}
}

func validateAnswer(schema []byte, content map[string]any) error {
	resolved, err := compileFormSchema(schema)
	if err != nil {
		return err
	}
	var v any = map[string]any{}
	if content != nil {
		// Round-trip so numbers are float64, as the validator expects.
		b, _ := json.Marshal(content)
		json.Unmarshal(b, &v)
	}
	return resolved.Validate(v)
}

// elicit serves the guest's create_elicitation: it checks the request and
// hands it to the goroutine serving the client, then waits for the answer.
func (e *callEnv) elicit(ctx context.Context, input []byte) *abi.ElicitResult {
	var r abi.ElicitRequest
	if err := strictJSON(input, &r); err != nil {
		return cancelWith(err.Error())
	}
	params, schema, err := elicitParams(r)
	if err != nil {
		return cancelWith(err.Error())
	}
	if e.questions == nil {
		return cancelWith("this call cannot ask questions")
	}
	e.issueURLs(params)
	q := &question{key: inputKey(r), params: params, schema: schema, answer: make(chan *abi.ElicitResult, 1)}
	if a, ok := ask(ctx, e, q, q.answer); ok {
		return a
	}
	return cancelWith("the call was cancelled")
}

// maxRefused bounds the questions of one call that the goroutine serving
// the client may refuse without asking anyone (the client lacks the
// capability, the call asked its most, it cannot park): past it, ask
// refuses at once.
const maxRefused = 32

// ask hands q to the goroutine serving the client and waits for its
// answer, with the call's lease paused (see callEnv.waitForPerson); ok is
// false when ctx ends first.
func ask[T any](ctx context.Context, e *callEnv, q *question, answer <-chan T) (a T, ok bool) {
	if n := e.refused.Load(); n >= maxRefused {
		// Refused here, on the guest's time: the goroutine serving the
		// client refuses while the call's deadline is paused, so a guest
		// asking again and again what the client cannot be asked would
		// spend its call in paused hand-offs.
		q.refuse(fmt.Sprintf("this call's questions were refused %d times: it may ask no more", n))
		return <-answer, true
	}
	e.waitForPerson(ctx, func() {
		select {
		case e.questions <- q:
		case <-ctx.Done():
			return
		}
		select {
		case a = <-answer:
			ok = true
		case <-ctx.Done():
		}
	})
	return a, ok
}

// inputKey is the key under which a 2026-07-28 client is asked a form
// question: the request's elicitationId when it is a short name (a form
// question carries none in MCP, so a guest may name its input request
// with it) and not one of the host's, else "q".
func inputKey(r abi.ElicitRequest) string {
	if r.Mode != "url" && validKey(r.ElicitationID) && !hostKey(r.ElicitationID) {
		return r.ElicitationID
	}
	return "q"
}

// hostKey reports whether k is an input key of the host's, as
// grantInputKey is: a client tells the host's questions by them, as it
// tells the host's _meta by MetaPrefix, so a guest's are never put under
// one (a red team, stop 66).
func hostKey(k string) bool { return strings.HasPrefix(k, "wasmtools.") }

func validKey(k string) bool {
	if k == "" || len(k) > 64 {
		return false
	}
	for _, c := range k {
		if !(c == '_' || c == '-' || c == '.' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// elicitParams checks a guest's question: a form asks for a flat object
// of primitive properties (as MCP requires); a URL question needs a URL and
// an elicitation ID.
func elicitParams(r abi.ElicitRequest) (*mcp.ElicitParams, []byte, error) {
	if r.Message == "" {
		return nil, nil, errors.New("elicitation request has no message")
	}
	switch r.Mode {
	case "url":
		if r.URL == "" || r.ElicitationID == "" {
			return nil, nil, errors.New(`a "url" elicitation needs url and elicitationId`)
		}
		if len(r.ElicitationID) > maxElicitationID {
			// Remembered until completed (issueURLs), and a completion
			// of a longer one is refused anyway.
			return nil, nil, fmt.Errorf("elicitationId of %d bytes is over the %d-byte limit", len(r.ElicitationID), maxElicitationID)
		}
		return &mcp.ElicitParams{Mode: "url", Message: r.Message, URL: r.URL, ElicitationID: r.ElicitationID}, nil, nil
	case "", "form":
		var s struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
			Ref        string                     `json:"$ref"`
			Defs       json.RawMessage            `json:"$defs"`
			Defs7      json.RawMessage            `json:"definitions"`
		}
		schema := r.RequestedSchema
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		if err := json.Unmarshal(schema, &s); err != nil || s.Type != "object" {
			return nil, nil, errors.New(`requestedSchema must be an object schema ({"type":"object","properties":{...}})`)
		}
		// A form is flat: no references (a self-reference could make
		// validation recurse without end).
		if s.Ref != "" || s.Defs != nil || s.Defs7 != nil || bytes.Contains(schema, []byte(`"$ref"`)) {
			return nil, nil, errors.New("requestedSchema must be flat: no $ref or $defs")
		}
		for name, p := range s.Properties {
			var prop struct {
				Type  string `json:"type"`
				Items *struct {
					Type  string            `json:"type"`
					Enum  []string          `json:"enum"`
					AnyOf []json.RawMessage `json:"anyOf"`
				} `json:"items"`
			}
			json.Unmarshal(p, &prop)
			switch {
			case prop.Type == "string", prop.Type == "number", prop.Type == "integer", prop.Type == "boolean":
			case prop.Type == "array" && prop.Items != nil && (len(prop.Items.Enum) > 0 || len(prop.Items.AnyOf) > 0):
				// A multi-select of string choices (MCP 2025-11-25, SEP-1330).
			default:
				return nil, nil, fmt.Errorf("requestedSchema property %q has type %q: a form asks only for string, number, integer or boolean, or an array of string choices", name, prop.Type)
			}
		}
		if _, err := compileFormSchema(schema); err != nil {
			return nil, nil, fmt.Errorf("requestedSchema: %v", err)
		}
		var requested any
		json.Unmarshal(schema, &requested)
		return &mcp.ElicitParams{Mode: "form", Message: r.Message, RequestedSchema: requested}, schema, nil
	default:
		return nil, nil, fmt.Errorf("unknown elicitation mode %q: use form or url", r.Mode)
	}
}

func compileFormSchema(b []byte) (*jsonschema.Resolved, error) {
	var s jsonschema.Schema
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	// As the validator read it (encoding/json matches keys
	// case-insensitively, so "$rEf" is a $ref): a form has no references,
	// which could make validation recurse without end.
	canonical, err := json.Marshal(&s)
	if err != nil {
		return nil, err
	}
	for _, k := range []string{`"$ref"`, `"$dynamicRef"`, `"$recursiveRef"`, `"$defs"`, `"definitions"`} {
		if bytes.Contains(canonical, []byte(k)) {
			return nil, errors.New("a form must be flat: no $ref or $defs")
		}
	}
	return s.Resolve(nil)
}

// signState makes the request state of a parked call: which call, which
// round, until when, for which tool, under an HMAC with the host's key.
//
// The state begins with the replica's name, so that a proxy routes the
// retry to the replica where the call is parked, and names this process
// (replica and boot): a parked call lives in its guest, mid-call, and
// cannot move, so a retry that reaches another replica, or this one
// restarted, is told which replica it was parked on.
func (h *Host) signState(id string, round int, expires time.Time, name string) string {
	payload := strings.Join([]string{"v2", h.process(), id, strconv.Itoa(round), strconv.FormatInt(expires.Unix(), 10), name}, "|")
	mac := hmac.New(sha256.New, h.stateKey)
	mac.Write([]byte(payload))
	return h.replicaPrefix() + base64.RawURLEncoding.EncodeToString([]byte(payload)) + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verifyState checks a request state and returns the call and round it
// names.
func (h *Host) verifyState(state, name string) (string, int, error) {
	if strings.Count(state, ".") == 2 { // a replica's name first
		_, state, _ = strings.Cut(state, ".")
	}
	p64, m64, ok := strings.Cut(state, ".")
	payload, err1 := base64.RawURLEncoding.DecodeString(p64)
	sum, err2 := base64.RawURLEncoding.DecodeString(m64)
	if !ok || err1 != nil || err2 != nil {
		return "", 0, fmt.Errorf("%w: malformed", ErrRequestState)
	}
	mac := hmac.New(sha256.New, h.stateKey)
	mac.Write(payload)
	if !hmac.Equal(sum, mac.Sum(nil)) {
		return "", 0, fmt.Errorf("%w: its signature does not match (tampered with, or from another server)", ErrRequestState)
	}
	f := strings.SplitN(string(payload), "|", 6) // the name, last, may hold "|" (a URI)
	if len(f) != 6 || f[0] != "v2" {
		return "", 0, fmt.Errorf("%w: unknown format", ErrRequestState)
	}
	if f[1] != h.process() {
		replica, _, _ := strings.Cut(f[1], "/")
		return "", 0, fmt.Errorf("%w: the call was waiting for this answer on replica %q, which no longer has it (it was stopped or restarted; a call waiting for an answer cannot move between replicas): call the tool again", ErrRequestState, replica)
	}
	f = f[1:]
	round, _ := strconv.Atoi(f[2])
	exp, _ := strconv.ParseInt(f[3], 10, 64)
	if time.Now().Unix() > exp {
		return "", 0, fmt.Errorf("%w: expired", ErrRequestState)
	}
	if f[4] != name {
		return "", 0, fmt.Errorf("%w: it belongs to %q, not %q", ErrRequestState, f[4], name)
	}
	return f[1], round, nil
}

// asking holds the questions waiting for a client's answer (before
// 2026-07-28, on the session's stream), so that Close and Drain end them
// at once rather than waiting for a person: each is answered with a
// refusal saying the server is shutting down, and its call ends.
type asking struct {
	mu     sync.Mutex
	closed bool
	asks   map[*context.CancelCauseFunc]struct{}
}

// errWithdrawn is the cause of a question withdrawn at shutdown.
var errWithdrawn = errors.New("the server is shutting down: the question was withdrawn, call the tool again")

// errAbandoned is the cause of a question to a client before 2026-07-28
// withdrawn because no one answered it within Options.AbandonAfter.
var errAbandoned = errors.New("the question was withdrawn: no one answered it within")

// add returns ctx for one question, ended when the host shuts down; done
// forgets it.
func (a *asking) add(ctx context.Context) (context.Context, func()) {
	actx, cancel := context.WithCancelCause(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		cancel(errWithdrawn)
		return actx, func() {}
	}
	if a.asks == nil {
		a.asks = map[*context.CancelCauseFunc]struct{}{}
	}
	a.asks[&cancel] = struct{}{}
	return actx, func() {
		a.mu.Lock()
		delete(a.asks, &cancel)
		a.mu.Unlock()
		cancel(nil)
	}
}

// withdraw ends every question waiting, and every one asked from now on.
func (a *asking) withdraw() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for c := range a.asks {
		(*c)(errWithdrawn)
	}
}

// withdrawn is err's message, or why the host withdrew the question.
func withdrawn(ctx context.Context, err error) string {
	if c := context.Cause(ctx); errors.Is(c, errWithdrawn) || errors.Is(c, errAbandoned) {
		return c.Error()
	}
	return err.Error()
}
