package host

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// sessionKey says whose instances a call uses: a transport session, or,
// for sessionless requests (protocol 2026-07-28 over HTTP), a client key
// the operator chose to derive from the request.
type sessionKey struct {
	ss     *mcp.ServerSession
	client string
}

// session is the host's state for one client: its plugin instances, made
// lazily on its first call to each plugin.
type session struct {
	id       string // for logs: the Mcp-Session-Id, client key, or a host-made ID
	key      sessionKey
	slots    map[string]*slot // by plugin name; guarded by Host.mu
	closed   bool             // guarded by Host.mu
	ended    chan struct{}    // closed when the session ends
	lastUsed atomic.Int64     // unix nanoseconds
}

// slot holds one session's instance of one plugin. Calls to it run one at
// a time: holding lock is running a call. inst and reset are touched only
// by the holder of lock.
type slot struct {
	sess    *session
	plugin  string
	lock    chan struct{}
	waiting atomic.Int32
	inst    *plugins.Instance
	// reset says why the last instance was discarded, and upgraded that
	// it was replaced with its state, for the next result's _meta; nil
	// when nothing was.
	reset, upgraded map[string]any
	// elem is the slot's place in Host.lru while it holds an instance;
	// guarded by Host.mu.
	elem *list.Element
}

// Errors a call can be refused with.
var (
	// ErrBusy: the session already has the most calls waiting for one
	// plugin that it may.
	ErrBusy = errors.New("too many calls waiting for this plugin in this session")
	// ErrAtCapacity: the instance limits are reached and every instance
	// is busy, so none can be evicted.
	ErrAtCapacity = errors.New("server at capacity: every plugin instance is busy")
	// ErrSessionEnded: the call's session ended while it waited.
	ErrSessionEnded = errors.New("session has ended")
)

// sessionFor returns the state of key, making it on first use. A transport
// session's state is freed when the session ends; a client key's, when it
// has been idle for the session timeout.
func (h *Host) sessionFor(key sessionKey) (*session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if s, ok := h.sessions[key]; ok {
		s.lastUsed.Store(time.Now().UnixNano())
		return s, nil
	}
	h.nextID++
	s := &session{key: key, slots: map[string]*slot{}, ended: make(chan struct{})}
	s.lastUsed.Store(time.Now().UnixNano())
	switch {
	case key.client != "":
		s.id = "client:" + key.client
	case key.ss != nil && key.ss.ID() != "":
		s.id = key.ss.ID()
	default:
		s.id = fmt.Sprintf("local-%d", h.nextID)
	}
	h.sessions[key] = s
	if key.ss != nil {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			_ = key.ss.Wait()
			h.endSession(context.Background(), s)
		}()
	}
	return s, nil
}

// endSession frees a session's instances once the calls running on them
// end (or ctx does). It is idempotent.
func (h *Host) endSession(ctx context.Context, s *session) {
	h.mu.Lock()
	if s.closed {
		h.mu.Unlock()
		return
	}
	s.closed = true
	close(s.ended)
	if h.sessions[s.key] == s {
		delete(h.sessions, s.key)
	}
	slots := make([]*slot, 0, len(s.slots))
	for _, sl := range s.slots {
		slots = append(slots, sl)
	}
	h.mu.Unlock()
	for _, sl := range slots {
		select {
		case sl.lock <- struct{}{}: // held for good: the session is over
		case <-ctx.Done():
			continue
		}
		if sl.inst != nil {
			h.log.Info("instance freed", "session", s.id, "plugin", sl.plugin)
			h.dropInstance(sl, "")
		}
	}
}

// slotFor returns the session's slot for plugin name.
func (h *Host) slotFor(s *session, name string) (*slot, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.closed {
		return nil, ErrSessionEnded
	}
	sl, ok := s.slots[name]
	if !ok {
		sl = &slot{sess: s, plugin: name, lock: make(chan struct{}, 1)}
		s.slots[name] = sl
	}
	return sl, nil
}

// acquire waits for the slot to be free, refusing at once past the queue
// limit. The caller calls release.
func (sl *slot) acquire(ctx context.Context, limit int) error {
	if int(sl.waiting.Add(1)) > limit {
		sl.waiting.Add(-1)
		return ErrBusy
	}
	select {
	case sl.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		sl.waiting.Add(-1)
		return ctx.Err()
	}
}

func (sl *slot) release() {
	sl.waiting.Add(-1)
	<-sl.lock
}

// tryAcquire takes the slot only if no call holds it.
func (sl *slot) tryAcquire() bool {
	select {
	case sl.lock <- struct{}{}:
		return true
	default:
		return false
	}
}

// instanceFor returns the slot's instance of p, replacing an instance of
// another version of the plugin, and making one, within the instance
// limits, if there is none. The caller holds the slot.
func (h *Host) instanceFor(ctx context.Context, sl *slot, p *plugins.Plugin) (*plugins.Instance, error) {
	if sl.inst != nil && !sl.inst.Plugin().SameCode(p) {
		// The plugin was swapped and this call got here before the
		// swap's own retirement did: move the instance over now.
		h.moveOff(sl, sl.inst.Plugin(), p)
	}
	if sl.inst != nil {
		h.mu.Lock()
		if sl.elem != nil {
			h.lru.MoveToBack(sl.elem)
		}
		h.mu.Unlock()
		return sl.inst, nil
	}
	if err := h.reserve(p, sl); err != nil {
		return nil, err
	}
	inst, err := p.NewInstance(ctx)
	if err != nil {
		h.unreserve(p)
		return nil, err
	}
	h.mu.Lock()
	sl.inst = inst
	sl.elem = h.lru.PushBack(sl)
	h.mu.Unlock()
	h.metrics.created.WithLabelValues(p.Name()).Inc()
	h.log.Info("instance created", "session", sl.sess.id, "plugin", p.Name(), "sha256", p.SHA256())
	return inst, nil
}

// reserve counts a new instance of p against the limits, evicting the
// least recently used idle instance when a limit is reached. self is the
// slot asking, skipped as an eviction candidate (nil for pooled instances).
func (h *Host) reserve(p *plugins.Plugin, self *slot) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	plugin, mem := p.Name(), p.MemoryLimit()
	if b := h.opts.MemoryBudget; b > 0 && mem > b {
		return fmt.Errorf("%w: plugin %q's memory limit (%d bytes) is over the whole memory budget (%d bytes)", ErrAtCapacity, plugin, mem, b)
	}
	for {
		overall, perPlugin, memory := h.atLimitLocked(plugin, mem)
		if !overall && !perPlugin && !memory {
			break
		}
		if !h.evictLocked(self, func(sl *slot) bool { return !perPlugin || sl.plugin == plugin }) {
			return fmt.Errorf("%w (%s): try again later, or raise the limit", ErrAtCapacity, h.limitsLocked(plugin, mem))
		}
	}
	h.live.Add(1)
	h.perPlugin[plugin]++
	h.memory += mem
	h.metrics.live.WithLabelValues(plugin).Inc()
	return nil
}

func (h *Host) pluginLimit(plugin string) int {
	if n, ok := h.opts.InstanceLimits[plugin]; ok && n > 0 {
		return n
	}
	return h.opts.MaxInstancesPerPlugin
}

func (h *Host) atLimitLocked(plugin string, mem uint64) (overall, perPlugin, memory bool) {
	overall = h.opts.MaxInstances > 0 && int(h.live.Load()) >= h.opts.MaxInstances
	perPlugin = h.pluginLimit(plugin) > 0 && h.perPlugin[plugin] >= h.pluginLimit(plugin)
	memory = h.opts.MemoryBudget > 0 && h.memory+mem > h.opts.MemoryBudget
	return
}

func (h *Host) limitsLocked(plugin string, mem uint64) string {
	return fmt.Sprintf("%d of at most %d instances live, %d of at most %d for plugin %q, %d of %d bytes of memory budget reserved and %d more needed",
		h.live.Load(), h.opts.MaxInstances, h.perPlugin[plugin], h.pluginLimit(plugin), plugin, h.memory, h.opts.MemoryBudget, mem)
}

func (h *Host) unreserve(p *plugins.Plugin) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unreserveLocked(p)
}

// unreserveLocked gives back what reserve(p) took: p is the plugin (the
// version) of the instance going away.
func (h *Host) unreserveLocked(p *plugins.Plugin) {
	h.live.Add(-1)
	h.perPlugin[p.Name()]--
	h.memory -= p.MemoryLimit()
	h.metrics.live.WithLabelValues(p.Name()).Dec()
}

// evictLocked frees the least recently used idle instance whose slot match
// accepts, and reports whether it found one. The caller holds h.mu; slots
// are only try-locked, so this never waits for a call.
func (h *Host) evictLocked(self *slot, match func(*slot) bool) bool {
	for e := h.lru.Front(); e != nil; e = e.Next() {
		sl := e.Value.(*slot)
		if sl == self || !match(sl) || !sl.tryAcquire() {
			continue
		}
		name := sl.plugin
		h.log.Info("instance evicted", "session", sl.sess.id, "plugin", name, "reason", "instance limit")
		h.closeInstanceLocked(sl)
		sl.reset = map[string]any{"reason": "evicted", "detail": "the instance was idle and the server needed room for another"}
		h.metrics.evictions.WithLabelValues(name).Inc()
		h.metrics.resets.WithLabelValues(name, "evicted").Inc()
		<-sl.lock
		return true
	}
	return false
}

// dropInstance frees the slot's instance; reason, if not "", is counted as
// a reset. The caller holds the slot.
func (h *Host) dropInstance(sl *slot, reason string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sl.inst == nil {
		return
	}
	if reason != "" {
		h.metrics.resets.WithLabelValues(sl.plugin, reason).Inc()
	}
	h.closeInstanceLocked(sl)
}

func (h *Host) closeInstanceLocked(sl *slot) {
	_ = sl.inst.Close(context.Background())
	p := sl.inst.Plugin()
	sl.inst = nil
	if sl.elem != nil {
		h.lru.Remove(sl.elem)
		sl.elem = nil
	}
	h.unreserveLocked(p)
}

// discard frees the slot's instance after it failed, recording why for the
// next result. The caller holds the slot.
func (h *Host) discard(sl *slot, reason, detail string) {
	if sl.inst == nil {
		return
	}
	h.log.Info("instance reset", "session", sl.sess.id, "plugin", sl.plugin, "reason", reason, "detail", detail)
	h.dropInstance(sl, reason)
	sl.reset = map[string]any{"reason": reason, "detail": detail}
}

// outcome is what running one call gave.
type outcome struct {
	result   *abi.CallToolResult
	err      error          // the call's failure, classified by failure()
	reset    map[string]any // the previous instance was discarded: why
	upgraded map[string]any // the previous instance was upgraded with its state
}

// work is something to run on an instance of a plugin: a tool call, a
// prompt, a resource read, a completion.
type work struct {
	plugin *plugins.Plugin
	// retarget is called, holding the slot, when plugin was retired by a
	// swap before the work reached its guest: it points the work at the
	// version now served (see current), or fails when there is none.
	retarget func() (*plugins.Plugin, error)
	// run does the work. Its error is the guest's failure, classified to
	// tell whether the instance must be reset.
	run func(ctx context.Context, inst *plugins.Instance) error
}

// runCall runs one tool call on key's instance of the tool's plugin (or a
// pooled one, for a stateless plugin). The returned error is a refusal
// (busy, at capacity, shutting down); a failure of the call itself is in
// the outcome.
//
// after, if not nil, runs on the instance once the guest returns, while the
// call still holds it.
func (h *Host) runCall(ctx context.Context, key sessionKey, t *plugins.Tool, c plugins.Call, after func(context.Context, *plugins.Instance)) (outcome, error) {
	var o outcome
	w := work{
		plugin: t.Plugin(),
		retarget: func() (*plugins.Plugin, error) {
			now, err := h.current(t)
			if err != nil {
				return nil, err
			}
			c.Tool = now
			return now.Plugin(), nil
		},
		run: func(ctx context.Context, inst *plugins.Instance) error {
			o.result, o.err = inst.CallTool(ctx, c)
			if o.err == nil && after != nil {
				after(ctx, inst)
			}
			return o.err
		},
	}
	reset, upgraded, err := h.runWork(ctx, key, w)
	if err != nil {
		if errors.Is(err, errStart) {
			return outcome{err: err}, nil
		}
		return outcome{}, err
	}
	o.reset, o.upgraded = reset, upgraded
	return o, nil
}

// errStart wraps an instance that could not start: a failure of the work
// (its result says so), not a refusal.
var errStart = errors.New("instance did not start")

// runWork runs w on key's instance of its plugin, or on a pooled instance
// of a stateless plugin. It returns what the session's next result should
// say about its previous instance, and a refusal (busy, at capacity,
// shutting down) or a start failure wrapped in errStart. The work's own
// failure is w.run's business.
func (h *Host) runWork(ctx context.Context, key sessionKey, w work) (reset, upgraded map[string]any, err error) {
	if w.plugin.Stateless() {
		return nil, nil, h.runPooled(ctx, w)
	}
	s, err := h.sessionFor(key)
	if err != nil {
		return nil, nil, err
	}
	sl, err := h.slotFor(s, w.plugin.Name())
	if err != nil {
		return nil, nil, err
	}
	if err := sl.acquire(ctx, h.queueLimit()); err != nil {
		return nil, nil, err
	}
	defer sl.release()
	p := w.plugin
	if h.isRetired(p) {
		if p, err = w.retarget(); err != nil {
			return nil, nil, err
		}
	}
	inst, err := h.instanceFor(ctx, sl, p)
	if err != nil {
		if errors.Is(err, ErrAtCapacity) {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w: %w", errStart, err)
	}
	reset, upgraded = sl.reset, sl.upgraded
	sl.reset, sl.upgraded = nil, nil
	release, err := h.startRunning(ctx)
	if err != nil {
		return nil, nil, err
	}
	werr := w.run(ctx, inst)
	release()
	if werr != nil {
		if reason := resetReason(werr, inst); reason != "" {
			h.discard(sl, reason, werr.Error())
		}
	}
	return reset, upgraded, nil
}

func (h *Host) isRetired(p *plugins.Plugin) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.retired[p] || p.Closed()
}

// startRunning waits for a turn under the concurrency limit, if any.
func (h *Host) startRunning(ctx context.Context) (release func(), err error) {
	if h.running == nil {
		return func() {}, nil
	}
	select {
	case h.running <- struct{}{}:
		return func() { <-h.running }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// current returns the tool to run for t: t itself, unless its plugin was
// retired by a swap before the call reached the guest, in which case the
// call runs on the version now served. A call whose guest has started
// holds its slot, so its version is never retired under it.
func (h *Host) current(t *plugins.Tool) (*plugins.Tool, error) {
	cat := h.Catalogue()
	if cat != nil {
		if now, ok := cat.Tool(t.Name); ok {
			return now, nil
		}
	}
	return nil, fmt.Errorf("tool %q was removed", t.Name)
}

// resetReason says why a failed call leaves its instance unusable, or ""
// when the instance may go on.
func resetReason(err error, inst *plugins.Instance) string {
	var te *sandbox.TrapError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	case errors.As(err, &te), inst.Err() != nil:
		return "trap"
	}
	return ""
}

// pool holds warm instances of a stateless plugin, shared by all sessions.
type pool struct {
	idle chan *plugins.Instance
}

func (h *Host) poolFor(p *plugins.Plugin) *pool {
	h.mu.Lock()
	defer h.mu.Unlock()
	pl, ok := h.pools[p]
	if !ok {
		pl = &pool{idle: make(chan *plugins.Instance, h.poolSize())}
		h.pools[p] = pl
	}
	return pl
}

// runPooled runs work of a stateless plugin on a warm instance from its
// pool, or a new one, and returns the instance to the pool if it is still
// usable and the pool has room.
func (h *Host) runPooled(ctx context.Context, w work) error {
	p := w.plugin
	if h.isRetired(p) {
		var err error
		if p, err = w.retarget(); err != nil {
			return err
		}
	}
	pl := h.poolFor(p)
	var inst *plugins.Instance
	select {
	case inst = <-pl.idle:
	default:
		if err := h.reserve(p, nil); err != nil {
			return err
		}
		var err error
		if inst, err = p.NewInstance(ctx); err != nil {
			h.unreserve(p)
			return fmt.Errorf("%w: %w", errStart, err)
		}
		h.metrics.created.WithLabelValues(p.Name()).Inc()
		h.log.Debug("pooled instance created", "plugin", p.Name(), "sha256", p.SHA256())
	}
	release, err := h.startRunning(ctx)
	if err != nil {
		_ = inst.Close(context.Background())
		h.unreserve(p)
		return err
	}
	werr := w.run(ctx, inst)
	release()
	h.mu.Lock()
	current := h.pools[p] == pl
	h.mu.Unlock()
	if inst.Err() == nil && current {
		select {
		case pl.idle <- inst:
			return nil
		default:
		}
	} else if inst.Err() != nil {
		h.metrics.resets.WithLabelValues(p.Name(), resetReason(werr, inst)).Inc()
	}
	_ = inst.Close(context.Background())
	h.unreserve(p)
	return nil
}

// drainPool closes the idle instances of p's pool and forgets it.
func (h *Host) drainPool(p *plugins.Plugin) {
	h.mu.Lock()
	pl, ok := h.pools[p]
	delete(h.pools, p)
	h.mu.Unlock()
	if !ok {
		return
	}
	for {
		select {
		case inst := <-pl.idle:
			_ = inst.Close(context.Background())
			h.unreserve(p)
		default:
			return
		}
	}
}

// reapIdle ends client-keyed sessions idle for longer than the session
// timeout, until stop is closed.
func (h *Host) reapIdle(stop <-chan struct{}, timeout time.Duration) {
	defer h.wg.Done()
	tick := time.NewTicker(max(timeout/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			var idle []*session
			h.mu.Lock()
			for k, s := range h.sessions {
				if k.client != "" && now.Sub(time.Unix(0, s.lastUsed.Load())) > timeout {
					idle = append(idle, s)
				}
			}
			h.mu.Unlock()
			for _, s := range idle {
				h.log.Info("client idle: freeing its instances", "session", s.id)
				h.endSession(context.Background(), s)
			}
		}
	}
}
