package auth

import (
	"container/list"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Defaults and bounds of introspection (RFC 7662) in [OAuth].
const (
	// DefaultIntrospectionMaxAge is how long an active token's answer is
	// used without asking again, never past the token's exp: a token
	// revoked meanwhile is accepted until then.
	DefaultIntrospectionMaxAge = 5 * time.Minute
	// DefaultMaxIntrospections bounds the introspection requests in
	// flight at once.
	DefaultMaxIntrospections = 8
	// introspectionRefusedFor is how long a token's refusal (not active,
	// or active but not acceptable) is kept: a client repeating a bad
	// token is not introspected at its own rate, and a token made valid
	// meanwhile (an nbf reached) waits this long at most.
	introspectionRefusedFor = 30 * time.Second
	// introspectionWait is how long a request needing an introspection
	// waits for one of the MaxIntrospections to end before it fails as
	// the authorization server being unavailable (503): waiting longer
	// would queue clients without bound behind a slow server.
	introspectionWait = 2 * time.Second
	// introspectionFailedFor is how long an authorization server that
	// failed an introspection (no connection, a timeout, an answer that
	// is not one) is not asked again; then one request at a time asks,
	// until it answers. Meanwhile a request needing an introspection
	// fails at once (503): a flood of made-up tokens while it is down
	// costs it one request a second, not one each, and keeps no one
	// waiting on its timeout but the one asking. Short, since a server
	// that is back is not used until it passes.
	introspectionFailedFor = time.Second
	// maxCachedIntrospections bounds each of the two caches (active
	// answers, refusals), least recently used dropped first: made-up
	// tokens fill the refusals' cache, never push out the active ones.
	maxCachedIntrospections = 4096
)

// errIntrospectionsBusy is the failure of a request that found every
// introspection slot taken for introspectionWait.
var errIntrospectionsBusy = errors.New("too many introspection requests in flight")

// errIntrospectionAborted is the failure of the requests that shared an
// introspection that ended without an answer (it panicked): not an
// invalid token (503, may be retried).
var errIntrospectionAborted = errors.New("oauth: introspection: ended without an answer")

// introspections are an [OAuth]'s introspection answers, kept by the
// token's SHA-256 digest (the token itself is never kept), and its
// requests in flight. It is safe for concurrent use.
type introspections struct {
	maxAge time.Duration
	slots  chan struct{} // one per introspection request in flight

	mu      sync.Mutex // guards the fields below
	active  answerCache
	refused answerCache
	flights map[[32]byte]*flight // token digest → its introspection in flight
	// failed is the authorization server's last failure to answer, nil
	// once it answers again; failedUntil is when it may be asked again,
	// by one request at a time (asking).
	failed      error
	failedUntil time.Time
	asking      bool
}

func newIntrospections(maxAge time.Duration, inFlight int) *introspections {
	return &introspections{
		maxAge:  maxAge,
		slots:   make(chan struct{}, inFlight),
		active:  newAnswerCache(maxCachedIntrospections),
		refused: newAnswerCache(maxCachedIntrospections),
		flights: map[[32]byte]*flight{},
	}
}

// flight is one introspection request, whose answer every request
// bearing its token at the time shares.
type flight struct {
	done chan struct{} // closed when id and err are set
	id   Identity
	err  error
}

// answer is a kept introspection answer: an identity, or the refusal.
type answer struct {
	key   [32]byte
	id    Identity
	err   error
	until time.Time
}

// answerCache is a least-recently-used cache of answers, of at most max
// entries. Its owner's lock guards it.
type answerCache struct {
	max     int
	order   *list.List // of *answer, the most recently used first
	entries map[[32]byte]*list.Element
}

func newAnswerCache(max int) answerCache {
	return answerCache{max: max, order: list.New(), entries: map[[32]byte]*list.Element{}}
}

// get returns key's answer if it is kept and current at now.
func (c *answerCache) get(key [32]byte, now time.Time) (*answer, bool) {
	e, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	a := e.Value.(*answer)
	if !now.Before(a.until) {
		c.order.Remove(e)
		delete(c.entries, key)
		return nil, false
	}
	c.order.MoveToFront(e)
	return a, true
}

// put keeps a, dropping the least recently used answer past max.
func (c *answerCache) put(a *answer) {
	if e, ok := c.entries[a.key]; ok {
		c.order.Remove(e)
	}
	c.entries[a.key] = c.order.PushFront(a)
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.entries, last.Value.(*answer).key)
	}
}

// introspect checks an opaque token with the authorization server (RFC
// 7662), or by the answer kept for it: an active token's until its exp or
// IntrospectionMaxAge, whichever comes first; a refusal's for 30 s.
// Requests bearing one token at once share one introspection; at most
// MaxIntrospections are in flight, and a request that finds none free
// within 2 s fails with an error that is not [ErrInvalidToken] (503).
// After the server failed to answer, a request needing an introspection
// fails so at once, without asking it, for introspectionFailedFor, and
// then while another request asks it again.
func (v *OAuth) introspect(ctx context.Context, token string) (Identity, error) {
	in := v.in
	key := sha256.Sum256([]byte(token))
	in.mu.Lock()
	now := time.Now()
	if a, ok := in.active.get(key, now); ok {
		in.mu.Unlock()
		return a.identity()
	}
	if a, ok := in.refused.get(key, now); ok {
		in.mu.Unlock()
		return a.identity()
	}
	f, joined := in.flights[key]
	asking := false
	if !joined {
		if in.failed != nil {
			if in.asking || now.Before(in.failedUntil) {
				err := in.failed
				in.mu.Unlock()
				return Identity{}, fmt.Errorf("%w (not asked again within %s of a failure, then by one request at a time)", err, introspectionFailedFor)
			}
			asking, in.asking = true, true
		}
		f = &flight{done: make(chan struct{})}
		in.flights[key] = f
	}
	in.mu.Unlock()
	if joined {
		select {
		case <-f.done:
			return cloned(f.id), f.err
		case <-ctx.Done():
			return Identity{}, fmt.Errorf("oauth: introspection: %w", context.Cause(ctx))
		}
	}

	// The flight ends however the introspection does: after a panic in
	// it, left in flight, every later request bearing the token would
	// wait on it until its client's deadline, and, asking marked after
	// a failure, every new token would be refused unasked
	// (TestOAuthPanicLeavesNothingHeld). Those waiting on it then get
	// errIntrospectionAborted, never an empty identity.
	f.err = errIntrospectionAborted
	defer func() {
		in.mu.Lock()
		delete(in.flights, key)
		if asking {
			in.asking = false
		}
		in.mu.Unlock()
		close(f.done)
	}()
	// The introspection is everyone's who bears the token now, not only
	// this request's: it runs on without this request's cancellation
	// (bounded by the HTTP timeout), so that its client hanging up does
	// not fail the others.
	f.id, f.err = v.introspectShared(ctx, token)
	in.mu.Lock()
	now = time.Now()
	switch {
	case f.err == nil:
		in.failed = nil
		until := now.Add(in.maxAge)
		if f.id.Expires.Before(until) {
			until = f.id.Expires
		}
		if now.Before(until) {
			in.active.put(&answer{key: key, id: f.id, until: until})
		}
	case errors.Is(f.err, ErrInvalidToken):
		in.failed = nil
		in.refused.put(&answer{key: key, err: f.err, until: now.Add(introspectionRefusedFor)})
	case errors.Is(f.err, errIntrospectionsBusy):
		// Our own bound, not the server's failure: nothing is kept.
	default:
		// The server failed to answer: the token's answer is not kept
		// (it is asked about again once the server may be), the
		// failure is.
		in.failed, in.failedUntil = f.err, now.Add(introspectionFailedFor)
	}
	in.mu.Unlock()
	return cloned(f.id), f.err
}

// introspectShared takes an introspection slot, waiting introspectionWait
// at most, and introspects token.
func (v *OAuth) introspectShared(ctx context.Context, token string) (Identity, error) {
	wait := time.NewTimer(introspectionWait)
	defer wait.Stop()
	select {
	case v.in.slots <- struct{}{}:
	case <-wait.C:
		return Identity{}, fmt.Errorf("oauth: introspection: %w (%d, waited %s)", errIntrospectionsBusy, cap(v.in.slots), introspectionWait)
	}
	defer func() { <-v.in.slots }()
	bound := max(v.client.Timeout, DefaultHTTPTimeout)
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	return v.introspectNow(ictx, token)
}

func (a *answer) identity() (Identity, error) { return cloned(a.id), a.err }

// cloned is id with a scopes slice of its own, so that no caller can
// change a kept answer's.
func cloned(id Identity) Identity {
	id.Scopes = slices.Clone(id.Scopes)
	return id
}
