package host

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/plugins"
)

// Resource subscriptions. The go-sdk keeps them, in one map by URI for
// the whole server; plugins say what changed (notify_resource_updated).
// Left to itself the go-sdk takes any URI, of any length, as many as a
// session sends, and a session's end (Server.disconnect, go-sdk v1.8.0)
// removes the session from each URI's entry but never the entry it
// leaves empty: a session's made-up URIs stayed in the server's memory
// for good, and every later session end walked them under the server's
// lock (a red team's finding, TestSubscriptionsBoundedAndGoneWithSession).
// So the host
//   - takes only URIs a plugin serves (a resource, or a match of a
//     resource template), of at most maxURILen bytes, and at most
//     maxSubscriptions of them per session;
//   - unsubscribes what a session still holds when it ends, through the
//     go-sdk's own handler, which deletes the entries left empty.
//
// A 2026-07-28 client subscribes within its subscriptions/listen
// request, which the go-sdk undoes when the request ends: its URIs are
// filtered alike, the ones refused left out of what the server
// acknowledges.

// maxSubscriptions bounds the resources one session subscribes to at
// once (one listen request's, for a 2026-07-28 client, of the first
// 2 × maxSubscriptions URIs it names): with maxURILen, at most 512 KiB of
// URIs a session.
const maxSubscriptions = 256

// subscriptions is what each session subscribed to with
// resources/subscribe, until it unsubscribes or ends. Its own lock;
// owned by subscriptionsMiddleware.
type subscriptions struct {
	mu sync.Mutex
	// bySession holds, for each URI a session subscribed to, what frees
	// the bytes it was booked at (listenBook.takeBytes).
	bySession map[*mcp.ServerSession]map[string]func()
	watched   map[*mcp.ServerSession]struct{} // sessions with a watcher (undoAtEnd)
}

// errTooManySubscriptions is a session's subscription past
// maxSubscriptions.
var errTooManySubscriptions = fmt.Errorf("a session may hold at most %d resource subscriptions", maxSubscriptions)

// subscriptionsMiddleware bounds subscriptions and undoes a session's at
// its end. It is the innermost middleware, so that next is the go-sdk's
// own handler, which it calls again at a session's end to unsubscribe.
func (h *Host) subscriptionsMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch req.(type) {
		case *mcp.SubscribeRequest, *mcp.UnsubscribeRequest, *mcp.SubscriptionsListenRequest:
			return h.subscriptionRequest(ctx, method, req, next)
		}
		return next(ctx, method, req)
	}
}

// subscriptionRequest is subscriptionsMiddleware's for the requests it
// bounds. A function of its own, not inlined: the middleware's frame is
// under every tool call's, whose goroutine stack must fit in 8 KiB (see
// traceMiddleware), and this one's took 336 bytes of it.
//
//go:noinline
func (h *Host) subscriptionRequest(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	switch r := req.(type) {
	case *mcp.SubscribeRequest:
		if r.Params == nil {
			break
		}
		uri := r.Params.URI
		if err := h.subscribable(uri); err != nil {
			return nil, err
		}
		tenant := h.shareTenant(subjectOf(req.GetExtra()))
		switch err := h.subs.reserve(r.Session, uri, func() (func(), error) {
			return h.listens.takeBytes(tenant, len(uri)+subscriptionCost)
		}); {
		case errors.Is(err, errListensBusy):
			return nil, &jsonrpc.Error{Code: CodeBusy, Message: err.Error(), Data: []byte(`{"reason":"too_many_subscriptions","retry":true}`)}
		case err != nil:
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: err.Error()}
		}
		out, err := next(ctx, method, req)
		if err != nil {
			h.subs.drop(r.Session, uri)
			return out, err
		}
		h.undoAtEnd(next, r.Session)
		return out, err
	case *mcp.UnsubscribeRequest:
		out, err := next(ctx, method, req)
		if err == nil && r.Params != nil {
			h.subs.drop(r.Session, r.Params.URI)
		}
		return out, err
	case *mcp.SubscriptionsListenRequest:
		if n := r.Params; n != nil && n.Notifications != nil && len(n.Notifications.ResourceSubscriptions) > 0 {
			// At most 2 × maxSubscriptions URIs are looked at: each is
			// matched against every plugin's templates, and a request
			// body can hold far more than any client needs.
			asked := n.Notifications.ResourceSubscriptions
			asked = asked[:min(len(asked), 2*maxSubscriptions)]
			uris := slices.DeleteFunc(slices.Clone(asked), func(uri string) bool {
				return h.subscribable(uri) != nil
			})
			n.Notifications.ResourceSubscriptions = uris[:min(len(uris), maxSubscriptions)]
		}
		// The go-sdk keeps the request's body for as long as the
		// stream is open (it reads it again from a copy it holds):
		// it is counted with the URIs, against the listen streams'
		// bytes, and given back to the bound on request bodies,
		// which counts the bodies being read and served for a while,
		// not held. Held to the end there, a client's listens padded
		// to max_request_body held its share of it, and with no
		// subjects all of it: every other request of the shared
		// token was refused 503 (a tenant review).
		held := h.listenBody(req.GetExtra())
		n := listenedBytes(r.Params)
		if held != nil {
			n += held.n
		}
		release, err := h.listens.take(h.shareTenant(subjectOf(req.GetExtra())), n)
		if err != nil {
			return nil, &jsonrpc.Error{Code: CodeBusy, Message: err.Error(), Data: []byte(`{"reason":"too_many_listens","retry":true}`)}
		}
		// The go-sdk's handler returns when the stream ends.
		defer release()
		if held != nil {
			held.giveBack()
		}
	}
	return next(ctx, method, req)
}

// listenHeader carries, from the HTTP layer to a subscriptions/listen
// request, a token naming its body's count under the bound on request
// bodies (see Host.bodies).
const listenHeader = "X-Wasmtools-Listen"

// listenBody is the count under the bound on request bodies of the
// listen request whose extra this is, nil when none is known (no Guard,
// or not served over HTTP).
func (h *Host) listenBody(extra *mcp.RequestExtra) *heldBody {
	if extra == nil || extra.Header == nil {
		return nil
	}
	token := extra.Header.Get(listenHeader)
	if token == "" {
		return nil
	}
	if v, ok := h.bodies.Load(token); ok {
		return v.(*heldBody)
	}
	return nil
}

// listenedBytes is the bytes of the URIs a listen subscribes to.
func listenedBytes(p *mcp.SubscriptionsListenParams) int {
	n := 0
	if p != nil && p.Notifications != nil {
		for _, uri := range p.Notifications.ResourceSubscriptions {
			n += len(uri)
		}
	}
	return n
}

// subscribable says why uri may not be subscribed to, nil if it may: it
// must be served by a plugin of the catalogue now, and short. Access
// rules are accessMiddleware's (mayWatch), which runs before this.
func (h *Host) subscribable(uri string) error {
	if len(uri) > maxURILen {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams,
			Message: fmt.Sprintf("the URI is %d bytes, over the %d-byte limit", len(uri), maxURILen)}
	}
	if cat := h.Catalogue(); cat == nil || !served(cat, uri) {
		return mcp.ResourceNotFoundError(uri)
	}
	return nil
}

// served reports whether a plugin of cat serves uri: one of its
// resources, or a match of one of its resource templates.
func served(cat *plugins.Catalogue, uri string) bool {
	if _, ok := cat.Resource(uri); ok {
		return true
	}
	return slices.ContainsFunc(cat.Plugins(), func(p *plugins.Plugin) bool { return p.MatchesTemplate(uri) })
}

// undoAtEnd unsubscribes, once ss ends, every URI it still holds, with
// unsubscribe (the go-sdk's handler). One watcher a session: the first
// subscription starts it. A subscription recorded after the watcher
// took the session's URIs starts another, whose Wait returns at once.
// The session is known to the host as a connection (connKey), so that
// Host.Close ends it rather than wait for it (a review: Close hung until
// its deadline with a session that had only subscribed).
func (h *Host) undoAtEnd(unsubscribe mcp.MethodHandler, ss *mcp.ServerSession) {
	h.connKey(ss)
	if !h.subs.watch(ss) || !h.track() {
		return
	}
	go func() {
		defer h.wg.Done()
		_ = ss.Wait()
		for _, uri := range h.subs.end(ss) {
			_, _ = unsubscribe(context.Background(), "resources/unsubscribe",
				&mcp.UnsubscribeRequest{Session: ss, Params: &mcp.UnsubscribeParams{URI: uri}})
		}
	}()
}

// reserve records that ss subscribes to uri, booking its bytes with book
// unless ss holds it already; it fails with errTooManySubscriptions when
// that would make more than maxSubscriptions, or with book's error.
func (s *subscriptions) reserve(ss *mcp.ServerSession, uri string, book func() (func(), error)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bySession == nil {
		s.bySession = map[*mcp.ServerSession]map[string]func(){}
	}
	held := s.bySession[ss]
	if _, ok := held[uri]; ok {
		return nil
	}
	if len(held) >= maxSubscriptions {
		return errTooManySubscriptions
	}
	release, err := book()
	if err != nil {
		return err
	}
	if held == nil {
		held = map[string]func(){}
		s.bySession[ss] = held
	}
	held[uri] = release
	return nil
}

// drop forgets ss's subscription to uri, and frees its bytes.
func (s *subscriptions) drop(ss *mcp.ServerSession, uri string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if release, ok := s.bySession[ss][uri]; ok {
		release()
		delete(s.bySession[ss], uri)
	}
}

// watch reports whether ss needs a watcher: it has none yet.
func (s *subscriptions) watch(ss *mcp.ServerSession) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.watched[ss]; ok {
		return false
	}
	if s.watched == nil {
		s.watched = map[*mcp.ServerSession]struct{}{}
	}
	s.watched[ss] = struct{}{}
	return true
}

// end forgets ss and returns the URIs it held.
func (s *subscriptions) end(ss *mcp.ServerSession) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	uris := make([]string, 0, len(s.bySession[ss]))
	for uri, release := range s.bySession[ss] {
		release()
		uris = append(uris, uri)
	}
	delete(s.bySession, ss)
	delete(s.watched, ss)
	return uris
}
