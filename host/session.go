package host

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/plugins"
)

// Errors a call can be refused with (see package sessions).
var (
	// ErrBusy: the session already has the most calls waiting for one
	// plugin that it may.
	ErrBusy = sessions.ErrBusy
	// ErrAtCapacity: the instance limits are reached and no instance can
	// be evicted.
	ErrAtCapacity = sessions.ErrAtCapacity
	// ErrSessionEnded: the call's session ended while it waited.
	ErrSessionEnded = sessions.ErrSessionEnded
)

// sessionID is what a guest is told of the request's session: a label
// made of a digest of the transport session's ID ("session-…"), or for a
// request keyed by a handle or a client header, the key's label (a digest,
// never the handle). Never the ID itself: whoever presents a stateful
// session's ID is that session (with the shared token, or none), its
// instances of every plugin included, and a plugin could send it out (a
// red team, stop 64).
func sessionID(ss *mcp.ServerSession, key sessions.Key) string {
	if id := ss.ID(); id != "" {
		return sessionLabel(id)
	}
	if key.Kind() == sessions.KindConn {
		return ""
	}
	return key.String()
}

// SessionLabel names a stateful HTTP session, whose ID is a credential,
// in logs, the record log, /status and to guests: a digest of the ID.
func SessionLabel(id string) string {
	// traceDigest's, written into one buffer: a call's context names its
	// session, and this was two allocations of every call.
	sum := sha256.Sum256([]byte(id))
	var b [len("session-") + 16]byte
	copy(b[:], "session-")
	hex.Encode(b[len("session-"):], sum[:8])
	return string(b[:])
}

func sessionLabel(id string) string { return SessionLabel(id) }

// track counts a goroutine of the host's, which Close waits for (the
// caller runs it and calls h.wg.Done), unless the host is closed.
func (h *Host) track() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.wg.Add(1)
	return true
}

// localPrefix starts the label of a session with no ID (stdio,
// in-memory, a sessionless request), which is not kept in a state store.
const localPrefix = durable.LocalPrefix

func (h *Host) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

// connKey is the key of a transport session. The first time it sees a
// session it watches it, so that the session layer frees its instances
// when it ends (stdio EOF, HTTP DELETE or idle timeout, the end of a
// sessionless request).
func (h *Host) connKey(ss *mcp.ServerSession) sessions.Key {
	if k, ok := h.conns.Load(ss); ok {
		return k.(sessions.Key)
	}
	// A stateful HTTP session's ID is a credential: logs, the record log
	// and the host's books name it by the digest guests and traces see.
	id, label := ss.ID(), ""
	if id == "" {
		id = localPrefix + strconv.FormatUint(h.connID.Add(1), 10)
		label = id
	} else {
		label = sessionLabel(id)
	}
	key := sessions.Conn(ss, id, label)
	if k, loaded := h.conns.LoadOrStore(ss, key); loaded {
		return k.(sessions.Key)
	}
	if h.track() {
		go func() {
			defer h.wg.Done()
			_ = ss.Wait()
			h.ownerEnded("session:" + key.String()) // its tasks (taskOwner)
			h.ses.End(context.Background(), key)    // its grants go too: clientEnded
			h.conns.Delete(ss)
			h.book.closed(ss)
			if h.dur != nil && !h.drain.draining.Load() && !h.isClosed() {
				// The client ended it (DELETE) or it timed out: its
				// record goes too. A host that drains or closes leaves
				// its sessions to the other replicas.
				h.dur.Ended(key)
			}
		}()
	}
	return key
}

// clientEnded forgets what the host keeps for key's client, numbered
// client, which the session layer ended (sessions.Options.Ended): its
// grant answers and the URL elicitation IDs its plugins issued. Whoever
// ended it (the transport session's end, the idle timeout, eviction past
// the handle bound), they go with it, so that a client's entries never
// outlive it to crowd out others'. A new client of the key, made while
// this one's end waited for its calls, keeps its grant answers and IDs.
func (h *Host) clientEnded(key sessions.Key, client uint64) {
	h.grants.end(key, client)
	h.urls.end(key.String(), client)
}

// acquire leases key's instance of p. When a reload retired p before the
// call reached its instance, the call runs on the version now served
// (retarget says which, or fails when there is none): what the client
// would get a moment later anyway, so a deploy never fails a call. Between
// a retirement and the new catalogue's registration, retarget may name
// the retired version still: the call then waits for the registration.
func (h *Host) acquire(ctx context.Context, key sessions.Key, p *plugins.Plugin, retarget func() (*plugins.Plugin, error)) (*sessions.Lease, error) {
	for {
		changed := *h.catChanged.Load()
		l, err := h.ses.Acquire(ctx, key, p)
		if !errors.Is(err, sessions.ErrRetired) {
			return l, err
		}
		prev := p
		if p, err = retarget(); err != nil {
			return nil, err
		}
		if p == prev {
			select {
			case <-changed:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
}

// noticeMeta puts what a lease says of the session's previous instance in
// a result's _meta.
func noticeMeta(n sessions.Notice, meta *mcp.Meta) {
	if n.Reset == nil && n.Upgraded == nil {
		return
	}
	if *meta == nil {
		*meta = mcp.Meta{}
	}
	if r := n.Reset; r != nil {
		(*meta)[MetaStateReset] = map[string]any{"reason": r.Reason, "detail": r.Detail}
	}
	if u := n.Upgraded; u != nil {
		(*meta)[MetaUpgraded] = map[string]any{"sha256": u.SHA256, "state": "restored"}
	}
}

// current returns the tool to run for t now: the tool of the same name in
// the catalogue served.
func (h *Host) current(t *plugins.Tool) (*plugins.Tool, error) {
	if cat := h.Catalogue(); cat != nil {
		if now, ok := cat.Tool(t.Name); ok {
			return now, nil
		}
	}
	return nil, fmt.Errorf("%w %q: it was removed", errUnknownTool, t.Name)
}

// currentPlugin returns the plugin served now under p's name.
func (h *Host) currentPlugin(p *plugins.Plugin) (*plugins.Plugin, error) {
	if cat := h.Catalogue(); cat != nil {
		for _, q := range cat.Plugins() {
			if q.Name() == p.Name() {
				return q, nil
			}
		}
	}
	return nil, fmt.Errorf("plugin %q was removed", p.Name())
}
