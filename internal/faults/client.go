package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The protocol eras of the suite's clients.
const (
	// Legacy is a stateful session (Mcp-Session-Id), protocol 2025-11-25.
	Legacy = "2025-11-25"
	// Modern is protocol 2026-07-28: no protocol session, a session
	// handle passed back in each call.
	Modern = "2026-07-28"
)

// The _meta keys of the contract between the host and its clients
// (docs/DEPLOY.md, "What is kept across each failure").
const (
	MetaStateReset     = "dev.wasmtools/stateReset"
	MetaNotSaved       = "dev.wasmtools/notSaved"
	MetaIdempotencyKey = "dev.wasmtools/idempotencyKey"
	MetaSession        = "dev.wasmtools/session"
)

// Op is one attempt of a client's operation, as the client saw it: what
// the checker reads.
type Op struct {
	Client  int
	Era     string
	Kind    string // "add", "list", "session" (the session was lost and replaced), "renew" (the client chose a new session)
	Note    int    // add: the note's number (unique per client)
	Attempt int    // 1 for the first attempt of an operation
	Final   bool   // the operation's last attempt: it succeeded, or the client gave up
	Start   time.Time
	End     time.Time
	Session string // the session ID or handle the attempt used
	// Plugin says which plugin of a two-plugin client the operation
	// went to: 1 or 2 (each with its own state); 0 for a client of one
	// plugin.
	Plugin int
	// Keyless: the client sends no idempotency key, so a retry after an
	// attempt that may have run may apply the write again ([Check]).
	Keyless bool

	// On success:
	Text     string // the result's text
	Reset    string // _meta stateReset's reason, if any
	NotSaved string // _meta notSaved's reason, if any
	// On failure:
	Err string // what the client was told: a JSON-RPC error, an error result, an HTTP or transport error
}

// OK says whether the attempt succeeded.
func (o *Op) OK() bool { return o.Err == "" }

// ClientOptions tune a [Client].
type ClientOptions struct {
	// AddTool and ListTool are the tools called: note_add and note_list
	// (the notes example), or slow_add and slow_list (the slownotes test
	// plugin).
	AddTool, ListTool string
	// Steps is slow_add's steps argument (0: none sent).
	Steps int
	// AttemptTimeout bounds one attempt; the client then gives up on it
	// (and cancels it) and retries. GiveUp bounds an operation's retries.
	AttemptTimeout, GiveUp time.Duration
	// Progress, if set, is called on each progress notification of a
	// call: the client's number, and the progress message.
	Progress func(client int, msg string)
	// Round, if set, is called after each of the client's rounds.
	Round func()
	// Keyless: the client sends no idempotency key with its adds (a
	// client that does not implement them): a retry may apply an add
	// twice, which [Check] allows it, and only it.
	Keyless bool
	// Second, if its AddTool is set, is a second stateful plugin the
	// client uses in the same session: its rounds go to the first and
	// the second plugin in turn, each with its own notes.
	Second Tools
}

// Tools are a second plugin's tools for [ClientOptions.Second]: AddTool
// is called with Args besides the note's text (slow_add's steps).
type Tools struct {
	AddTool, ListTool string
	Args              map[string]any
}

// Client is one client of the suite, of one era, through the proxy. It
// adds a note, reads its list, and again, recording each attempt; a
// failed attempt is retried (an add with the same idempotency key, or
// none for a Keyless client) until it succeeds or GiveUp has passed. A
// client with a Second plugin adds and reads in one plugin, then in the
// other, in the same session. Note numbers are the client's, across its
// plugins.
type Client struct {
	N    int
	Era  string
	url  string
	opts ClientOptions
	hc   *http.Client
	run  string // the suite run's tag, part of each idempotency key

	cs     *mcp.ClientSession
	handle string // Modern: the session handle
	next   int    // the next note's number
	adds   int    // notes added in the session in use
	rounds atomic.Int64
	renews []time.Time // when the client began a new session (NotesPerSession)

	mu      sync.Mutex
	history []Op
	// now is session() as of its last change, for the scenario's
	// goroutine (Run.ReplicaOf); the client's own reads session().
	now atomic.Pointer[string]
}

// noteSession publishes session() after the client's goroutine changed
// it.
func (c *Client) noteSession() {
	s := c.session()
	c.now.Store(&s)
}

// Session is the session ID or handle the client uses now, for another
// goroutine than the client's.
func (c *Client) Session() string {
	if s := c.now.Load(); s != nil {
		return *s
	}
	return ""
}

// bearer adds the token to each request.
type bearer struct{ base http.RoundTripper }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+Token)
	return b.base.RoundTrip(r)
}

// NewClient returns client n of era through the proxy at addr; it
// connects on its first operation.
func NewClient(n int, era, addr, run string, opts ClientOptions) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &Client{N: n, Era: era, url: "http://" + addr + "/mcp", opts: opts, run: run, next: 1,
		hc: &http.Client{Transport: bearer{tr}}}
}

// Rounds is how many add-then-list rounds the client completed.
func (c *Client) Rounds() int64 { return c.rounds.Load() }

// Renewed returns when the client began each new session of its own
// (NotesPerSession). Read it once the client's Run has returned.
func (c *Client) Renewed() []time.Time { return c.renews }

// History returns the client's attempts so far.
func (c *Client) History() []Op {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Op(nil), c.history...)
}

func (c *Client) record(op Op) {
	if os.Getenv("FAULTS_VERBOSE") == "2" {
		fmt.Fprintf(os.Stderr, "client %d %s %s n%d #%d p%d keyless=%v: %q %q err=%q reset=%q\n", op.Client, op.Era, op.Kind, op.Note, op.Attempt, op.Plugin, op.Keyless, op.Session, op.Text, op.Err, op.Reset)
	}
	c.mu.Lock()
	c.history = append(c.history, op)
	c.mu.Unlock()
}

// NotesPerSession is how many notes a client adds in one session before
// it begins a new one. The notes plugin holds 1000 and refuses more (an
// add the checker rightly counts as given up), and a scenario's length is
// set in faults and rounds, not in notes: on a fast machine a client
// would fill its notepad (issue #27's cheaper checkpoints made a run of
// sigstop-replica go past 1000 notes a client). Well below the plugin's
// bound, so that every scenario's faults also meet sessions being made
// (one client's new session on a replica killed just after its
// initialize found a session the store did not have).
const NotesPerSession = 200

// Run adds and lists until stop is closed (finishing the operation under
// way), then closes its session. After NotesPerSession notes in a session it
// begins a new one.
func (c *Client) Run(ctx context.Context, stop <-chan struct{}) {
	defer func() {
		if c.cs != nil {
			c.cs.Close()
		}
	}()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		if c.adds == NotesPerSession {
			c.renew()
		}
		plugin := 0
		if c.opts.Second.AddTool != "" {
			plugin = 1 + int(c.rounds.Load()%2)
		}
		c.operation(ctx, "add", plugin)
		c.operation(ctx, "list", plugin)
		c.rounds.Add(1)
		if c.opts.Round != nil {
			c.opts.Round()
		}
	}
}

// connect opens the client's MCP session. A Legacy client whose earlier
// session broke has lost it: that is recorded (Kind "session").
func (c *Client) connect(ctx context.Context) error {
	protocol := Legacy
	if c.Era == Modern {
		protocol = "" // the go-sdk client's default, 2026-07-28
	}
	opts := &mcp.ClientOptions{}
	if c.opts.Progress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			c.opts.Progress(c.N, req.Params.Message)
		}
	}
	tr := &mcp.StreamableClientTransport{Endpoint: c.url, HTTPClient: c.hc}
	cctx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "faults", Version: "1"}, opts).Connect(cctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if c.Era == Modern {
		// The client learns the session argument's header (SEP-2243).
		if _, err := cs.ListTools(cctx, nil); err != nil {
			cs.Close()
			return fmt.Errorf("tools/list: %w", err)
		}
	}
	c.cs = cs
	c.noteSession()
	return nil
}

// renew leaves the session in use for a new, empty one, and records it
// (Kind "renew"), so that the checker expects no note of the old one. A
// Legacy client ends its session (DELETE) in the background: a replica
// that is stopped must not hold the client up. A Modern client drops its
// handle, and the next call is given a new one.
func (c *Client) renew() {
	now := time.Now()
	c.record(Op{Client: c.N, Era: c.Era, Kind: "renew", Start: now, End: now, Session: c.session()})
	c.renews = append(c.renews, now)
	c.adds = 0
	c.handle = ""
	if c.Era == Legacy && c.cs != nil {
		go c.cs.Close()
		c.cs = nil
	}
	c.noteSession()
}

// session is the session ID or handle the client uses now.
func (c *Client) session() string {
	if c.Era == Modern {
		return c.handle
	}
	if c.cs != nil {
		return c.cs.ID()
	}
	return ""
}

var savedRE = regexp.MustCompile(`^note (\d+) saved`)

// operation runs one add (of note c.next) or list, with its retries, in
// plugin (0 for a client of one plugin, else 1 or 2).
func (c *Client) operation(ctx context.Context, kind string, plugin int) {
	note := 0
	args := map[string]any{}
	meta := mcp.Meta{}
	tool := c.opts.ListTool
	if plugin == 2 {
		tool = c.opts.Second.ListTool
	}
	if kind == "add" {
		note = c.next
		c.next++
		c.adds++
		args["text"] = fmt.Sprintf("c%d-n%d", c.N, note)
		tool = c.opts.AddTool
		if plugin == 2 {
			tool = c.opts.Second.AddTool
			for k, v := range c.opts.Second.Args {
				args[k] = v
			}
		} else if c.opts.Steps > 0 {
			args["steps"] = c.opts.Steps
		}
		if !c.opts.Keyless {
			meta[MetaIdempotencyKey] = fmt.Sprintf("%s.c%d.n%d", c.run, c.N, note)
		}
	}
	first := time.Now()
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		op := Op{Client: c.N, Era: c.Era, Kind: kind, Note: note, Attempt: attempt, Plugin: plugin, Keyless: c.opts.Keyless, Start: time.Now()}
		c.attempt(ctx, tool, args, meta, &op)
		op.End = time.Now()
		op.Final = op.OK() || op.End.Sub(first) > c.opts.GiveUp || ctx.Err() != nil
		c.record(op)
		if op.Final {
			return
		}
		select {
		case <-time.After(backoff): // a client's backoff between retries
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// attempt makes one call, filling op with what the client was told.
func (c *Client) attempt(ctx context.Context, tool string, args map[string]any, meta mcp.Meta, op *Op) {
	if c.cs == nil {
		if err := c.connect(ctx); err != nil {
			op.Err = err.Error()
			return
		}
	}
	op.Session = c.session()
	a := map[string]any{}
	for k, v := range args {
		a[k] = v
	}
	if c.Era == Modern && c.handle != "" {
		a["wasmtools_session"] = c.handle
	}
	params := &mcp.CallToolParams{Name: tool, Arguments: a, Meta: mcp.Meta{}}
	for k, v := range meta {
		params.Meta[k] = v
	}
	if c.Era == Modern {
		// A client that handles handles itself: no note for the model
		// in the results.
		params.Meta[MetaSession] = c.handle
	}
	if c.opts.Progress != nil {
		params.SetProgressToken(fmt.Sprintf("c%d", c.N))
	}
	actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	res, err := c.cs.CallTool(actx, params)
	cancel()
	if err != nil {
		op.Err = describe(err)
		if broken(err) {
			c.lost(ctx, op.Err)
		}
		return
	}
	if h, _ := res.Meta[MetaSession].(string); c.Era == Modern && h != "" && h != c.handle {
		if c.handle != "" && res.IsError {
			// The handle was refused and a new one offered: the state
			// it named is gone.
			c.record(Op{Client: c.N, Era: c.Era, Kind: "session", Start: op.Start, End: time.Now(), Session: c.handle,
				Err: "handle refused: " + text(res)})
		}
		c.handle = h
		c.noteSession()
	}
	// A failure may say the state was reset too (a call whose write met
	// the store's loss of its record).
	op.Reset = reason(res.Meta[MetaStateReset])
	if res.IsError {
		op.Err = "error result: " + text(res)
		return
	}
	op.Text = text(res)
	op.NotSaved = reason(res.Meta[MetaNotSaved])
}

// lost handles a client connection that broke: a Legacy session is gone
// with it (recorded), a Modern client keeps its handle.
func (c *Client) lost(ctx context.Context, why string) {
	old := c.session()
	c.cs.Close()
	c.cs = nil
	c.noteSession()
	if c.Era == Legacy {
		c.record(Op{Client: c.N, Era: c.Era, Kind: "session", Start: time.Now(), End: time.Now(), Session: old, Err: why})
	}
}

// broken says whether err ended the client's connection (the go-sdk
// client then fails every later call): a 404 for its session, a stream
// that could not be resumed, a body that could not be read.
func broken(err error) bool {
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing) {
		return true
	}
	var werr *jsonrpc.Error
	if errors.As(err, &werr) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "failed to reconnect") || strings.Contains(s, "failed to read body") ||
		strings.Contains(s, "failed to decode") || strings.Contains(s, "exceeded") || strings.Contains(s, "connection closed") ||
		strings.Contains(s, "mismatching session")
}

// jsonrpc2Rejected is the code of the go-sdk's jsonrpc2.ErrRejected, which
// its client wraps around a POST that failed, or was answered an HTTP 500,
// 502, 503, 504 or 429 without a JSON-RPC error in the body;
// rejectedByTransport begins such a failure's description.
const (
	jsonrpc2Rejected    = -32005
	rejectedByTransport = "JSON-RPC error -32005 (an HTTP error): "
)

// describe says what kind of failure err is, and what it said.
func describe(err error) string {
	var werr *jsonrpc.Error
	switch {
	case errors.As(err, &werr) && werr.Code == jsonrpc2Rejected:
		// An HTTP error (see [FailureKind]): the whole error says which.
		return rejectedByTransport + err.Error()
	case errors.As(err, &werr):
		return fmt.Sprintf("JSON-RPC error %d: %s", werr.Code, werr.Message)
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout (the client gave up on the attempt)"
	}
	return "transport: " + err.Error()
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, b := range res.Content {
		if tc, ok := b.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// reason is a _meta mark's reason ("?" for a mark without one), "" for
// no mark.
func reason(v any) string {
	if v == nil {
		return ""
	}
	if m, ok := v.(map[string]any); ok {
		if r, ok := m["reason"].(string); ok && r != "" {
			return r
		}
	}
	return "?"
}

// savedNumber parses an add's result, "note N saved".
func savedNumber(s string) (int, bool) {
	m := savedRE.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}
