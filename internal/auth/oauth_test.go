package auth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/auth"
	"github.com/wasmtools/wasmtools/internal/auth/authtest"
)

const resource = "http://127.0.0.1:9/mcp"

func newVerifier(t *testing.T, as *authtest.Server, o auth.OAuthOptions) *auth.OAuth {
	t.Helper()
	o.Issuer, o.Resource = as.URL, resource
	v, err := auth.NewOAuth(o)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestOAuthTokens: a JWT access token is accepted only when signed by
// the issuer's key with an asymmetric algorithm, for this resource, from
// this issuer, within exp and nbf (30 s of skew).
func TestOAuthTokens(t *testing.T) {
	as := authtest.NewServer(t, resource)
	v := newVerifier(t, as, auth.OAuthOptions{})
	now := time.Now()
	stranger := authtest.NewRSAKey(t, "k1") // the issuer's key ID, another key
	tests := []struct {
		name  string
		token string
		why   string // "" for accepted
	}{
		{"valid", as.Mint(map[string]any{"sub": "alice", "scope": "tools read"}), ""},
		{"audience among others", as.Mint(map[string]any{"sub": "alice", "aud": []string{"other", resource}}), ""},
		{"expired within the skew", as.Mint(map[string]any{"sub": "alice", "exp": now.Add(-10 * time.Second).Unix()}), ""},
		{"expired", as.Mint(map[string]any{"sub": "alice", "exp": now.Add(-2 * time.Minute).Unix()}), "expired"},
		{"not yet valid", as.Mint(map[string]any{"sub": "alice", "nbf": now.Add(2 * time.Minute).Unix()}), "not valid yet"},
		{"no exp", as.Mint(map[string]any{"sub": "alice", "exp": nil}), "no exp"},
		{"no sub", as.Mint(map[string]any{}), "no sub"},
		{"wrong audience", as.Mint(map[string]any{"sub": "alice", "aud": "http://127.0.0.1:9/other"}), "another audience"},
		{"no audience", as.Mint(map[string]any{"sub": "alice", "aud": nil}), "another audience"},
		{"wrong issuer", as.Mint(map[string]any{"sub": "alice", "iss": "http://127.0.0.1:1"}), "issued by"},
		{"alg none", as.MintNone(map[string]any{"sub": "alice"}), "signature algorithm"},
		{"HMAC with the public key", as.MintHMACWithPublicKey(map[string]any{"sub": "alice"}), "signature algorithm"},
		{"wrongly signed", as.MintWith(stranger, map[string]any{"sub": "alice"}), "does not verify"},
		{"unknown key", as.MintWith(authtest.NewECKey(t, "k9"), map[string]any{"sub": "alice"}), "does not list"},
		{"not a JWT", "opaque-token", "not a JWT"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, err := v.Verify(context.Background(), tt.token)
			if tt.why == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if id.Subject != as.URL+" alice" {
					t.Errorf("subject %q, want the issuer and sub", id.Subject)
				}
				return
			}
			if !errors.Is(err, auth.ErrInvalidToken) || !strings.Contains(err.Error(), tt.why) {
				t.Errorf("err = %v, want an invalid token saying %q", err, tt.why)
			}
		})
	}
	id, _ := v.Verify(context.Background(), as.Mint(map[string]any{"sub": "alice", "scope": "tools read", "scp": []string{"admin"}}))
	if !id.HasScope("tools") || !id.HasScope("read") || !id.HasScope("admin") {
		t.Errorf("scopes %v, want tools, read (scope) and admin (scp)", id.Scopes)
	}
}

// TestOAuthKeyRotation: the issuer rotates its key; a token signed with
// the new key (a key ID not yet known) makes the verifier fetch the key
// set again, without a restart, and tokens of the old key are refused.
// Unknown key IDs cannot make it fetch faster than KeysMinRefresh.
func TestOAuthKeyRotation(t *testing.T) {
	as := authtest.NewServer(t, resource)
	v := newVerifier(t, as, auth.OAuthOptions{KeysMinRefresh: time.Nanosecond})
	old := as.Mint(map[string]any{"sub": "alice"})
	if _, err := v.Verify(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	as.Rotate(authtest.NewECKey(t, "k2"))
	if _, err := v.Verify(context.Background(), as.Mint(map[string]any{"sub": "alice"})); err != nil {
		t.Fatalf("a token of the rotated key: %v", err)
	}
	if _, err := v.Verify(context.Background(), old); !errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("a token of the retired key: %v, want refused", err)
	}

	// Paced: made-up key IDs fetch the key set at most once per
	// KeysMinRefresh (an hour here).
	paced := newVerifier(t, as, auth.OAuthOptions{KeysMinRefresh: time.Hour})
	paced.Verify(context.Background(), as.Mint(map[string]any{"sub": "alice"}))
	before := as.KeyFetches.Load()
	for i := range 20 {
		paced.Verify(context.Background(), as.MintWith(authtest.NewECKey(t, "made-up-"+string(rune('a'+i))), map[string]any{"sub": "alice"}))
	}
	if n := as.KeyFetches.Load() - before; n > 0 {
		t.Errorf("20 tokens with made-up key IDs fetched the key set %d times, want 0 within KeysMinRefresh", n)
	}
}

// TestOAuthUnreachable: an authorization server that cannot be reached
// is not an invalid token (the client may retry), and says why.
func TestOAuthUnreachable(t *testing.T) {
	v, err := auth.NewOAuth(auth.OAuthOptions{Issuer: "http://127.0.0.1:1", Resource: resource})
	if err != nil {
		t.Fatal(err)
	}
	as := authtest.NewServer(t, resource)
	_, err = v.Verify(context.Background(), as.Mint(map[string]any{"sub": "alice"}))
	if err == nil || errors.Is(err, auth.ErrInvalidToken) {
		t.Fatalf("err = %v, want an error that is not an invalid token", err)
	}
}

// TestOAuthIntrospection: an opaque token is checked by RFC 7662
// introspection, with the resource server's client credentials.
func TestOAuthIntrospection(t *testing.T) {
	as := authtest.NewServer(t, resource)
	as.AddClient("wasmtools", "rs-secret")
	exp := time.Now().Add(time.Minute).Unix()
	as.AddOpaque("good", map[string]any{"active": true, "sub": "bob", "aud": resource, "scope": "tools", "exp": exp, "iss": as.URL})
	as.AddOpaque("other-audience", map[string]any{"active": true, "sub": "bob", "aud": "http://elsewhere/mcp", "exp": exp})
	as.AddOpaque("no-audience", map[string]any{"active": true, "sub": "bob", "exp": exp})
	as.AddOpaque("expired", map[string]any{"active": true, "sub": "bob", "aud": resource, "exp": time.Now().Add(-time.Hour).Unix()})
	v := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: as.URL + "/introspect", ClientID: "wasmtools", ClientSecret: "rs-secret"})
	id, err := v.Verify(context.Background(), "good")
	if err != nil || id.Subject != as.URL+" bob" || !id.HasScope("tools") {
		t.Fatalf("good: %+v %v", id, err)
	}
	for tok, why := range map[string]string{"unknown": "not active", "other-audience": "not for this resource", "no-audience": "not for this resource", "expired": "expired"} {
		if _, err := v.Verify(context.Background(), tok); !errors.Is(err, auth.ErrInvalidToken) || !strings.Contains(err.Error(), why) {
			t.Errorf("%s: %v, want refused saying %q", tok, err, why)
		}
	}
	wrong := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: as.URL + "/introspect", ClientID: "wasmtools", ClientSecret: "guess"})
	if _, err := wrong.Verify(context.Background(), "good"); err == nil || errors.Is(err, auth.ErrInvalidToken) {
		t.Errorf("introspection refused to the resource server: %v, want an error that is not an invalid token", err)
	}
}

// TestOAuthIntrospectionCached: an introspection's answer is kept, by
// the token's digest: a token seen again, active or not, is not sent to
// the authorization server again, and a token asked for by many requests
// at once is introspected once. An active answer is kept until the
// token's exp or IntrospectionMaxAge, whichever comes first. (A red team: every request bearing an
// opaque token made one introspection request, so anyone, with no valid
// token, made wasmtools hammer the authorization server at its own rate.)
func TestOAuthIntrospectionCached(t *testing.T) {
	as := authtest.NewServer(t, resource)
	as.AddClient("wasmtools", "rs-secret")
	as.AddOpaque("good", map[string]any{"active": true, "sub": "bob", "aud": resource, "exp": time.Now().Add(time.Hour).Unix()})
	v := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: as.URL + "/introspect", ClientID: "wasmtools", ClientSecret: "rs-secret"})
	for _, tc := range []struct {
		token  string
		active bool
	}{{"good", true}, {"unknown", false}} {
		before := as.Introspections.Load()
		for range 20 {
			_, err := v.Verify(context.Background(), tc.token)
			if tc.active != (err == nil) {
				t.Fatalf("%s: %v", tc.token, err)
			}
		}
		if n := as.Introspections.Load() - before; n != 1 {
			t.Errorf("20 requests bearing %q made %d introspection requests, want 1", tc.token, n)
		}
	}

	// An active answer is kept no longer than the token's exp (here
	// past, within the clock skew) and IntrospectionMaxAge.
	as.AddOpaque("ending", map[string]any{"active": true, "sub": "bob", "aud": resource, "exp": time.Now().Add(-10 * time.Second).Unix()})
	brief := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: as.URL + "/introspect", ClientID: "wasmtools", ClientSecret: "rs-secret", IntrospectionMaxAge: time.Nanosecond})
	for _, tc := range []struct {
		v     *auth.OAuth
		token string
	}{{v, "ending"}, {brief, "good"}} {
		before := as.Introspections.Load()
		for range 3 {
			if _, err := tc.v.Verify(context.Background(), tc.token); err != nil {
				t.Fatalf("%s: %v", tc.token, err)
			}
		}
		if n := as.Introspections.Load() - before; n != 3 {
			t.Errorf("3 requests bearing %q, its answer due to end at once, made %d introspection requests, want 3", tc.token, n)
		}
	}

	before := as.Introspections.Load()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := v.Verify(context.Background(), "at-once"); !errors.Is(err, auth.ErrInvalidToken) {
				t.Errorf("at-once: %v, want refused", err)
			}
		})
	}
	wg.Wait()
	if n := as.Introspections.Load() - before; n != 1 {
		t.Errorf("16 requests at once bearing one token made %d introspection requests, want 1", n)
	}
}

// introspectionEndpoint is an RFC 7662 endpoint on loopback that
// answers every token as not active. Each request is sent on arrived
// first; while fail is set it answers 503 instead, and while hold is set
// it waits for release to be closed.
type introspectionEndpoint struct {
	URL        string
	arrived    chan struct{}
	release    chan struct{}
	fail, hold atomic.Bool
}

func newIntrospectionEndpoint(t *testing.T) *introspectionEndpoint {
	e := &introspectionEndpoint{arrived: make(chan struct{}, 100), release: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.arrived <- struct{}{}
		if e.fail.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		if e.hold.Load() {
			select {
			case <-e.release:
			case <-r.Context().Done():
			}
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"active":false}`)
	}))
	t.Cleanup(srv.Close)
	e.URL = srv.URL
	return e
}

// TestOAuthIntrospectionBounded: introspection requests in flight are
// bounded: with the authorization server answering none, requests
// bearing new tokens beyond the bound wait briefly and fail with an
// error that is not an invalid token (503, may be retried), rather than
// each opening one more request to it.
func TestOAuthIntrospectionBounded(t *testing.T) {
	const limit = 4
	const tokens = limit + 8
	endpoint := newIntrospectionEndpoint(t)
	endpoint.hold.Store(true)
	as := authtest.NewServer(t, resource)
	v := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: endpoint.URL, ClientID: "wasmtools", ClientSecret: "rs-secret", MaxIntrospections: limit})
	results := make(chan error, tokens)
	for i := range tokens {
		go func() {
			_, err := v.Verify(context.Background(), fmt.Sprintf("made-up-%d", i))
			results <- err
		}()
	}
	inFlight, failed := 0, 0
	for failed < tokens-limit && inFlight <= limit {
		select {
		case <-endpoint.arrived:
			inFlight++
		case err := <-results:
			if err == nil || errors.Is(err, auth.ErrInvalidToken) {
				t.Fatalf("a token checked while the authorization server answered none: %v", err)
			}
			failed++
		}
	}
	close(endpoint.release)
	if inFlight > limit {
		t.Fatalf("%d introspection requests at once, want at most %d", inFlight, limit)
	}
	for range limit {
		if err := <-results; !errors.Is(err, auth.ErrInvalidToken) {
			t.Errorf("a token introspected within the bound: %v, want refused as not active", err)
		}
	}
}

// TestOAuthCancelledFetchFailsNoOneElse: the key set is fetched for
// whichever request first needs it; that request's client hanging up
// (its context cancelled) must not stand as the authorization server's
// failure for everyone. (A red team: anyone, with any JWT-shaped token
// naming a made-up key ID, sent once per KeysMinRefresh and hung up on
// during the fetch, made every tenant's valid token fail with 503
// "context canceled" until the next refresh.)
func TestOAuthCancelledFetchFailsNoOneElse(t *testing.T) {
	as := authtest.NewServer(t, resource)
	v := newVerifier(t, as, auth.OAuthOptions{KeysMinRefresh: time.Hour})
	gone, cancel := context.WithCancel(context.Background())
	cancel() // the client hung up
	if _, err := v.Verify(gone, as.MintWith(authtest.NewECKey(t, "made-up"), map[string]any{"sub": "mallory"})); err == nil {
		t.Fatal("a token of a made-up key was accepted")
	}
	if _, err := v.Verify(context.Background(), as.Mint(map[string]any{"sub": "alice"})); err != nil {
		t.Errorf("alice's valid token after another request's cancelled fetch: %v; want accepted", err)
	}
}

// countingTransport counts the requests it sends on, over the real
// network.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return http.DefaultTransport.RoundTrip(r)
}

// TestOAuthIntrospectionUnavailable: an authorization server that fails
// an introspection (a 5xx, or no connection) is not asked again for
// IntrospectionFailedFor, and then by one request at a time: requests
// bearing new tokens meanwhile fail at once with an error that is not an
// invalid token (503), without a request of their own. (Before, every
// request bearing a made-up token made one, up to max_introspections at
// once: a flood while the server was down kept it hammered the moment it
// came back, and against a server that did not answer each request
// waited for its timeout.)
func TestOAuthIntrospectionUnavailable(t *testing.T) {
	endpoint := newIntrospectionEndpoint(t)
	endpoint.fail.Store(true)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // its port refuses connections
	as := authtest.NewServer(t, resource)
	unavailable := func(err error) bool { return err != nil && !errors.Is(err, auth.ErrInvalidToken) }

	for _, tc := range []struct{ name, url string }{{"5xx", endpoint.URL}, {"unreachable", closed.URL}} {
		t.Run(tc.name, func(t *testing.T) {
			sent := &countingTransport{}
			v := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: tc.url, ClientID: "wasmtools", ClientSecret: "rs-secret",
				HTTPClient: &http.Client{Transport: sent, Timeout: time.Minute}})
			for i := range 20 {
				if _, err := v.Verify(context.Background(), fmt.Sprintf("made-up-%d", i)); !unavailable(err) {
					t.Fatalf("made-up-%d while the authorization server fails: %v, want an error that is not an invalid token", i, err)
				}
			}
			if n := sent.n.Load(); n != 1 {
				t.Errorf("20 requests bearing new tokens while the authorization server failed made %d introspection requests, want 1", n)
			}
		})
	}

	for len(endpoint.arrived) > 0 {
		<-endpoint.arrived // the subtests'
	}

	// After the pause, one request asks again; others meanwhile fail at
	// once, though it hangs; once it answers, everyone is asked about.
	v := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: endpoint.URL, ClientID: "wasmtools", ClientSecret: "rs-secret"})
	if _, err := v.Verify(context.Background(), "first"); !unavailable(err) {
		t.Fatalf("first, while the authorization server fails: %v", err)
	}
	<-endpoint.arrived
	time.Sleep(auth.IntrospectionFailedFor) // the pause, not a poll
	endpoint.fail.Store(false)
	endpoint.hold.Store(true)
	probe := make(chan error, 1)
	go func() { _, err := v.Verify(context.Background(), "probe"); probe <- err }()
	<-endpoint.arrived
	if _, err := v.Verify(context.Background(), "meanwhile"); !unavailable(err) {
		t.Errorf("meanwhile, while another request asks the authorization server again: %v, want an error that is not an invalid token", err)
	}
	close(endpoint.release)
	if err := <-probe; !errors.Is(err, auth.ErrInvalidToken) {
		t.Errorf("probe, once the authorization server answers: %v, want refused as not active", err)
	}
	if _, err := v.Verify(context.Background(), "after"); !errors.Is(err, auth.ErrInvalidToken) {
		t.Errorf("after the authorization server answered again: %v, want refused as not active", err)
	}
	if n := len(endpoint.arrived); n != 1 {
		t.Errorf("%d introspection requests besides the first and the probe, want 1 (after's)", n)
	}
}

// TestOAuthKeysKeptWhileIssuerDown: a fetch of the key set that fails
// (the authorization server down, here answering 503) leaves the keys in
// hand as they were: tokens signed with them go on verifying until
// KeysMaxAge; a token naming a key not in hand cannot be checked (an
// error that is not an invalid token). (Before, a failed fetch stood for
// every token until KeysMinRefresh passed: anyone, with a JWT-shaped
// token naming a made-up key ID once per KeysMinRefresh while the
// server was down, made every valid token fail with 503, though the keys
// that verified them were in hand.)
func TestOAuthKeysKeptWhileIssuerDown(t *testing.T) {
	as := authtest.NewServer(t, resource)
	v := newVerifier(t, as, auth.OAuthOptions{KeysMinRefresh: time.Nanosecond})
	alice := as.Mint(map[string]any{"sub": "alice"})
	if _, err := v.Verify(context.Background(), alice); err != nil {
		t.Fatal(err)
	}
	as.Down.Store(true)
	_, err := v.Verify(context.Background(), as.MintWith(authtest.NewECKey(t, "made-up"), map[string]any{"sub": "mallory"}))
	if err == nil || errors.Is(err, auth.ErrInvalidToken) {
		t.Errorf("a token of a key not in hand while the server is down: %v, want an error that is not an invalid token", err)
	}
	for i := range 3 {
		if _, err := v.Verify(context.Background(), alice); err != nil {
			t.Fatalf("alice's valid token after a failed fetch of the key set (%d): %v; want accepted with the keys in hand", i, err)
		}
	}
}

// TestOAuthKeyFetchHoldsNoOneElse: a fetch of the key set under way
// (here one the authorization server does not answer, caused by a token
// naming a made-up key ID) holds up only the tokens that need it: a token
// of a key in hand verifies meanwhile. (Before, the fetch held the
// verifier's lock for up to the HTTP timeout, 10 s, and every JWT waited
// behind it, its client's cancellation unheard: against a server that
// hangs, anyone with a made-up key ID once per keys_min_refresh stalled
// every valid token about half the time.)
func TestOAuthKeyFetchHoldsNoOneElse(t *testing.T) {
	as := authtest.NewServer(t, resource)
	v := newVerifier(t, as, auth.OAuthOptions{KeysMinRefresh: time.Nanosecond})
	alice := as.Mint(map[string]any{"sub": "alice"})
	if _, err := v.Verify(context.Background(), alice); err != nil {
		t.Fatal(err)
	}
	arrived, release := as.HoldKeys()
	mallory := make(chan error, 1)
	go func() {
		_, err := v.Verify(context.Background(), as.MintWith(authtest.NewECKey(t, "made-up"), map[string]any{"sub": "mallory"}))
		mallory <- err
	}()
	<-arrived // the fetch is under way
	done := make(chan error, 1)
	go func() { _, err := v.Verify(context.Background(), alice); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("alice's valid token while a fetch is under way: %v; want accepted", err)
		}
	case <-time.After(5 * time.Second): // the fetch's bound is 10 s
		t.Error("alice's valid token waited for a fetch of the key set it does not need")
	}
	// A request that needs the fetch waits for it, as long as its
	// client does.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := v.Verify(gone, as.MintWith(authtest.NewECKey(t, "made-up-2"), map[string]any{"sub": "mallory"})); !errors.Is(err, context.Canceled) {
		t.Errorf("a token needing the fetch under way, its client gone: %v, want context.Canceled", err)
	}
	release()
	if err := <-mallory; !errors.Is(err, auth.ErrInvalidToken) {
		t.Errorf("the made-up key's token once the fetch ends: %v, want refused", err)
	}
}

// TestOAuthKeyFetchFailurePaced: a fetch of the key set that fails (the
// authorization server down from the start, answering 503) is not tried
// again before KeysMinRefresh: 20 tokens make one attempt (discovery's
// two well-known URLs), each failing at once with an error that is not
// an invalid token (503).
func TestOAuthKeyFetchFailurePaced(t *testing.T) {
	as := authtest.NewServer(t, resource)
	as.Down.Store(true)
	sent := &countingTransport{}
	v := newVerifier(t, as, auth.OAuthOptions{HTTPClient: &http.Client{Transport: sent, Timeout: time.Minute}})
	for i := range 20 {
		if _, err := v.Verify(context.Background(), as.Mint(map[string]any{"sub": "alice"})); err == nil || errors.Is(err, auth.ErrInvalidToken) {
			t.Fatalf("token %d while the authorization server is down: %v, want an error that is not an invalid token", i, err)
		}
	}
	if n := sent.n.Load(); n != 2 {
		t.Errorf("20 tokens while the authorization server was down made %d requests to it, want 2 (one discovery)", n)
	}
}

// panicOnce is a transport whose first request panics (as a bug in a
// transport, or in what a request runs, might), and the rest go out.
type panicOnce struct{ done atomic.Bool }

func (p *panicOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if p.done.CompareAndSwap(false, true) {
		panic("the transport's first request")
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestOAuthPanicLeavesNothingHeld: a panic in the fetch of the issuer's
// keys, or in a token's introspection, leaves no fetch or flight marked
// under way: the next request fetches or asks again, rather than waiting
// for good on the one that panicked (a review, stop 67: the clean-up was
// not deferred, and every later JWT, or every later request bearing the
// introspected token, failed at its client's deadline). net/http's server
// recovers a handler's panic and serves on.
func TestOAuthPanicLeavesNothingHeld(t *testing.T) {
	verify := func(v *auth.OAuth, token string) (panicked any, err error) {
		defer func() { panicked = recover() }()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = v.Verify(ctx, token)
		return nil, err
	}
	t.Run("keys", func(t *testing.T) {
		as := authtest.NewServer(t, resource)
		v := newVerifier(t, as, auth.OAuthOptions{HTTPClient: &http.Client{Transport: &panicOnce{}}})
		token := as.Mint(map[string]any{"sub": "alice"})
		if p, _ := verify(v, token); p == nil {
			t.Fatal("the first fetch did not panic")
		}
		if p, err := verify(v, token); err != nil || p != nil {
			t.Errorf("a JWT after a fetch of the keys panicked: %v %v; want it accepted", err, p)
		}
	})
	t.Run("introspection", func(t *testing.T) {
		endpoint := newIntrospectionEndpoint(t)
		as := authtest.NewServer(t, resource)
		v := newVerifier(t, as, auth.OAuthOptions{IntrospectionURL: endpoint.URL, ClientID: "wasmtools", ClientSecret: "rs-secret", HTTPClient: &http.Client{Transport: &panicOnce{}}})
		if p, _ := verify(v, "opaque"); p == nil {
			t.Fatal("the first introspection did not panic")
		}
		if p, err := verify(v, "opaque"); !errors.Is(err, auth.ErrInvalidToken) || p != nil {
			t.Errorf("the token again after its introspection panicked: %v %v; want it asked about again, and refused (inactive)", err, p)
		}
	})
}

// TestOAuthKeysMaxAgeBelowMinRefresh: keys past their max age are
// fetched again, but no sooner than KeysMinRefresh after the last fetch:
// a max age below it would have stale keys used up to KeysMinRefresh, so
// such options are refused, naming both.
func TestOAuthKeysMaxAgeBelowMinRefresh(t *testing.T) {
	tests := []struct {
		name string
		o    auth.OAuthOptions
		fail bool
	}{
		{"below", auth.OAuthOptions{KeysMinRefresh: time.Minute, KeysMaxAge: 30 * time.Second}, true},
		{"min refresh over the default max age", auth.OAuthOptions{KeysMinRefresh: 2 * time.Hour}, true},
		{"equal", auth.OAuthOptions{KeysMinRefresh: time.Minute, KeysMaxAge: time.Minute}, false},
		{"defaults", auth.OAuthOptions{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.o.Issuer, tt.o.Resource = "http://127.0.0.1:1", resource
			_, err := auth.NewOAuth(tt.o)
			if tt.fail != (err != nil) {
				t.Fatalf("err = %v, want an error: %v", err, tt.fail)
			}
			if err != nil && (!strings.Contains(err.Error(), "keys_min_refresh") || !strings.Contains(err.Error(), "keys_max_age")) {
				t.Errorf("err = %v, want it to name keys_min_refresh and keys_max_age", err)
			}
		})
	}
}
