package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// MetaRecords is the _meta key under which a result carries the records its
// call wrote, in order: [{"namespace": "...", "data": ...}, ...].
const MetaRecords = MetaPrefix + "records"

// Limits on what one call may send through the host functions.
const (
	maxRecords          = 100
	maxRecordBytes      = 64 << 10
	maxRecordCallBytes  = 1 << 20
	maxNamespaceLen     = 128
	progressBurst       = 10
	progressPerSecond   = 20
	logBurst            = 20
	logPerSecond        = 50
	maxLegacyQuestions  = 100
	defaultMaxQuestions = 9 // the go-sdk client makes 10 requests of a call
)

// callEnv is one tool call's link to its client: where its progress, log
// messages, records and questions go. A call that asks questions of a
// 2026-07-28 client spans several requests; the env follows the current
// one.
type callEnv struct {
	h    *Host
	tool *plugins.Tool
	sess string // for logs

	mu       sync.Mutex
	ctx      context.Context // the current request's handler context
	req      *mcp.CallToolRequest
	progress *progressSender
	logs     tokenBucket
	dropped  int // log messages dropped by the rate limit

	records     []abi.Record
	recordBytes int

	// questions carries the guest's elicitation requests to the goroutine
	// serving the client; nil for a call that runs inline.
	questions chan *question
	asked     int

	relist bool // the guest said its tool list changed

	sampled int // create_message requests made

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
// sampling request), with the call's lease paused: it gives back its
// concurrency token and may be evicted meanwhile (see sessions.Lease.Pause).
func (e *callEnv) waitForPerson(ctx context.Context, wait func()) {
	l := e.currentLease()
	if l == nil {
		wait()
		return
	}
	l.Pause()
	wait()
	_ = l.Resume(ctx) // a failure ends the call: its context is done
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
	if err := e.h.src.Relist(l.Context(), l.Instance()); err != nil {
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
}

func (h *Host) newCallEnv(ctx context.Context, t *plugins.Tool, req *mcp.CallToolRequest, sess string) *callEnv {
	e := &callEnv{h: h, tool: t, sess: sess, ctx: ctx, req: req}
	e.logs = newTokenBucket(logBurst, logPerSecond)
	e.progress = newProgressSender(ctx, req)
	return e
}

// follow points the env at the request carrying the call's next round.
func (e *callEnv) follow(ctx context.Context, req *mcp.CallToolRequest) {
	e.mu.Lock()
	e.ctx, e.req = ctx, req
	e.mu.Unlock()
	e.progress.follow(ctx, req)
}

func (e *callEnv) current() (context.Context, *mcp.CallToolRequest) {
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
		e.progress.add(&mcp.ProgressNotificationParams{Progress: p.Progress, Total: derefOr(p.Total), Message: p.Message})
		return nil, nil
	case abi.FuncNotifyLoggingMessage:
		var m abi.LogMessage
		if err := strictJSON(input, &m); err != nil {
			return nil, err
		}
		return nil, e.log(m)
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
	case abi.FuncNotifyResourceUpdated:
		var p struct {
			URI string `json:"uri"`
		}
		if err := strictJSON(input, &p); err != nil || p.URI == "" {
			return nil, fmt.Errorf("input must be {\"uri\": \"...\"}")
		}
		ctx, _ := e.current()
		_ = e.h.server.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: p.URI})
		return nil, nil
	}
	return nil, fmt.Errorf("unknown host function")
}

// createMessage serves the guest's create_message (sampling): a client
// before 2026-07-28 that offers sampling is sent sampling/createMessage
// and the call waits for its answer. A 2026-07-28 client cannot be sent a
// request during a call: the call is parked and the client asked through
// an input-required result, as for elicitation, when the guest runs on a
// goroutine of its own (it imports create_elicitation); otherwise, and for
// a client without sampling, the request is refused.
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
		return &abi.CreateMessageResult{Error: "sampling is available to " + sessionlessProtocol + " clients only to a plugin that imports create_elicitation"}
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
		a := &abi.CreateMessageResult{Error: "the call was cancelled"}
		e.waitForPerson(ctx, func() {
			select {
			case e.questions <- q:
			case <-ctx.Done():
				return
			}
			select {
			case a = <-q.sampled:
			case <-ctx.Done():
			}
		})
		return a
	}
	var res *mcp.CreateMessageResult
	var err error
	e.waitForPerson(ctx, func() { res, err = ss.CreateMessage(ctx, &params) })
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
func (e *callEnv) log(m abi.LogMessage) error {
	level, ok := logLevels[m.Level]
	if !ok {
		return fmt.Errorf("unknown logging level %q: use debug, info, notice, warning, error, critical, alert or emergency", m.Level)
	}
	if !e.logs.take() {
		e.mu.Lock()
		e.dropped++
		e.mu.Unlock()
		return nil
	}
	p := e.tool.Plugin()
	e.h.log.Log(context.Background(), level, "plugin log", "plugin", p.Name(), "session", e.sess, "logger", m.Logger, "data", m.Data)
	ctx, req := e.current()
	_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: mcp.LoggingLevel(m.Level), Logger: m.Logger, Data: m.Data})
	return nil
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
	e.records = append(e.records, r)
	e.recordBytes += len(input)
	return nil
}

// finish flushes the call's progress and attaches its records to res.
func (e *callEnv) finish(res *mcp.CallToolResult) {
	e.progress.close()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dropped > 0 {
		e.h.log.Warn("plugin log messages dropped by the rate limit", "plugin", e.tool.Plugin().Name(), "session", e.sess, "dropped", e.dropped)
	}
	if res != nil && len(e.records) > 0 {
		if res.Meta == nil {
			res.Meta = mcp.Meta{}
		}
		res.Meta[MetaRecords] = e.records
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

func (b *tokenBucket) take() bool {
	b.refill()
	if b.tokens >= 1 {
		b.tokens--
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
// order. Without a progress token nothing is sent.
type progressSender struct {
	mu      sync.Mutex
	ctx     context.Context
	ss      *mcp.ServerSession
	token   any
	queue   []*mcp.ProgressNotificationParams
	pending *mcp.ProgressNotificationParams // coalesced past the limit
	bucket  tokenBucket
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	running bool
}

func newProgressSender(ctx context.Context, req *mcp.CallToolRequest) *progressSender {
	p := &progressSender{bucket: newTokenBucket(progressBurst, progressPerSecond), wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	p.follow(ctx, req)
	return p
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
	running := p.running
	p.running = true // no sender starts after close
	p.mu.Unlock()
	if !running {
		return
	}
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}
