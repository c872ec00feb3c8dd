package host

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TasksExtension is the MCP extension (SEP-2663) under which the host
// answers a tool call with a task the client polls, instead of holding
// the request until the result.
const TasksExtension = "io.modelcontextprotocol/tasks"

// Defaults of the tasks' bounds (see [Options]).
const (
	// DefaultMaxTasksPerClient bounds the tasks one client holds, running
	// or finished and not yet expired.
	DefaultMaxTasksPerClient = 16
	// DefaultMaxTasks bounds the tasks of all clients.
	DefaultMaxTasks = 256
	// DefaultTaskTTL is how long a task is kept from its creation: a
	// task still running then is cancelled, a finished one forgotten.
	DefaultTaskTTL = time.Hour
)

// Bounds of the bytes tasks hold: a running task its call's arguments
// (up to the request body limit), a finished one its result (within the
// result cap) or error. Past a bound (after forgetting the client's
// oldest finished tasks) a new task is refused.
const (
	// DefaultMaxTaskBytesPerClient is the default of
	// [Options.MaxTaskBytesPerClient].
	DefaultMaxTaskBytesPerClient = 16 << 20
	taskBytesTotal               = 128 << 20
)

// taskPollInterval is the poll hint of every task (pollIntervalMs).
const taskPollInterval = 500 * time.Millisecond

// Task statuses (SEP-2663).
const (
	taskWorking       = "working"
	taskInputRequired = "input_required"
	taskCompleted     = "completed"
	taskFailed        = "failed"
	taskCancelled     = "cancelled"
)

// task is one tool call served as a task: its driver goroutine runs the
// call through the server's own tools/call handler, as a client would,
// and when the call stops for input (an input-required result) the task
// waits in input_required until tasks/update brings the answers; the
// driver then retries the call with them and the echoed request state.
// Every field but the immutable ones is guarded by the store's mu.
type task struct {
	id, owner string
	created   time.Time
	ttl       time.Duration
	cancel    context.CancelFunc
	expire    *time.Timer

	bytes    int // counted against the bounds: arguments, then result
	updated  time.Time
	status   string
	result   *mcp.CallToolResult // completed
	err      *jsonrpc.Error      // failed
	inputs   mcp.InputRequestMap // input_required: still unanswered
	state    string              // input_required: the call's request state
	answered mcp.InputResponseMap
	retry    *mcp.CallToolRequest // the request the driver retries
}

// taskStore owns the tasks of a host: creation within the bounds, lookup
// by owner, expiry. One mutex guards it and every task's mutable fields.
type taskStore struct {
	h      *Host
	boot   string // this process's tag in task IDs: a restart changes it
	mu     sync.Mutex
	tasks  map[string]*task
	owners map[string]*ownerUse    // owner -> what its tasks hold
	pools  map[string]*ownerUse    // poolOf(owner) -> what its tasks hold
	bytes  int                     // held by all tasks
	wakes  map[*task]chan struct{} // closed at a task's next update
}

func newTaskStore(h *Host) *taskStore {
	var b [6]byte
	rand.Read(b[:])
	return &taskStore{h: h, boot: hex.EncodeToString(b[:]), tasks: map[string]*task{}, owners: map[string]*ownerUse{}, pools: map[string]*ownerUse{}, wakes: map[*task]chan struct{}{}}
}

// count is the number of tasks held.
func (s *taskStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.tasks)
}

// ErrTask is matched by the refusal of a task ID: unknown, another
// client's, expired, or from before a restart.
var ErrTask = errors.New("unknown task")

// errTooManyTasks is the refusal of a task past a bound.
var errTooManyTasks = errors.New("too many tasks")

// newID mints a task ID: "[<replica>.]t1.<boot>.<random>.<mac>". The
// replica's name first lets a proxy route the task's requests (their
// Mcp-Name header) to the replica that runs it, as it routes sessions. The
// MAC, under the host's state key, says the ID is this server's; the boot
// tag says whether it is this process's, so that an ID from before a
// restart, or from another replica, is refused as such, not as unknown.
func (s *taskStore) newID() string {
	var r [16]byte
	rand.Read(r[:])
	body := s.h.replicaPrefix() + "t1." + s.boot + "." + hex.EncodeToString(r[:])
	return body + "." + s.mac(body)
}

func (s *taskStore) mac(body string) string {
	m := hmac.New(sha256.New, s.h.stateKey)
	m.Write([]byte("wasmtools task\x00" + body))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// lookupLocked returns owner's task id, or an error matching [ErrTask] that
// says why there is none. Another owner's task is reported as unknown.
// s.mu is held.
func (s *taskStore) lookupLocked(id, owner string) (*task, error) {
	if t, ok := s.tasks[id]; ok && t.owner == owner {
		return t, nil
	}
	if len(id) > 128 {
		return nil, fmt.Errorf("%w: the task ID is not one of this server's", ErrTask)
	}
	f := strings.Split(id, ".")
	replica := ""
	if len(f) == 5 {
		replica, f = f[0], f[1:]
	}
	if len(f) == 4 && f[0] == "t1" && hmac.Equal([]byte(f[3]), []byte(s.mac(id[:strings.LastIndexByte(id, '.')]))) && (f[1] != s.boot || replica != s.h.opts.Replica) {
		if replica != "" && replica != s.h.opts.Replica {
			return nil, fmt.Errorf("%w %q: it runs on replica %q, and a task does not move between replicas (its guest runs there); this request reached another one, so that replica is gone or out of rotation: call the tool again", ErrTask, id, replica)
		}
		return nil, fmt.Errorf("%w %q: it was created before the server restarted, and tasks do not survive a restart: call the tool again", ErrTask, id)
	}
	return nil, fmt.Errorf("%w %q: no such task (expired, never created, or created before the server restarted: tasks do not survive a restart)", ErrTask, id)
}

func (h *Host) maxTasksPerClient() int {
	if h.opts.MaxTasksPerClient > 0 {
		return h.opts.MaxTasksPerClient
	}
	return DefaultMaxTasksPerClient
}

func (h *Host) maxTasks() int {
	if h.opts.MaxTasks > 0 {
		return h.opts.MaxTasks
	}
	return DefaultMaxTasks
}

func (h *Host) maxAnonymousTasks() int {
	if h.opts.MaxAnonymousTasks > 0 {
		return h.opts.MaxAnonymousTasks
	}
	return 2 * h.maxTasksPerClient()
}

// anonymousPool is the pool of the owners that are no subject's.
const anonymousPool = "anonymous-pool"

// poolOf is the share an owner's tasks count against: a subject's own,
// or the one pool of every client without a subject; "" (no pool but the
// server's bounds) without [Options.Tenants].
func (s *taskStore) poolOf(owner string) string {
	if !s.h.opts.Tenants {
		return ""
	}
	if strings.HasPrefix(owner, "subject:") {
		return owner
	}
	return anonymousPool
}

func (h *Host) maxTaskBytesPerClient() int {
	if h.opts.MaxTaskBytesPerClient > 0 {
		return h.opts.MaxTaskBytesPerClient
	}
	return DefaultMaxTaskBytesPerClient
}

func (h *Host) taskTTL() time.Duration {
	if h.opts.TaskTTL > 0 {
		return h.opts.TaskTTL
	}
	return DefaultTaskTTL
}

// ownerUse is what one owner's tasks hold.
type ownerUse struct{ tasks, bytes int }

// add registers a new task of owner, holding size bytes (its request),
// within the bounds: past a bound the owner's oldest finished tasks are
// forgotten first, and with none left the task is refused.
func (s *taskStore) add(owner string, size int, cancel context.CancelFunc) (*task, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pool := s.poolOf(owner)
	use := func(m map[string]*ownerUse, k string) ownerUse {
		if u := m[k]; u != nil {
			return *u
		}
		return ownerUse{}
	}
	for {
		u, pu := use(s.owners, owner), use(s.pools, pool)
		var over error
		switch {
		case owner == sharedOwner && u.tasks >= s.h.maxTasksPerClient():
			over = fmt.Errorf("%w: the clients with no subject, session or client header, together, hold the most tasks they may, %d; authenticate, or wait", errTooManyTasks, s.h.maxTasksPerClient())
		case u.tasks >= s.h.maxTasksPerClient():
			over = fmt.Errorf("%w: the client holds %d tasks, the most it may; cancel one or wait for one to finish", errTooManyTasks, u.tasks)
		case pool == anonymousPool && pu.tasks >= s.h.maxAnonymousTasks():
			// (only with Tenants: the clients without a subject together)
			over = fmt.Errorf("%w: clients without a subject hold the most tasks they may together; authenticate, or wait", errTooManyTasks)
		case pool == anonymousPool && pu.bytes+size > 2*s.h.maxTaskBytesPerClient():
			over = fmt.Errorf("%w: clients without a subject hold the most bytes in tasks they may together", errTooManyTasks)
		case len(s.tasks) >= s.h.maxTasks():
			over = sessions.ServerFull(errTooManyTasks, "the tasks")
		case owner == sharedOwner && u.bytes+size > s.h.maxTaskBytesPerClient():
			over = fmt.Errorf("%w: the tasks of the clients with no subject, session or client header, together, would hold more than the most they may, %d bytes; authenticate, or wait", errTooManyTasks, s.h.maxTaskBytesPerClient())
		case u.bytes+size > s.h.maxTaskBytesPerClient():
			over = fmt.Errorf("%w: the client's tasks hold %d bytes, and this one's request %d; the most is %d", errTooManyTasks, u.bytes, size, s.h.maxTaskBytesPerClient())
		case s.bytes+size > taskBytesTotal:
			over = sessions.ServerFull(errTooManyTasks, "the bytes of tasks")
		}
		if over == nil {
			break
		}
		if s.dropOldestFinishedLocked(owner, nil) {
			continue
		}
		// Past the server's bounds with none of its own finished: the
		// owner holding the most tasks gives a finished one up, so that
		// clients who left their results unread for the hour cannot
		// keep everyone else out (a red team, stop 64).
		// (Only when the server's bounds alone are passed: a client at
		// its own, or its pool's, would be refused all the same, and
		// another's result lost for nothing: a review, stop 64.)
		clientOver := u.tasks >= s.h.maxTasksPerClient() || u.bytes+size > s.h.maxTaskBytesPerClient() ||
			pool == anonymousPool && (pu.tasks >= s.h.maxAnonymousTasks() || pu.bytes+size > 2*s.h.maxTaskBytesPerClient())
		if clientOver || !s.dropOldestFinishedLocked(s.largestOwnerLocked(), nil) {
			return nil, over
		}
	}
	now := time.Now()
	t := &task{id: s.newID(), owner: owner, created: now, updated: now, ttl: s.h.taskTTL(), cancel: cancel, status: taskWorking}
	s.tasks[t.id] = t
	if s.owners[owner] == nil {
		s.owners[owner] = &ownerUse{}
	}
	s.owners[owner].tasks++
	if s.pools[pool] == nil {
		s.pools[pool] = &ownerUse{}
	}
	s.pools[pool].tasks++
	s.resizeLocked(t, size)
	t.expire = time.AfterFunc(t.ttl, func() { s.expire(t) })
	return t, nil
}

// finishedLocked counts t, just finished, as holding its result or error
// (held): a result is bounded by the result cap alone, and was never
// checked against the task bounds, which add checks only for the
// arguments. Past a bound, t's owner's oldest finished tasks are
// forgotten, t spared, as add would forget them for a new task (a
// review, stop 57: a client's results were held past its bound until
// its next task). s.mu is held.
func (s *taskStore) finishedLocked(t *task, held int) {
	if s.tasks[t.id] != t {
		return
	}
	s.resizeLocked(t, held)
	for s.overLocked(t.owner) && s.dropOldestFinishedLocked(t.owner, t) {
	}
}

// overLocked reports whether owner's tasks, its pool's or the server's
// hold more bytes than they may. s.mu is held.
func (s *taskStore) overLocked(owner string) bool {
	max := s.h.maxTaskBytesPerClient()
	if u := s.owners[owner]; u != nil && u.bytes > max {
		return true
	}
	if pool := s.poolOf(owner); pool == anonymousPool {
		if pu := s.pools[pool]; pu != nil && pu.bytes > 2*max {
			return true
		}
	}
	return s.bytes > taskBytesTotal
}

// resizeLocked sets what t holds to size bytes. s.mu is held.
func (s *taskStore) resizeLocked(t *task, size int) {
	if u := s.owners[t.owner]; u != nil {
		u.bytes += size - t.bytes
	}
	if u := s.pools[s.poolOf(t.owner)]; u != nil {
		u.bytes += size - t.bytes
	}
	s.bytes += size - t.bytes
	t.bytes = size
}

// largestOwnerLocked is the owner holding the most finished tasks ("" for
// none). s.mu is held.
func (s *taskStore) largestOwnerLocked() string {
	finished := map[string]int{}
	most := ""
	for _, t := range s.tasks {
		if terminal(t.status) {
			finished[t.owner]++
			if n := finished[t.owner]; most == "" || n > finished[most] || n == finished[most] && t.owner < most {
				most = t.owner
			}
		}
	}
	return most
}

// dropOldestFinishedLocked forgets owner's oldest finished task but
// spare (nil: none), and reports whether there was one. s.mu is held.
func (s *taskStore) dropOldestFinishedLocked(owner string, spare *task) bool {
	var oldest *task
	for _, t := range s.tasks {
		if t.owner == owner && t != spare && terminal(t.status) && (oldest == nil || t.created.Before(oldest.created)) {
			oldest = t
		}
	}
	if oldest == nil {
		return false
	}
	s.removeLocked(oldest)
	return true
}

func (s *taskStore) removeLocked(t *task) {
	if s.tasks[t.id] != t {
		return
	}
	delete(s.tasks, t.id)
	s.notifyLocked(t)
	s.resizeLocked(t, 0)
	if u := s.owners[t.owner]; u != nil {
		if u.tasks--; u.tasks <= 0 {
			delete(s.owners, t.owner)
		}
	}
	if u := s.pools[s.poolOf(t.owner)]; u != nil {
		if u.tasks--; u.tasks <= 0 {
			delete(s.pools, s.poolOf(t.owner))
		}
	}
	t.expire.Stop()
}

// ownerEnded forgets owner's tasks, its transport session having ended:
// no request can name that owner again, so they would hold the bounds
// for their hour, read by no one (a red team, stop 64). Running ones are
// cancelled, their guests stopped.
func (h *Host) ownerEnded(owner string) {
	s := h.tasks
	s.mu.Lock()
	var ended []*task
	for _, t := range s.tasks {
		if t.owner == owner {
			if !terminal(t.status) {
				t.status, t.updated = taskCancelled, time.Now()
			}
			s.removeLocked(t)
			ended = append(ended, t)
		}
	}
	s.mu.Unlock()
	for _, t := range ended {
		t.cancel()
		h.abandonParked(t)
	}
}

// expire ends a task at its TTL: a running one is cancelled (its guest
// stopped, its instance reset), and it is forgotten.
func (s *taskStore) expire(t *task) {
	s.mu.Lock()
	s.removeLocked(t)
	s.mu.Unlock()
	t.cancel()
}

func terminal(status string) bool {
	return status == taskCompleted || status == taskFailed || status == taskCancelled
}

// closeAll cancels every task (the host is closing).
func (s *taskStore) closeAll() {
	s.mu.Lock()
	var all []*task
	for _, t := range s.tasks {
		all = append(all, t)
		s.removeLocked(t)
	}
	s.mu.Unlock()
	for _, t := range all {
		t.cancel()
	}
}

// taskOwner is who a request's tasks belong to: the authenticated
// subject, else the transport session, else the operator's client
// header; else no one in particular, and such clients share one bound
// (they cannot be told apart), each task protected by its unguessable ID.
func (h *Host) taskOwner(ss *mcp.ServerSession, extra *mcp.RequestExtra) string {
	if s := subjectOf(extra); s != "" {
		return "subject:" + s
	}
	if ss != nil && !sessionless(ss, extra) {
		return "session:" + h.connKey(ss).String()
	}
	if hdr := h.opts.ClientKeyHeader; hdr != "" && extra != nil {
		if v := extra.Header.Get(hdr); v != "" {
			return "client:" + v // a subject's requests are the subject's, above
		}
	}
	return sharedOwner
}

// sharedOwner owns the tasks of the clients taskOwner cannot tell apart:
// a refusal past its bounds says the bound, never what it holds, which
// is the other such clients' tasks (TestSharedTaskOwnerRefusalTellsNoUse).
const sharedOwner = "anonymous"

// wantsTask reports whether a tools/call becomes a task: the tool says
// it may run as one (execution.taskSupport "optional" or "required") and
// the request's client declared the extension. A retried round of an
// input-required call stays what it was, but for a tool that becomes a
// task after input (execution.wasmtools_taskAfterInput): its first round
// is a plain call, and the retry that answers it becomes the task.
func (h *Host) wantsTask(req *mcp.CallToolRequest) bool {
	if req.Params == nil {
		return false
	}
	cat := h.Catalogue()
	if cat == nil {
		return false
	}
	t, ok := cat.Tool(req.Params.Name)
	if !ok || t.Def.Execution == nil {
		return false
	}
	if t.Def.Execution.TaskAfterInput != (req.Params.RequestState != "") {
		return false
	}
	switch t.Def.Execution.TaskSupport {
	case abi.TaskOptional, abi.TaskRequired:
		// Read last: the go-sdk decodes the client's capabilities from
		// the request's _meta on each read (32 KiB of buffers a call).
		return declaresTasks(req.ClientCapabilities())
	}
	return false
}

func declaresTasks(caps *mcp.ClientCapabilities) bool {
	if caps == nil {
		return false
	}
	_, ok := caps.Extensions[TasksExtension]
	return ok
}

// taskMiddleware answers a tools/call that becomes a task (see wantsTask)
// with the task's handle at once, and runs the call on a goroutine of its
// own, detached from the request: the task outlives the client's
// disconnect. It also checks the routing header of the tasks methods.
func (h *Host) taskMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "tools/call":
			r, ok := req.(*mcp.CallToolRequest)
			if !ok || !h.wantsTask(r) {
				return next(ctx, method, req)
			}
			return h.startTask(ctx, next, r)
		case methodTasksGet, methodTasksUpdate, methodTasksCancel:
			if err := checkTaskHeader(req); err != nil {
				return nil, err
			}
			return next(context.WithValue(ctx, taskOwnerKey{}, h.taskOwner(sessionOf(req), req.GetExtra())), method, req)
		}
		return next(ctx, method, req)
	}
}

type taskOwnerKey struct{}

func sessionOf(req mcp.Request) *mcp.ServerSession {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	return ss
}

// checkTaskHeader refuses a tasks request whose Mcp-Name header (SEP-2663
// routing) names another task than its body; a request without the
// header is served.
func checkTaskHeader(req mcp.Request) error {
	extra := req.GetExtra()
	if extra == nil || extra.Header == nil {
		return nil
	}
	name := strings.TrimSpace(extra.Header.Get("Mcp-Name"))
	if name == "" {
		return nil
	}
	p, ok := req.GetParams().(*taskParams)
	if ok && p.TaskID == name {
		return nil
	}
	return &jsonrpc.Error{Code: mcp.CodeHeaderMismatch, Message: "the Mcp-Name header does not match params.taskId"}
}

// startTask registers the task, starts its driver and returns its handle.
// The task is in the store before the handle is returned, so a tasks/get
// sent at once finds it.
func (h *Host) startTask(ctx context.Context, next mcp.MethodHandler, req *mcp.CallToolRequest) (mcp.Result, error) {
	if cat := h.Catalogue(); cat != nil {
		if tool, ok := cat.Tool(req.Params.Name); ok {
			if missing := missingCapabilities(tool, req); missing != nil {
				return nil, missingCapabilityError(tool.Name, missing)
			}
		}
	}
	// The driver is one of the host's goroutines, which Close waits for.
	if !h.track() {
		return nil, protocolError(ErrClosed)
	}
	tctx, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), detachedCall{}, true))
	// The driver keeps the request while the task runs: counted.
	t, err := h.tasks.add(h.taskOwner(req.Session, req.Extra), taskHeld(req), cancel)
	if err != nil {
		cancel()
		h.wg.Done()
		return nil, &jsonrpc.Error{Code: CodeBusy, Message: err.Error(), Data: json.RawMessage(`{"reason":"too_many_tasks","retry":true}`)}
	}
	h.log.Info("task created", "task", taskLabel(t.id), "tool", req.Params.Name)
	first := *req
	p := *req.Params
	first.Params = &p
	go func() {
		defer h.wg.Done()
		h.driveTask(tctx, next, t, &first)
	}()
	h.tasks.mu.Lock()
	defer h.tasks.mu.Unlock()
	return t.handleLocked(), nil
}

// driveTask runs the task's call, and each retry of it once tasks/update
// has answered its input requests, until it ends or is cancelled.
func (h *Host) driveTask(ctx context.Context, next mcp.MethodHandler, t *task, req *mcp.CallToolRequest) {
	s := h.tasks
	for {
		out, err := next(ctx, "tools/call", req)
		res, _ := out.(*mcp.CallToolResult)
		s.mu.Lock()
		// A call that asked for input is parked in the session layer
		// with its guest: a task that ends now (cancelled, expired) takes
		// it out, or it held its instance until the abandonment time
		// (a red team, stop 64).
		parked := res != nil && res.NeedsInput()
		if terminal(t.status) { // cancelled meanwhile
			if parked {
				t.retry, t.state = req, res.RequestState
			}
			s.mu.Unlock()
			if parked {
				h.abandonParked(t)
			}
			return
		}
		t.updated = time.Now()
		switch {
		case ctx.Err() != nil:
			t.status = taskCancelled
			if parked {
				t.retry, t.state = req, res.RequestState
				defer h.abandonParked(t)
			}
		case err != nil:
			t.status, t.err = taskFailed, asRPCError(protocolError(err))
		case res == nil:
			t.status, t.err = taskFailed, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the call returned no result"}
		case res.NeedsInput():
			t.status, t.inputs, t.state, t.answered = taskInputRequired, res.InputRequests, res.RequestState, mcp.InputResponseMap{}
			t.retry = req
			s.mu.Unlock()
			h.log.Info("task waits for input", "task", taskLabel(t.id))
			if !h.awaitInput(ctx, t) {
				return
			}
			s.mu.Lock()
			if terminal(t.status) { // cancelled as the last answer came
				s.mu.Unlock()
				h.abandonParked(t)
				return
			}
			retry := *t.retry
			p := *retry.Params
			p.InputResponses, p.RequestState = t.answered, t.state
			retry.Params = &p
			t.status, t.inputs, t.state, t.answered, t.retry = taskWorking, nil, "", nil, nil
			t.updated = time.Now()
			// The answers go with the retry: the task holds its
			// arguments and _meta again, and the next round's answers
			// from none.
			if s.tasks[t.id] == t { // not expired meanwhile
				s.resizeLocked(t, taskHeld(&retry))
			}
			s.mu.Unlock()
			req = &retry
			continue
		case res.IsError && res.Meta[MetaFailed] != nil:
			// The guest produced no result (it crashed, timed out):
			// the task failed, as a request that errs does.
			msg := "the call failed"
			if len(res.Content) > 0 {
				if tc, ok := res.Content[0].(*mcp.TextContent); ok {
					msg = tc.Text
				}
			}
			t.status, t.err = taskFailed, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: msg}
		default:
			t.status, t.result = taskCompleted, res
		}
		// A finished task holds its result (or error), not its arguments.
		held, _ := json.Marshal(t.result)
		if t.err != nil {
			held, _ = json.Marshal(t.err)
		}
		s.finishedLocked(t, len(held))
		s.mu.Unlock()
		h.log.Info("task ended", "task", taskLabel(t.id), "status", t.status)
		return
	}
}

// awaitInput waits until tasks/update has answered every input request
// of t (true), or t is cancelled or expires (false). An input-required
// task is woken by tasks/update through the store's condition.
//
// A task whose questions are not all answered within the abandonment
// time ([Options.AbandonAfter], as a parked call's) fails then, its call
// stopped: an abandoned question holds its slot minutes, not the task's
// hour.
func (h *Host) awaitInput(ctx context.Context, t *task) bool {
	s := h.tasks
	abandon := cmp.Or(h.opts.AbandonAfter, DefaultAbandonAfter)
	timer := time.NewTimer(abandon)
	defer timer.Stop()
	for {
		s.mu.Lock()
		ready := t.status == taskInputRequired && len(t.inputs) == 0
		wake := s.wakeLocked(t)
		s.mu.Unlock()
		if ready {
			return true
		}
		select {
		case <-wake:
		case <-timer.C:
			s.mu.Lock()
			if t.status == taskInputRequired {
				t.status, t.inputs, t.updated = taskFailed, nil, time.Now()
				t.err = &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("abandoned: its questions were not answered within %v", abandon)}
				held, _ := json.Marshal(t.err)
				s.finishedLocked(t, len(held))
				s.notifyLocked(t)
			}
			s.mu.Unlock()
			h.log.Info("task abandoned: no answer", "task", taskLabel(t.id))
			h.abandonParked(t)
			return false
		case <-ctx.Done():
			// The call waits parked for its answer: a retry with none
			// ends it (its guest is stopped, its instance reset).
			h.abandonParked(t)
			return false
		}
	}
}

// wakeLocked returns a channel closed at t's next update. s.mu is held.
func (s *taskStore) wakeLocked(t *task) <-chan struct{} {
	c, ok := s.wakes[t]
	if !ok {
		c = make(chan struct{})
		s.wakes[t] = c
	}
	return c
}

// notifyLocked wakes t's driver. s.mu is held.
func (s *taskStore) notifyLocked(t *task) {
	if c, ok := s.wakes[t]; ok {
		close(c)
		delete(s.wakes, t)
	}
}

// abandonParked stops the call of a task that waits for input: the host
// parked it in the session layer, and takes it out as a client that never
// came back would have it (elicit.go's abandonRun): its guest is stopped
// and its instance reset.
func (h *Host) abandonParked(t *task) {
	h.tasks.mu.Lock()
	req, state := t.retry, t.state
	h.tasks.mu.Unlock()
	if req == nil || state == "" {
		return
	}
	id, round, err := h.verifyState(state, req.Params.Name)
	if err != nil {
		return // expired: the session layer abandons it itself
	}
	if v, ok := h.ses.Unpark(id, func(v any) bool { return v.(*run).round == round }); ok {
		h.abandonRun(v.(*run), errTaskCancelled) // returns once the guest has stopped
		h.log.Info("task's parked call stopped", "task", taskLabel(t.id))
	}
}

// errTaskCancelled is why a task's parked call was stopped.
var errTaskCancelled = errors.New("its task was cancelled or expired")

func asRPCError(err error) *jsonrpc.Error {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
}

// The tasks methods (SEP-2663). tasks/list and tasks/result, of the
// 2025-11-25 experimental tasks, are not served: -32601.
const (
	methodTasksGet    = "tasks/get"
	methodTasksUpdate = "tasks/update"
	methodTasksCancel = "tasks/cancel"
)

// taskParams are the params of the tasks methods; inputResponses are
// decoded per key, so that a key the task did not ask is ignored, not an
// error.
type taskParams struct {
	mcp.ParamsBase
	TaskID         string                     `json:"taskId"`
	InputResponses map[string]json.RawMessage `json:"inputResponses,omitempty"`
}

// taskHandle is the result of a tools/call that became a task
// (CreateTaskResult: Result and Task, flat).
type taskHandle struct {
	mcp.ResultBase
	ResultType     string `json:"resultType"`
	TaskID         string `json:"taskId"`
	Status         string `json:"status"`
	CreatedAt      string `json:"createdAt"`
	LastUpdatedAt  string `json:"lastUpdatedAt"`
	TTLMs          int64  `json:"ttlMs"`
	PollIntervalMs int64  `json:"pollIntervalMs"`
}

// detailedTask is the result of tasks/get: the task, with its input
// requests, result or error as its status has them.
type detailedTask struct {
	taskHandle
	InputRequests mcp.InputRequestMap `json:"inputRequests,omitempty"`
	Result        *mcp.CallToolResult `json:"result,omitempty"`
	Error         *jsonrpc.Error      `json:"error,omitempty"`
}

// taskAck is the empty result of tasks/update and tasks/cancel.
type taskAck struct {
	mcp.ResultBase
	ResultType string `json:"resultType"`
}

func (t *task) handleLocked() *taskHandle {
	return &taskHandle{
		ResultType: "task", TaskID: t.id, Status: t.status,
		CreatedAt: t.created.UTC().Format(time.RFC3339Nano), LastUpdatedAt: t.updated.UTC().Format(time.RFC3339Nano),
		TTLMs: t.ttl.Milliseconds(), PollIntervalMs: taskPollInterval.Milliseconds(),
	}
}

// addTaskMethods serves the tasks methods on s. Each finds the caller's
// task and acts on it under the store's lock; what it returns to do after
// (cancelling) runs unlocked.
func (h *Host) addTaskMethods(s *mcp.Server) {
	for _, m := range []struct {
		name string
		fn   func(*task, *taskParams) (mcp.Result, func(), error)
	}{
		{methodTasksGet, h.tasksGet},
		{methodTasksUpdate, h.tasksUpdate},
		{methodTasksCancel, h.tasksCancel},
	} {
		fn := m.fn
		if err := mcp.AddReceivingCustomMethod(s, m.name, func(ctx context.Context, ss *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
			if !declaresTasks(requestCapabilities(ss, p)) {
				data, _ := json.Marshal(map[string]any{"requiredCapabilities": map[string]any{"extensions": map[string]any{TasksExtension: map[string]any{}}}})
				return nil, &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Message: "the client did not declare the " + TasksExtension + " extension", Data: data}
			}
			h.tasks.mu.Lock()
			t, err := h.tasks.lookupLocked(p.TaskID, ownerOf(ctx))
			var res mcp.Result
			var after func()
			if err == nil {
				res, after, err = fn(t, p)
			}
			h.tasks.mu.Unlock()
			if after != nil {
				after()
			}
			if errors.Is(err, ErrTask) {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
			}
			return res, err
		}); err != nil {
			panic(err) // a name of MCP's own: a programming error
		}
	}
}

// requestCapabilities are the client capabilities a request declares in
// its _meta (2026-07-28), else its session's.
func requestCapabilities(ss *mcp.ServerSession, p *taskParams) *mcp.ClientCapabilities {
	if raw, ok := p.Meta[mcp.MetaKeyClientCapabilities]; ok {
		var caps mcp.ClientCapabilities
		if b, err := json.Marshal(raw); err == nil && json.Unmarshal(b, &caps) == nil {
			return &caps
		}
		return nil
	}
	if ip := ss.InitializeParams(); ip != nil {
		return ip.Capabilities
	}
	return nil
}

func ownerOf(ctx context.Context) string {
	o, _ := ctx.Value(taskOwnerKey{}).(string)
	return o
}

func (h *Host) tasksGet(t *task, _ *taskParams) (mcp.Result, func(), error) {
	d := &detailedTask{taskHandle: *t.handleLocked()}
	d.ResultType = "complete"
	switch t.status {
	case taskInputRequired:
		d.InputRequests = t.inputs
	case taskCompleted:
		d.Result = t.result
	case taskFailed:
		d.Error = t.err
	}
	return d, nil, nil
}

// tasksUpdate delivers input responses to a task waiting for them. A
// response under a key the task did not ask (or asked already) is
// ignored; once every key has its answer the call resumes.
func (h *Host) tasksUpdate(t *task, p *taskParams) (mcp.Result, func(), error) {
	if t.status == taskInputRequired {
		for k, raw := range p.InputResponses {
			if _, asked := t.inputs[k]; !asked {
				continue
			}
			var one mcp.InputResponseMap
			if err := json.Unmarshal([]byte(`{"k":`+string(raw)+`}`), &one); err != nil {
				return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("inputResponses[%q]: %v", k, err)}
			}
			// The task holds its answers until the last comes: they
			// count against the task bounds as its arguments do (a red
			// team, stop 64: a client held 4 MiB of answers against a
			// bound of 256 KiB, and could go on).
			was := t.bytes
			h.tasks.resizeLocked(t, was+len(raw))
			if h.tasks.overLocked(t.owner) {
				h.tasks.resizeLocked(t, was)
				return nil, nil, &jsonrpc.Error{Code: CodeBusy, Message: fmt.Sprintf("%v: inputResponses[%q] (%d bytes) would take the client's tasks past the bytes they may hold; answer with less", errTooManyTasks, k, len(raw)), Data: json.RawMessage(`{"reason":"too_many_tasks"}`)}
			}
			t.answered[k] = one["k"]
			delete(t.inputs, k)
		}
		t.updated = time.Now()
		h.tasks.notifyLocked(t)
	}
	return &taskAck{ResultType: "complete"}, nil, nil
}

// tasksCancel cancels a task: it is cancelled at once, and its guest
// stopped (its instance reset). Cancelling a finished task changes
// nothing.
func (h *Host) tasksCancel(t *task, _ *taskParams) (mcp.Result, func(), error) {
	if terminal(t.status) {
		return &taskAck{ResultType: "complete"}, nil, nil
	}
	t.status, t.updated = taskCancelled, time.Now()
	h.tasks.resizeLocked(t, 0) // it holds nothing once its call has stopped
	h.tasks.notifyLocked(t)
	return &taskAck{ResultType: "complete"}, func() {
		t.cancel()
		h.log.Info("task cancelled", "task", taskLabel(t.id))
	}, nil
}

// taskLabel names a task in logs: a digest of its ID, never the ID, which
// is all that guards an anonymous client's task (a red team, stop 64).
func taskLabel(id string) string { return "task-" + traceDigest(id) }

// taskHeld is what a task's driver keeps of req while the task runs: its
// arguments, and its _meta decoded (until stop 66 only the arguments were
// counted, and 16 tasks of 1.6 MB of _meta each kept 194 MiB).
func taskHeld(req *mcp.CallToolRequest) int {
	size := len(req.Params.Arguments)
	if len(req.Params.Meta) > 0 {
		size += keptCost(req.Params.Meta)
	}
	return size
}
