package host

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/plugins"
)

// session is the host's state for one MCP session: its plugin instances,
// made lazily on the session's first call to each plugin.
type session struct {
	h   *Host
	id  string // for logs: the Mcp-Session-Id, or a host-made ID
	mu  sync.Mutex
	ref map[string]*slot // by plugin name
	// closed is set once the session has ended; no slot is made after.
	closed bool
}

// slot holds one session's instance of one plugin. Calls to it run one at
// a time: holding lock is running a call.
type slot struct {
	lock    chan struct{}
	waiting atomic.Int32
	inst    *plugins.Instance // nil until the first call, and after a reset
	// reset says why the last instance was discarded, for the next
	// result's _meta; nil when nothing was.
	reset map[string]any
}

// ErrBusy is returned for a call that would queue past the session's limit
// for one plugin.
var ErrBusy = errors.New("too many calls waiting for this plugin in this session")

// sessionFor returns the state of ss, making it on first use. Its instances
// are freed when ss ends.
func (h *Host) sessionFor(ss *mcp.ServerSession) (*session, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if s, ok := h.sessions[ss]; ok {
		return s, nil
	}
	h.nextID++
	id := ss.ID()
	if id == "" {
		id = fmt.Sprintf("local-%d", h.nextID)
	}
	s := &session{h: h, id: id, ref: map[string]*slot{}}
	h.sessions[ss] = s
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		_ = ss.Wait()
		h.mu.Lock()
		if h.sessions[ss] == s {
			delete(h.sessions, ss)
		}
		h.mu.Unlock()
		s.close(context.Background())
	}()
	return s, nil
}

// slot returns the session's slot for plugin name.
func (s *session) slot(name string) (*slot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("session has ended")
	}
	sl, ok := s.ref[name]
	if !ok {
		sl = &slot{lock: make(chan struct{}, 1)}
		s.ref[name] = sl
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
	<-sl.lock
	sl.waiting.Add(-1)
}

// instance returns the slot's instance of p, replacing one of another
// version of the plugin. The caller holds the slot.
func (s *session) instance(ctx context.Context, sl *slot, p *plugins.Plugin) (*plugins.Instance, error) {
	if sl.inst != nil && sl.inst.Plugin() != p {
		s.h.log.Info("instance retired", "session", s.id, "plugin", p.Name(), "sha256", sl.inst.Plugin().SHA256(), "reason", "upgrade")
		_ = sl.inst.Close(ctx)
		s.h.live.Add(-1)
		sl.inst = nil
		sl.reset = map[string]any{"reason": "upgrade", "detail": "the plugin was replaced by version " + p.SHA256()}
	}
	if sl.inst == nil {
		inst, err := p.NewInstance(ctx)
		if err != nil {
			return nil, err
		}
		s.h.live.Add(1)
		s.h.log.Info("instance created", "session", s.id, "plugin", p.Name(), "sha256", p.SHA256())
		sl.inst = inst
	}
	return sl.inst, nil
}

// discard frees the slot's instance after it failed, recording why for the
// next result. The caller holds the slot.
func (s *session) discard(sl *slot, reason, detail string) {
	if sl.inst == nil {
		return
	}
	s.h.log.Info("instance reset", "session", s.id, "plugin", sl.inst.Plugin().Name(), "reason", reason, "detail", detail)
	_ = sl.inst.Close(context.Background())
	s.h.live.Add(-1)
	sl.inst = nil
	sl.reset = map[string]any{"reason": reason, "detail": detail}
}

// close frees every instance of the session, after the calls running on
// them end. It is idempotent.
func (s *session) close(ctx context.Context) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	slots := make(map[string]*slot, len(s.ref))
	for k, v := range s.ref {
		slots[k] = v
	}
	s.mu.Unlock()
	for name, sl := range slots {
		select {
		case sl.lock <- struct{}{}: // held for good: the session is over
		case <-ctx.Done():
			continue
		}
		if sl.inst != nil {
			_ = sl.inst.Close(context.Background())
			s.h.live.Add(-1)
			sl.inst = nil
			s.h.log.Info("instance freed", "session", s.id, "plugin", name)
		}
	}
}
