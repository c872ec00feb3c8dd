package host

import (
	"context"
	"fmt"
	"iter"
	"slices"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// replayStore is the event store of the stateful HTTP sessions' SSE
// streams: what each stream sent, so that a client that lost a stream
// resumes it with Last-Event-ID (SEP-1699). It replaces the go-sdk's
// MemoryEventStore, whose one bound is shared by every session (a tenant's
// traffic purged another's unread results) and whose stream entries are
// never freed before their session ends (each request opens one: an
// active session grew the heap by some 230 bytes a request).
//
// What it holds is bounded in bytes, each event counted as its data and
// eventOverhead: in all (max) and, with tenants, per tenant (share, a
// quarter). Past its share a tenant's own oldest events go; past max, the
// oldest of the tenant holding the most. An event just appended stays, so
// that a stream's newest message can always be resumed. A stream whose
// events have all gone keeps its next index in a placeholder, which costs
// what the entry does and ages in the tenant's queue like an event; when
// the placeholder goes too, the stream is forgotten (but for a session's
// standalone GET stream, ""). The go-sdk numbers a stream's events itself,
// so a forgotten stream that sends again is marked broken, and asking to
// resume it fails as for purged events rather than replay from a wrong
// index; so does asking to resume past what a stream sent (another
// replica's numbering). Only Open of a session's standalone stream, which
// the go-sdk makes first, makes a session: a request racing the session's
// end does not bring it back for good.
//
// It is safe for concurrent use. Each event appended or purged costs O(1),
// and O(tenants) past the total.
type replayStore struct {
	max, share int
	// tenantOf names the tenant of the request that opens a session's
	// first stream (its initialize, whose context carries its token).
	tenantOf func(context.Context) string

	mu       sync.Mutex
	total    int
	sessions map[string]*replaySession
	tenants  map[string]*replayTenant
}

// eventOverhead is what an event costs besides its data: its entry in the
// stream and in the tenant's queue; placeholderCost is what a stream with
// no events left costs, its entry and its place in the queue.
const (
	eventOverhead   = 64
	placeholderCost = 384 // its first events' room (inline) included
)

type replayTenant struct {
	name     string
	bytes    int
	sessions int
	queue    replayQueue
}

type replaySession struct {
	tenant  *replayTenant
	streams map[string]*replayStream
}

type replayStream struct {
	sess   *replaySession
	id     string
	first  int            // the index of events[0]
	events []*replayEvent // in the tenant's queue
	// placeholder is in the tenant's queue while the stream has no
	// events: when it goes, the stream is forgotten.
	placeholder *replayEvent
	broken      bool // forgotten while it still sent: its indexes are lost
	// inline holds the stream's first events and slots their list: a
	// POST's stream sends two (its response and, before it, a progress
	// or a log at most now and then), which cost four allocations a
	// call when each event and the list were objects of their own. An
	// event kept keeps its stream anyway (ev.st).
	inline [2]replayEvent
	used   uint8 // of inline
	slots  [2]*replayEvent
}

// newReplayStream is a stream of sess, its first events its own.
func newReplayStream(sess *replaySession, id string, broken bool) *replayStream {
	st := &replayStream{sess: sess, id: id, broken: broken}
	st.events = st.slots[:0]
	return st
}

// newEvent is an event of st's, in its own memory while it has some.
func (st *replayStream) newEvent() *replayEvent {
	if int(st.used) < len(st.inline) {
		st.used++
		return &st.inline[st.used-1]
	}
	return new(replayEvent)
}

// replayEvent is an entry of a tenant's queue: an event of st, or st's
// placeholder (placeholder true, no data).
type replayEvent struct {
	st          *replayStream
	data        []byte
	cost        int
	placeholder bool
	// prev and next link the tenant's queue; queued says it is in it.
	prev, next *replayEvent
	queued     bool
}

// replayQueue is a tenant's events and placeholders, oldest first: a
// doubly linked list through the entries themselves. A container/list
// element per entry was one more object and allocation for each event a
// POST's stream sends (two a call), which the collector marks for as
// long as the event is kept (issue 27, item 2).
type replayQueue struct {
	head, tail *replayEvent
	n          int
}

func (q *replayQueue) front() *replayEvent { return q.head }

func (q *replayQueue) len() int { return q.n }

func (q *replayQueue) pushBack(e *replayEvent) {
	e.prev, e.next, e.queued = q.tail, nil, true
	if q.tail != nil {
		q.tail.next = e
	} else {
		q.head = e
	}
	q.tail = e
	q.n++
}

// remove takes e out of q; one not in it is left alone, as
// container/list did.
func (q *replayQueue) remove(e *replayEvent) {
	if !e.queued {
		return
	}
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		q.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		q.tail = e.prev
	}
	e.prev, e.next, e.queued = nil, nil, false
	q.n--
}

func newReplayStore(max int, tenants bool, tenantOf func(context.Context) string) *replayStore {
	s := &replayStore{max: max, share: max, tenantOf: tenantOf, sessions: map[string]*replaySession{}, tenants: map[string]*replayTenant{}}
	if tenants {
		s.share = max / 4
	}
	return s
}

var _ mcp.EventStore = (*replayStore)(nil)

// newSessionLocked makes session id's entry for the tenant of ctx's
// request. The caller holds mu.
func (s *replayStore) newSessionLocked(ctx context.Context, id string) *replaySession {
	name := s.tenantOf(ctx)
	t := s.tenants[name]
	if t == nil {
		t = &replayTenant{name: name}
		s.tenants[name] = t
	}
	t.sessions++
	sess := &replaySession{tenant: t, streams: map[string]*replayStream{}}
	s.sessions[id] = sess
	return sess
}

// Open implements [mcp.EventStore.Open]. The go-sdk opens a session's
// standalone stream ("") as it connects the session, before any other:
// that makes the session here. Another stream of a session unknown here
// (ended meanwhile) is not kept.
func (s *replayStore) Open(ctx context.Context, sessionID, streamID string) error {
	streamOpened(ctx, streamID) // a session POST's call stream (Host.holdStreams)
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[sessionID]
	switch {
	case sess == nil && streamID != "":
		return nil
	case sess == nil:
		sess = s.newSessionLocked(ctx, sessionID)
	}
	if sess.streams[streamID] == nil {
		sess.streams[streamID] = newReplayStream(sess, streamID, false)
	}
	return nil
}

// Append implements [mcp.EventStore.Append].
func (s *replayStore) Append(ctx context.Context, sessionID, streamID string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[sessionID]
	if sess == nil {
		return nil // ended meanwhile: nothing to resume
	}
	st := sess.streams[streamID]
	if st == nil {
		// Forgotten with its events (every stream is opened first).
		st = newReplayStream(sess, streamID, true)
		sess.streams[streamID] = st
	}
	t := sess.tenant
	if st.placeholder != nil {
		s.removeLocked(t, st.placeholder)
		st.placeholder = nil
	}
	ev := st.newEvent()
	*ev = replayEvent{st: st, data: data, cost: len(data) + eventOverhead}
	t.queue.pushBack(ev)
	st.events = append(st.events, ev)
	t.bytes += ev.cost
	s.total += ev.cost
	for t.bytes > s.share && t.queue.front() != ev {
		s.dropOldestLocked(t)
	}
	for s.total > s.max {
		most := s.largestLocked(ev)
		if most == nil || most.queue.front() == ev {
			break // the appender holds the most, and only this event
		}
		s.dropOldestLocked(most)
	}
	return nil
}

// largestLocked is the tenant holding the most bytes; of tenants holding
// as much, one with an entry to drop other than keep, the event being
// appended. Picking among them in map order left the total exceeded
// whenever the appender tied and came first (TestReplayStoreTotal failed
// one run in a few, stop 64). The caller holds mu.
func (s *replayStore) largestLocked(keep *replayEvent) *replayTenant {
	var most *replayTenant
	for _, t := range s.tenants {
		if t.queue.len() == 0 {
			continue
		}
		if most == nil || t.bytes > most.bytes || t.bytes == most.bytes && most.queue.front() == keep {
			most = t
		}
	}
	return most
}

// removeLocked takes ev out of t's queue and its cost out of the counts.
// The caller holds mu.
func (s *replayStore) removeLocked(t *replayTenant, ev *replayEvent) *replayEvent {
	t.queue.remove(ev)
	t.bytes -= ev.cost
	s.total -= ev.cost
	return ev
}

// dropOldestLocked forgets t's oldest entry: an event, after which a
// stream left with none gets a placeholder, or a placeholder, whose
// stream is then forgotten. The caller holds mu.
func (s *replayStore) dropOldestLocked(t *replayTenant) {
	ev := s.removeLocked(t, t.queue.front())
	st := ev.st
	if ev.placeholder {
		st.placeholder = nil
		if st.sess.streams[st.id] == st {
			delete(st.sess.streams, st.id)
		}
		return
	}
	// A tenant's queue keeps each of its streams' events in order, so
	// the oldest is its stream's first.
	st.events[0] = nil
	st.events = st.events[1:]
	ev.data = nil // an event of inline stays as long as its stream
	st.first++
	if len(st.events) == 0 && st.id != "" {
		ph := &replayEvent{st: st, cost: placeholderCost, placeholder: true}
		t.queue.pushBack(ph)
		st.placeholder = ph
		t.bytes += ph.cost
		s.total += ph.cost
	}
}

// After implements [mcp.EventStore.After].
func (s *replayStore) After(_ context.Context, sessionID, streamID string, index int) iter.Seq2[[]byte, error] {
	data, err := s.after(sessionID, streamID, index)
	return func(yield func([]byte, error) bool) {
		if err != nil {
			yield(nil, err)
			return
		}
		for _, d := range data {
			if !yield(d, nil) {
				return
			}
		}
	}
}

func (s *replayStore) after(sessionID, streamID string, index int) ([][]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[sessionID]
	if sess == nil {
		return nil, fmt.Errorf("replay: unknown session %q", sessionID)
	}
	st := sess.streams[streamID]
	switch {
	case st == nil:
		// Never opened, or forgotten with its events.
		return nil, fmt.Errorf("replay: stream %q of session %q: %w", streamID, sessionID, mcp.ErrEventsPurged)
	case st.broken:
		return nil, fmt.Errorf("replay: stream %q of session %q sent after it was forgotten: %w", streamID, sessionID, mcp.ErrEventsPurged)
	case index == -1:
		// A stream opened afresh (a GET with no Last-Event-ID): what is
		// kept, not a refusal because older events went (the go-sdk
		// answers a refusal with 400, and its client stops listening).
		// The go-sdk numbers what it replays from 0 and goes on from
		// there, so the standalone stream's indexes start at 0 again
		// (the only one it opens afresh: a GET names no other): else
		// the next resumption, from an ID so numbered, replayed events
		// twice, or failed as purged and sent the client here again
		// for all of them (TestStandingStreamAfterPurgeNothingTwice).
		if st.id == "" {
			st.first = 0
		}
		index = st.first - 1
	case index+1 < st.first:
		return nil, fmt.Errorf("replay: index %d of stream %q of session %q: %w", index, streamID, sessionID, mcp.ErrEventsPurged)
	case index+1 > st.first+len(st.events):
		// Past what the stream sent here: another replica's numbering
		// (the session moved), which the go-sdk would go on from.
		return nil, fmt.Errorf("replay: index %d of stream %q of session %q: past its events here: %w", index, streamID, sessionID, mcp.ErrEventsPurged)
	}
	start := index + 1 - st.first
	if start >= len(st.events) {
		return nil, nil
	}
	out := make([][]byte, 0, len(st.events)-start)
	for _, ev := range st.events[start:] {
		out = append(out, ev.data)
	}
	return slices.Clip(out), nil
}

// SessionClosed implements [mcp.EventStore.SessionClosed].
func (s *replayStore) SessionClosed(_ context.Context, sessionID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.sessions[sessionID]
	if sess == nil {
		return nil
	}
	delete(s.sessions, sessionID)
	t := sess.tenant
	for _, st := range sess.streams {
		for _, ev := range st.events {
			s.removeLocked(t, ev)
		}
		st.events = nil
		if st.placeholder != nil {
			s.removeLocked(t, st.placeholder)
			st.placeholder = nil
		}
	}
	if t.sessions--; t.sessions == 0 && t.queue.len() == 0 {
		delete(s.tenants, t.name)
	}
	return nil
}

// held is the bytes held, in all and of each tenant, for tests.
func (s *replayStore) held() (total int, byTenant map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	byTenant = map[string]int{}
	for name, t := range s.tenants {
		byTenant[name] = t.bytes
	}
	return s.total, byTenant
}
