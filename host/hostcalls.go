package host

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// MetaRecords is the _meta key under which a result carries the records its
// call wrote, in order: [{"namespace": "...", "data": ...}, ...].
const MetaRecords = MetaPrefix + "records"

// Limits on what a guest may send through the host functions: per message,
// per call, and per plugin (across all its instances and calls, see
// pluginBudget). Rates are token buckets: a burst, then so much a second.
// What a rate limit drops is counted and logged once per call; what is over
// a per-message cap is refused to the guest.
const (
	maxRecords         = 100
	maxRecordBytes     = 64 << 10
	maxRecordCallBytes = 1 << 20
	maxNamespaceLen    = 128
	// A plugin's records, across its calls: a call's worth at once, then
	// 64 KiB a second.
	recordPluginBurst          = maxRecordCallBytes
	recordPluginBytesPerSecond = 64 << 10

	progressBurst     = 10
	progressPerSecond = 20
	// maxProgressMessage caps a progress message; a longer one is cut at
	// a character boundary.
	maxProgressMessage = 1 << 10

	// maxLogData caps the JSON of a log message's data, and maxLoggerLen
	// its logger name; a message over either is refused (a trap naming
	// the cap).
	maxLogData   = 16 << 10
	maxLoggerLen = 128
	// A call's log messages: 20 at once, then 50 a second, within 64 KiB
	// at once, then 16 KiB a second.
	logBurst              = 20
	logPerSecond          = 50
	logCallBurstBytes     = 64 << 10
	logCallBytesPerSecond = 16 << 10
	// A plugin's log messages, across its instances and calls: 100 at
	// once, then 100 a second, within 256 KiB at once, then 64 KiB a
	// second.
	logPluginBurst          = 100
	logPluginPerSecond      = 100
	logPluginBurstBytes     = 256 << 10
	logPluginBytesPerSecond = 64 << 10

	// maxURILen caps the URI of a resource update, which must be one of
	// the plugin's resources or match one of its templates.
	maxURILen = 2 << 10
	// A call's resource updates: 10 at once, then 10 a second, within
	// 16 KiB at once, then 4 KiB a second; a plugin's: 50 at once, then
	// 20 a second, within 64 KiB at once, then 16 KiB a second.
	updateBurst                = 10
	updatePerSecond            = 10
	updateCallBurstBytes       = 16 << 10
	updateCallBytesPerSecond   = 4 << 10
	updatePluginBurst          = 50
	updatePluginPerSecond      = 20
	updatePluginBurstBytes     = 64 << 10
	updatePluginBytesPerSecond = 16 << 10

	maxLegacyQuestions  = 100
	defaultMaxQuestions = 9 // the go-sdk client makes 10 requests of a call
)

// pluginBudget is what one plugin may send through the host functions
// across all its instances, sessions and calls (with tenants, those of one
// tenant: see [Host.budgetOf]), so that many short calls cannot do what one
// long call may not. Budgets are keyed by plugin name, so they outlive
// reloads. It is safe for concurrent use.
type pluginBudget struct {
	mu                sync.Mutex
	logs, logBytes    tokenBucket
	updates, updBytes tokenBucket
	recordBytes       tokenBucket
}

// budgetKey names a plugin's budget for one tenant ("" without tenants).
type budgetKey struct{ plugin, tenant string }

// maxBudgets bounds the budgets kept (about 300 bytes each): past it, the
// idle ones (every bucket full again) are forgotten, and a tenant new
// while all are in use gets a budget for its call alone ([Host.budgetOf]).
const maxBudgets = 16384

// budgetOf returns the budget of the plugin named name for tenant: with
// tenants, each has its own, so that one tenant's calls cannot use up what
// a plugin may send to everyone's clients (and to the host's log), which
// each tenant's own share then bounds.
//
// Past maxBudgets, with none idle, the budget returned is new and not
// kept: the caller holds it for one call (callEnv.budget), so that what
// the tenant sends is bounded per call (and by its calls' rate and
// concurrency shares) rather than across its calls. Until stop 61 such
// tenants shared one overflow budget, so that the many subjects of one
// party, keeping the kept budgets busy, could then use up what every
// later tenant's clients were sent (the third red team's finding).
func (h *Host) budgetOf(name, tenant string) *pluginBudget {
	key := budgetKey{name, tenant}
	h.budgetMu.Lock()
	defer h.budgetMu.Unlock()
	if b := h.budgets[key]; b != nil {
		return b
	}
	if h.budgets == nil {
		h.budgets = map[budgetKey]*pluginBudget{}
	}
	if len(h.budgets) >= maxBudgets && time.Since(h.budgetSwept) >= time.Second {
		// At most once a second: while all are in use, each new
		// tenant's every call would go through them all.
		h.budgetSwept = time.Now()
		for k, b := range h.budgets {
			if b.idle() {
				delete(h.budgets, k)
			}
		}
	}
	b := &pluginBudget{
		logs:        newTokenBucket(logPluginBurst, logPluginPerSecond),
		logBytes:    newTokenBucket(logPluginBurstBytes, logPluginBytesPerSecond),
		updates:     newTokenBucket(updatePluginBurst, updatePluginPerSecond),
		updBytes:    newTokenBucket(updatePluginBurstBytes, updatePluginBytesPerSecond),
		recordBytes: newTokenBucket(recordPluginBurst, recordPluginBytesPerSecond),
	}
	if len(h.budgets) < maxBudgets {
		h.budgets[key] = b
	}
	return b
}

// idle reports whether every bucket of b is full again: forgetting b then
// changes nothing.
func (b *pluginBudget) idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, tb := range []*tokenBucket{&b.logs, &b.logBytes, &b.updates, &b.updBytes, &b.recordBytes} {
		tb.refill()
		if tb.tokens < tb.burst {
			return false
		}
	}
	return true
}

// budgetLocked is the budget of e's plugin for the tenant of e's client,
// looked up once a call: one not kept (budgetOf) lasts the call. e.mu is
// held.
func (e *callEnv) budgetLocked() *pluginBudget {
	if e.budget == nil {
		tenant := ""
		if e.h.opts.Tenants && e.req != nil {
			tenant = e.h.tenantOf(subjectOf(e.req.Extra))
		}
		e.budget = e.h.budgetOf(e.plugin.Name(), tenant)
	}
	return e.budget
}

// takeBoth takes n tokens and size bytes from both pairs of buckets, or
// nothing.
func takeBoth(count, bytes *tokenBucket, size float64) bool {
	count.refill()
	bytes.refill()
	if count.tokens < 1 || bytes.tokens < size {
		return false
	}
	count.tokens--
	bytes.tokens -= size
	return true
}

// callEnv is one tool call's link to its client: where its progress, log
// messages, records and questions go. A call that asks questions of a
// 2026-07-28 client spans several requests; the env follows the current
// one.
type callEnv struct {
	h      *Host
	tool   *plugins.Tool   // nil for a prompt, resource or completion
	plugin *plugins.Plugin // whose guest runs
	name   string          // what runs: the tool's name, or "prompt NAME", "resource URI", "completion"
	sess   string          // for logs
	ref    clientRef       // whose instances; its handle goes in the result
	// began is the number of the key's live client when the call began
	// (0 for none): whose call it is when it holds no lease (client).
	began uint64
	// once is the call's at-most-once key (see onceKey), "" for none.
	once string

	mu       sync.Mutex
	ctx      context.Context // the current request's handler context
	req      *mcp.CallToolRequest
	progress progressSender
	logs     tokenBucket // count
	logBytes tokenBucket
	dropped  int // log messages dropped by the rate limits
	droppedB int // and their bytes

	updates        tokenBucket // resource updates: count
	updateBytes    tokenBucket
	updatesDropped int // resource updates dropped by the rate limits

	records     []abi.Record
	recordBytes int

	budget *pluginBudget // the plugin's for the client's tenant (budgetLocked)

	// completions paces notify_url_elicitation_completed (urlelicit.go);
	// completionsDropped counts those refused.
	completions        tokenBucket
	completionsDropped int

	// questions carries the guest's elicitation requests to the goroutine
	// serving the client; nil for a call that runs inline.
	questions chan *question
	asked     int
	// refused counts the questions the goroutine serving the client
	// refused without asking anyone (ask, maxRefused).
	refused atomic.Int32

	relist bool // the guest said its tool list changed

	sampled int // create_message requests made

	reason string // why the guest says it needs its next grants (grant_reason)

	lease *sessions.Lease // while the guest runs
}

// attach gives the env the lease its guest runs on (nil once it is done).
func (e *callEnv) attach(l *sessions.Lease) {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.lease = l
	e.mu.Unlock()
}

func (e *callEnv) currentLease() *sessions.Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// waitForPerson runs wait, which waits for a person (a question, a
// sampling request), with the call's deadline paused (that time does not
// count against its timeout: sandbox.PauseDeadline) and its lease paused
// (it gives back its concurrency token and may be evicted meanwhile: see
// sessions.Lease.Pause). Only the wait is paused: what the host does with
// the guest's request before and after counts, as the rest of a host
// function does, and so does the wait for a concurrency token once the
// person answered: on a server that stays full, the call ends at its
// deadline rather than whenever a token comes. It reports whether wait
// ran: not when the call's time ran out as it paused, or its context was
// done already (no one is asked for a call that has ended).
func (e *callEnv) waitForPerson(ctx context.Context, wait func()) bool {
	l := e.currentLease()
	if !e.pausedFor(ctx, l, wait) {
		return false
	}
	if l != nil {
		_ = l.Resume(ctx) // a failure ends the call: its context is done
	}
	return true
}

// pausedFor runs wait with the call's deadline paused, and l's lease
// (when not nil); the deadline runs again as it returns. It reports
// whether wait ran.
func (e *callEnv) pausedFor(ctx context.Context, l *sessions.Lease, wait func()) bool {
	resume := sandbox.PauseDeadline(ctx)
	defer resume()
	if ctx.Err() != nil {
		return false
	}
	if l != nil {
		l.Pause()
	}
	wait()
	return true
}

// afterCall runs once the guest returns, while the call still holds its
// lease: a guest that said its lists changed has them read again, through
// the catalogue's one writer.
func (e *callEnv) afterCall(l *sessions.Lease) {
	if e == nil {
		return
	}
	e.mu.Lock()
	relist := e.relist
	e.relist = false
	e.mu.Unlock()
	if !relist {
		return
	}
	var err error
	if e.h.opts.Tenants {
		// Not from the caller's instance: what one tenant's calls did to
		// its own instance is not every tenant's catalogue.
		err = e.h.src.RelistFresh(l.Context(), l.Plugin())
	} else {
		err = e.h.src.Relist(l.Context(), l.Instance())
	}
	if err != nil {
		e.h.log.Warn("plugin lists not read again", "plugin", l.Plugin().Name(), "error", err)
	}
}

// question is one create_elicitation or create_message call waiting for
// its answer: params and answer for a question to the user, sampling and
// sampled for a request of the client's model.
type question struct {
	key      string // its key in a 2026-07-28 client's inputRequests
	params   *mcp.ElicitParams
	schema   []byte
	answer   chan *abi.ElicitResult
	sampling *mcp.CreateMessageParams
	sampled  chan *abi.CreateMessageResult
	roots    *mcp.ListRootsParams
	rooted   chan *mcp.ListRootsResult
	// A batch (request_inputs): several input requests asked at once,
	// under key, their keys joined with ",".
	batch     mcp.InputRequestMap
	schemas   map[string][]byte // of the batch's forms
	responses map[string]any    // the batch's answers so far
	errs      map[string]string // why a request of the batch got none
	batched   chan abi.InputResults
	// put is set once the question went to the client (sent, parked, or
	// answered ahead in the request): the person may have seen it, so
	// it counts as asked whatever comes back.
	put atomic.Bool
}

func (h *Host) newCallEnv(ctx context.Context, t *plugins.Tool, req *mcp.CallToolRequest, sess string) *callEnv {
	e := h.newRequestEnv(ctx, t.Plugin(), t.Name, req, sess)
	e.tool = t
	return e
}

// bind points e at ref, whose client e's call is, as that client is now.
func (e *callEnv) bind(ref clientRef) {
	e.ref = ref
	e.began = e.h.ses.ClientNumber(ref.key)
}

// newRequestEnv is the env of a prompt get, resource read or completion
// (name says which) of plugin p: req is that request as a tool call
// request, carrying its session, _meta and extra, which is all an env
// reads of it (see requestAsCall).
func (h *Host) newRequestEnv(ctx context.Context, p *plugins.Plugin, name string, req *mcp.CallToolRequest, sess string) *callEnv {
	e := &callEnv{h: h, plugin: p, name: name, sess: sess, ctx: ctx, req: req}
	e.logs = newTokenBucket(logBurst, logPerSecond)
	e.logBytes = newTokenBucket(logCallBurstBytes, logCallBytesPerSecond)
	e.updates = newTokenBucket(updateBurst, updatePerSecond)
	e.updateBytes = newTokenBucket(updateCallBurstBytes, updateCallBytesPerSecond)
	e.progress.init(ctx, req)
	return e
}

// requestAsCall is a request other than a tool call, seen as one by a
// callEnv: its session, its _meta (progress token, log level) and its
// HTTP extra.
func requestAsCall(ss *mcp.ServerSession, meta mcp.Meta, extra *mcp.RequestExtra) *mcp.CallToolRequest {
	return &mcp.CallToolRequest{Session: ss, Params: &mcp.CallToolParamsRaw{Meta: meta}, Extra: extra}
}

// follow points the env at the request carrying the call's next round.
func (e *callEnv) follow(ctx context.Context, req *mcp.CallToolRequest) {
	e.mu.Lock()
	e.ctx, e.req = ctx, req
	e.mu.Unlock()
	e.progress.follow(ctx, req)
}

// current returns the request the call is being served on; e may be nil
// (a call with no client, as the host benchmarks make), giving nil.
func (e *callEnv) current() (context.Context, *mcp.CallToolRequest) {
	if e == nil {
		return nil, nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ctx, e.req
}

// hostFunc serves the guest's extism:host/user calls.
func (e *callEnv) hostFunc(ctx context.Context, name string, input []byte) ([]byte, error) {
	switch name {
	case abi.FuncNotifyProgress:
		var p abi.ProgressParams
		if err := strictJSON(input, &p); err != nil {
			return nil, err
		}
		e.progress.add(&mcp.ProgressNotificationParams{Progress: p.Progress, Total: derefOr(p.Total), Message: cutString(p.Message, maxProgressMessage)})
		return nil, nil
	case abi.FuncNotifyLoggingMessage:
		var raw struct {
			Level  string          `json:"level"`
			Logger string          `json:"logger"`
			Data   json.RawMessage `json:"data"`
		}
		if err := strictJSON(input, &raw); err != nil {
			return nil, err
		}
		if len(raw.Data) > maxLogData {
			return nil, fmt.Errorf("log message refused: its data is %d bytes of JSON, over the %d-byte limit", len(raw.Data), maxLogData)
		}
		m := abi.LogMessage{Level: raw.Level, Logger: raw.Logger}
		if len(raw.Data) > 0 {
			if err := strictJSON(raw.Data, &m.Data); err != nil {
				return nil, err
			}
		}
		return nil, e.log(m, len(raw.Data))
	case abi.FuncWriteRecord:
		if err := e.writeRecord(input); err != nil {
			return []byte(err.Error()), nil
		}
		return nil, nil
	case abi.FuncCreateElicitation:
		res := e.elicit(ctx, input)
		return json.Marshal(res)
	case abi.FuncNotifyToolListChanged:
		e.mu.Lock()
		e.relist = true // read once the call ends, from this instance
		e.mu.Unlock()
		return nil, nil
	case abi.FuncNotifyPromptListChanged, abi.FuncNotifyResourceListChanged:
		e.mu.Lock()
		e.relist = true // prompts and resources are read again with the tools
		e.mu.Unlock()
		return nil, nil
	case abi.FuncCreateMessage:
		return json.Marshal(e.createMessage(ctx, input))
	case abi.FuncRequestInputs:
		return json.Marshal(e.requestInputs(ctx, input))
	case abi.FuncListRoots:
		return json.Marshal(e.listRoots(ctx))
	case abi.FuncGetKeyringSecret:
		return e.keyringSecret(ctx, input)
	case abi.FuncGrantReason:
		return nil, e.setGrantReason(input)
	case abi.FuncGetAccessToken:
		return json.Marshal(e.accessToken(ctx, input))
	case abi.FuncNotifyURLElicitationCompleted:
		var p mcp.ElicitationCompleteParams
		if err := strictJSON(input, &p); err != nil || p.ElicitationID == "" {
			return nil, fmt.Errorf(`input must be {"elicitationId": "..."}`)
		}
		return nil, e.elicitationComplete(&p)
	case abi.FuncCloseStream:
		var p abi.CloseStreamParams
		if err := strictJSON(input, &p); err != nil {
			return nil, err
		}
		if p.RetryAfterMs < 0 || p.RetryAfterMs > maxRetryAfterMs {
			return nil, fmt.Errorf("retryAfterMs %d is outside 0 to %d", p.RetryAfterMs, maxRetryAfterMs)
		}
		e.closeStream(time.Duration(cmp.Or(p.RetryAfterMs, 1000)) * time.Millisecond)
		return nil, nil
	case abi.FuncNotifyResourceUpdated:
		var p struct {
			URI string `json:"uri"`
		}
		if err := strictJSON(input, &p); err != nil || p.URI == "" {
			return nil, fmt.Errorf("input must be {\"uri\": \"...\"}")
		}
		return nil, e.resourceUpdated(p.URI)
	}
	return nil, fmt.Errorf("unknown host function")
}

// createMessage serves the guest's create_message (sampling): a client
// before 2026-07-28 that offers sampling is sent sampling/createMessage
// and the call waits for its answer. A 2026-07-28 client cannot be sent a
// request during a call: the call is parked and the client asked through
// an input-required result, as for elicitation. A client without sampling
// is refused.
func (e *callEnv) createMessage(ctx context.Context, input []byte) *abi.CreateMessageResult {
	var params mcp.CreateMessageParams
	if err := strictJSON(input, &params); err != nil {
		return &abi.CreateMessageResult{Error: err.Error()}
	}
	if len(params.Messages) == 0 {
		return &abi.CreateMessageResult{Error: "a sampling request needs messages"}
	}
	_, req := e.current()
	ss := req.Session
	ip := ss.InitializeParams()
	switch {
	case ip == nil || ip.Capabilities == nil || ip.Capabilities.Sampling == nil:
		return &abi.CreateMessageResult{Error: "the client does not offer sampling"}
	case protocolOf(req) >= sessionlessProtocol && e.questions == nil:
		// Unreachable from a tool call: a plugin that imports
		// create_message runs on a goroutine of its own (see asks).
		return &abi.CreateMessageResult{Error: "sampling is available to " + sessionlessProtocol + " clients only during a tool call"}
	}
	e.mu.Lock()
	e.sampled++
	n := e.sampled
	e.mu.Unlock()
	if n > maxLegacyQuestions {
		return &abi.CreateMessageResult{Error: fmt.Sprintf("a call may make at most %d sampling requests", maxLegacyQuestions)}
	}
	if e.questions != nil && protocolOf(req) >= sessionlessProtocol {
		// Through the goroutine serving the client, which parks the
		// call.
		q := &question{key: "q", sampling: &params, sampled: make(chan *abi.CreateMessageResult, 1)}
		if a, ok := ask(ctx, e, q, q.sampled); ok {
			return a
		}
		return &abi.CreateMessageResult{Error: "the call was cancelled"}
	}
	var res *mcp.CreateMessageResult
	var err error
	asked := e.waitForPerson(ctx, func() {
		// Withdrawn at a drain, as an elicitation is.
		actx, done := e.h.asks.add(ctx)
		defer done()
		res, err = ss.CreateMessage(actx, &params)
		if err != nil && errors.Is(context.Cause(actx), errWithdrawn) {
			err = errWithdrawn
		}
	})
	if !asked {
		return &abi.CreateMessageResult{Error: "the call was cancelled"}
	}
	if err != nil {
		return &abi.CreateMessageResult{Error: "sampling failed: " + err.Error()}
	}
	return sampledOf(res)
}

func derefOr(f *float64) float64 {
	if f == nil {
		return 0
	}
	return *f
}

// strictJSON decodes a guest's JSON input.
func strictJSON(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("input is not the expected JSON: %v", err)
	}
	return nil
}

var logLevels = map[string]slog.Level{
	"debug": slog.LevelDebug, "info": slog.LevelInfo, "notice": slog.LevelInfo,
	"warning": slog.LevelWarn, "error": slog.LevelError, "critical": slog.LevelError,
	"alert": slog.LevelError, "emergency": slog.LevelError,
}

// log sends a guest's log message to the host log and, when the client
// asked for messages of its level, to the client.
// dataLen is the length of the JSON of its data.
func (e *callEnv) log(m abi.LogMessage, dataLen int) error {
	level, ok := logLevels[m.Level]
	if !ok {
		return fmt.Errorf("unknown logging level %q: use debug, info, notice, warning, error, critical, alert or emergency", m.Level)
	}
	if len(m.Logger) > maxLoggerLen {
		return fmt.Errorf("log message refused: its logger name is %d bytes, over the %d-byte limit", len(m.Logger), maxLoggerLen)
	}
	p := e.plugin
	size := float64(dataLen + len(m.Logger) + len(m.Level))
	if !e.takeRate(&e.logs, &e.logBytes, size, func(b *pluginBudget) (*tokenBucket, *tokenBucket) { return &b.logs, &b.logBytes }) {
		e.mu.Lock()
		e.dropped++
		e.droppedB += int(size)
		e.mu.Unlock()
		return nil
	}
	e.h.log.Log(context.Background(), level, "plugin log", "plugin", p.Name(), "session", e.sess, "logger", m.Logger, "data", m.Data)
	ctx, req := e.current()
	_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: mcp.LoggingLevel(m.Level), Logger: m.Logger, Data: m.Data})
	return nil
}

// takeRate takes one message of size bytes from the call's buckets (count
// and bytes) and from the plugin's (chosen by pick), or from neither.
func (e *callEnv) takeRate(count, bytes *tokenBucket, size float64, pick func(*pluginBudget) (*tokenBucket, *tokenBucket)) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !takeBoth(count, bytes, size) {
		return false
	}
	b := e.budgetLocked()
	b.mu.Lock()
	pc, pb := pick(b)
	ok := takeBoth(pc, pb, size)
	b.mu.Unlock()
	if !ok { // give the call its tokens back
		count.tokens++
		bytes.tokens += size
	}
	return ok
}

// resourceUpdated tells the clients subscribed to uri that it changed, if
// uri is one of the plugin's resources, or matches one of its templates,
// and the rate limits allow it; updates past them are dropped and counted.
func (e *callEnv) resourceUpdated(uri string) error {
	if len(uri) > maxURILen {
		return fmt.Errorf("resource update refused: the URI is %d bytes, over the %d-byte limit", len(uri), maxURILen)
	}
	if !e.ownsResource(uri) {
		return fmt.Errorf("resource update refused: %q is not a resource of plugin %q, nor matches its resource templates", uri, e.plugin.Name())
	}
	if !e.takeRate(&e.updates, &e.updateBytes, float64(len(uri)), func(b *pluginBudget) (*tokenBucket, *tokenBucket) { return &b.updates, &b.updBytes }) {
		e.mu.Lock()
		e.updatesDropped++
		e.mu.Unlock()
		return nil
	}
	ctx, req := e.current()
	for _, s := range e.h.servers() {
		// Only a server with sessions can have subscribers (the SDK logs
		// every send, subscribers or not).
		for range s.Sessions() {
			// Params of its own for each server: the SDK writes each
			// 2026-07-28 subscriber's ID into the params' _meta.
			params := &mcp.ResourceUpdatedNotificationParams{URI: uri}
			if e.h.opts.Tenants && req != nil {
				// Whose instance changed, for watchFilter: the SDK tells
				// every session subscribed to the URI, and sends with a
				// context of its own, so it travels in the params (and
				// is taken out of them).
				params.Meta = mcp.Meta{metaUpdateFrom: e.h.tenantOf(subjectOf(req.Extra))}
			}
			_ = s.ResourceUpdated(ctx, params)
			break
		}
	}
	return nil
}

// metaUpdateFrom names, in a resource update on its way to the SDK, the
// tenant whose instance changed (with Options.Tenants); watchFilter takes
// it out before the update is sent.
const metaUpdateFrom = MetaPrefix + "updateFrom"

// ownsResource reports whether uri is one of the call's plugin's resources,
// or matches one of its resource templates.
func (e *callEnv) ownsResource(uri string) bool {
	p := e.plugin
	for _, r := range p.Resources() {
		if r.URI == uri {
			return true
		}
	}
	return p.MatchesTemplate(uri)
}

// cutString returns s cut to at most n bytes, at a character boundary.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// writeRecord keeps a record for the result and the audit log, or says why
// it cannot.
func (e *callEnv) writeRecord(input []byte) error {
	var r abi.Record
	if err := strictJSON(input, &r); err != nil {
		return err
	}
	switch {
	case r.Namespace == "" || len(r.Namespace) > maxNamespaceLen:
		return fmt.Errorf("record refused: namespace must be 1 to %d bytes", maxNamespaceLen)
	case len(r.Data) == 0 || !json.Valid(r.Data):
		return errors.New("record refused: data must be JSON")
	case len(input) > maxRecordBytes:
		return fmt.Errorf("record refused: %d bytes is over the %d-byte limit", len(input), maxRecordBytes)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case len(e.records) >= maxRecords:
		return fmt.Errorf("record refused: a call may write at most %d records", maxRecords)
	case e.recordBytes+len(input) > maxRecordCallBytes:
		return fmt.Errorf("record refused: a call's records may hold at most %d bytes", maxRecordCallBytes)
	}
	b := e.budgetLocked()
	b.mu.Lock()
	ok := b.recordBytes.takeN(float64(len(input)))
	b.mu.Unlock()
	if !ok {
		return fmt.Errorf("record refused: plugin %q may write %d bytes of records at once, then %d a second, across its calls; try later", e.plugin.Name(), recordPluginBurst, recordPluginBytesPerSecond)
	}
	e.records = append(e.records, r)
	e.recordBytes += len(input)
	return nil
}

// attachRecords puts the call's records in res's _meta, where capResult
// counts them within the result cap. e may be nil.
func (e *callEnv) attachRecords(res *mcp.CallToolResult) {
	if e == nil || res == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.records) > 0 {
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		res.Meta[MetaRecords] = slices.Clone(e.records)
	}
}

// finish flushes the call's progress and logs what the rate limits
// dropped.
func (e *callEnv) finish(res *mcp.CallToolResult) {
	e.progress.close()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dropped > 0 {
		e.h.log.Warn("plugin log messages dropped by the rate limit", "plugin", e.plugin.Name(), "session", e.sess, "dropped", e.dropped, "bytes", e.droppedB)
	}
	if e.updatesDropped > 0 {
		e.h.log.Warn("plugin resource updates dropped by the rate limit", "plugin", e.plugin.Name(), "session", e.sess, "dropped", e.updatesDropped)
	}
	if e.completionsDropped > 0 {
		e.h.log.Warn("plugin URL elicitation completions dropped", "plugin", e.plugin.Name(), "session", e.sess, "dropped", e.completionsDropped)
	}
}

// tokenBucket limits a rate, allowing bursts.
type tokenBucket struct {
	tokens, burst, rate float64
	last                time.Time
}

func newTokenBucket(burst, perSecond float64) tokenBucket {
	return tokenBucket{tokens: burst, burst: burst, rate: perSecond, last: time.Now()}
}

func (b *tokenBucket) refill() {
	now := time.Now()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
}

func (b *tokenBucket) take() bool { return b.takeN(1) }

// takeN takes n tokens, or none.
func (b *tokenBucket) takeN(n float64) bool {
	b.refill()
	if b.tokens >= n {
		b.tokens -= n
		return true
	}
	return false
}

// wait returns how long until a token is available.
func (b *tokenBucket) wait() time.Duration {
	b.refill()
	if b.tokens >= 1 {
		return 0
	}
	return time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
}

// progressSender forwards a call's progress to the client without ever
// blocking the guest: a burst goes out as it comes, past the rate limit
// updates are coalesced (the latest wins), and one goroutine sends them in
// order. Without a progress token nothing is sent. It is part of its
// callEnv, and its channels are made with its goroutine, by the first
// update: most calls send none, and each call paid for them (4 of the
// HTTP path's allocations, issue 27).
type progressSender struct {
	mu      sync.Mutex
	ctx     context.Context
	ss      *mcp.ServerSession
	token   any
	queue   []*mcp.ProgressNotificationParams
	pending *mcp.ProgressNotificationParams // coalesced past the limit
	bucket  tokenBucket
	// wake, stop and done are made with the goroutine (running), under
	// mu: whoever sees running set (under mu) sees them.
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	running bool
}

func (p *progressSender) init(ctx context.Context, req *mcp.CallToolRequest) {
	p.bucket = newTokenBucket(progressBurst, progressPerSecond)
	p.follow(ctx, req)
}

func (p *progressSender) follow(ctx context.Context, req *mcp.CallToolRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ctx, p.ss, p.token = ctx, req.Session, req.Params.GetProgressToken()
}

func (p *progressSender) add(n *mcp.ProgressNotificationParams) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.token == nil {
		return
	}
	if p.pending == nil && len(p.queue) < progressBurst && p.bucket.take() {
		p.queue = append(p.queue, n)
	} else {
		p.pending = n
	}
	if !p.running {
		p.running = true
		p.wake, p.stop, p.done = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
		go p.run()
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *progressSender) run() {
	defer close(p.done)
	for {
		p.mu.Lock()
		var n *mcp.ProgressNotificationParams
		var wait time.Duration
		switch {
		case len(p.queue) > 0:
			n, p.queue = p.queue[0], p.queue[1:]
		case p.pending != nil:
			if wait = p.bucket.wait(); wait == 0 {
				p.bucket.take()
				n, p.pending = p.pending, nil
			}
		}
		ctx, ss, token := p.ctx, p.ss, p.token
		p.mu.Unlock()
		if n != nil {
			n.ProgressToken = token
			_ = ss.NotifyProgress(ctx, n)
			continue
		}
		var timer <-chan time.Time
		if wait > 0 {
			timer = time.After(wait)
		}
		select {
		case <-p.wake:
		case <-timer:
		case <-p.stop:
			p.flush()
			return
		}
	}
}

// flush sends what is left, ignoring the rate limit: the call is over, and
// the last update (often 100%) matters most.
func (p *progressSender) flush() {
	p.mu.Lock()
	rest := p.queue
	if p.pending != nil {
		rest = append(rest, p.pending)
	}
	p.queue, p.pending = nil, nil
	ctx, ss, token := p.ctx, p.ss, p.token
	p.mu.Unlock()
	for _, n := range rest {
		n.ProgressToken = token
		_ = ss.NotifyProgress(ctx, n)
	}
}

// close sends what is left and stops the sender, before the result goes.
func (p *progressSender) close() {
	p.mu.Lock()
	started := p.stop != nil
	p.running = true // no sender starts after close
	p.mu.Unlock()
	if !started {
		return
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// maxRetryAfterMs bounds the reconnection delay a guest may ask a client
// for: longer, and a client would seem to hang.
const maxRetryAfterMs = 60_000

// closeStream ends the response stream of the request the call is being
// served on, asking the client to reconnect after retry. The go-sdk does
// it only on a 2025-11-25 HTTP session, and the host's stateful handler
// keeps an event store, so the client gets the rest of the call's
// messages on the stream it reconnects with; elsewhere it does nothing.
func (e *callEnv) closeStream(retry time.Duration) {
	_, req := e.current()
	if req == nil || req.Extra == nil || req.Extra.CloseSSEStream == nil {
		return
	}
	req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: retry})
}
