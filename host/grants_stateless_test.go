package host_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Red team (stop 64; issue 30, "cannot ask faster than the cap", "deny is
// remembered for the session so a plugin cannot nag"): a plugin that is
// stateless (its own wasmtools.stateless custom section says so, or the
// operator's option) is called by a 2026-07-28 client without a session
// handle, so each call is a session of its own (connKey of the request):
// the person's "deny" was forgotten at once and the per-session cap of
// questions never bound: the plugin asked again at every call (until stop
// 64). Such a plugin's 2026-07-28 clients get a handle now.
func TestStatelessPluginCannotNag2026Client(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	f := newFixtureWith(t, &host.Options{MaxGrantQuestions: 2}, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{target}, AllowPrivate: true})
		return plugins.Options{Policy: &pol, Stateless: true} // as the plugin's own custom section would
	}, map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")})
	url := serveHTTP(t, f)
	a := &grantAnswerer{decisions: []string{"deny", "deny", "deny", "deny", "deny"}}
	s := &grantSession{cs: f.connectOver(t, "http", "", url, &mcp.ClientOptions{ElicitationHandler: a.handler})}
	for i := range 5 {
		got := s.call(t, "fetch", map[string]any{"url": srv.URL})
		if strings.Contains(got, "200 hello") {
			t.Fatalf("call %d granted: %q", i+1, got)
		}
	}
	if n := a.count(); n > 1 {
		t.Errorf("the person denied once and was asked %d times in 5 calls of one client (cap 2): a stateless plugin nags a 2026-07-28 client without bound", n)
	}
}

// Red team: two calls of one session asking for the same grant at once;
// run with -race. The person answers both; counts must add up.
func TestConcurrentAsksOneSession(t *testing.T) {
	f, srv, _ := grantFixture(t, nil)
	for _, proto := range protocols {
		var mu sync.Mutex
		arrived := make(chan struct{}, 2)
		release := make(chan struct{})
		n := 0
		handler := func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			n++
			mu.Unlock()
			arrived <- struct{}{}
			<-release
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "allow for this session"}}, nil
		}
		cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: handler})
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"url": srv.URL}})
			}()
		}
		<-arrived
		select {
		case <-arrived:
		case <-time.After(2 * time.Second):
		}
		close(release)
		wg.Wait()
		if got := text(call(t, cs, "fetch", map[string]any{"url": srv.URL})); !strings.Contains(got, "200 hello") {
			t.Errorf("%s: after two approvals: %q", proto, got)
		}
		t.Logf("%s: %d questions for one grant asked at once by two calls", proto, n)
	}
}

// Red team (stop 64): the target in the host-written question is not the
// guest's words, SECURITY.md says; an IPv6 zone carried any printable text,
// spaces, bidi overrides and U+2028 (a line separator) included, into
// it, under a wildcard ceiling.
func TestQuestionTargetCarriesNoGuestText(t *testing.T) {
	f := newFixtureWith(t, nil, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{"*:443"}})
		return plugins.Options{Policy: &pol}
	}, map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")})
	a := &grantAnswerer{decisions: []string{"deny"}}
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: a.handler})
	call(t, cs, "fetch", map[string]any{"url": "https://[fe80::1%25api.weather.example%20(verified%20by%20wasmtools)\u2028It%20gives%20no%20reason.]/"})
	if a.count() != 0 {
		t.Errorf("the person was asked:\n%s", a.asked[0].Message)
	}
}

// Red team (stop 64): a 2026-07-28 client's calls of a stateless plugin
// that asks were each a client of its own, whose answers the grant book
// kept after it ended, forgotten only by the book's FIFO bound, oldest
// first: alice's "deny" in her open session was forgotten after enough
// such calls (8 here, Options.MaxGrantSessions; 4,096 by default), and she
// was asked again. bob's calls are one session now.
func TestOneShotClientsDoNotPushOutLiveDeny(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	f := newFixtureWith(t, &host.Options{MaxGrantSessions: 8}, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{target}, AllowPrivate: true})
		return plugins.Options{Policy: &pol, Stateless: true}
	}, map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")})
	alice := &grantAnswerer{decisions: []string{"deny", "deny"}}
	acs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: alice.handler})
	call(t, acs, "fetch", map[string]any{"url": srv.URL})

	url := serveHTTP(t, f)
	bob := &grantAnswerer{decisions: slices.Repeat([]string{"deny"}, 20)}
	bs := &grantSession{cs: f.connectOver(t, "http", "", url, &mcp.ClientOptions{ElicitationHandler: bob.handler})}
	for range 12 {
		bs.call(t, "fetch", map[string]any{"url": srv.URL})
	}
	got := text(call(t, acs, "fetch", map[string]any{"url": srv.URL}))
	if alice.count() != 1 {
		t.Errorf("alice's deny, in her open session, was forgotten after one-shot calls of clients that had all ended: asked %d times; %q (book: %+v)", alice.count(), got, f.h.GrantStatus())
	}
}

// Red team (stop 64): the session's cap counts questions "put to the
// person" (GrantCounts.Asked), but Asked was counted before the question
// reached the goroutine serving the client, which may refuse it unasked
// (the call asked its most, MaxQuestions; or maxRefused): a plugin spent
// the session's cap, shared by all its plugins, with questions nobody saw.
func TestCapNotSpentByQuestionsNeverAsked(t *testing.T) {
	f, srv, _ := grantFixture(t, &host.Options{MaxQuestions: 1, MaxGrantQuestions: 2})
	url := serveHTTP(t, f)
	a := &grantAnswerer{decisions: []string{"allow once", "allow once", "allow once"}}
	s := &grantSession{cs: f.connectOver(t, "http", "", url, &mcp.ClientOptions{ElicitationHandler: a.handler})}
	first := s.call(t, "fetch", map[string]any{"url": srv.URL, "times": 2}) // the second request's question is refused unasked
	second := s.call(t, "fetch", map[string]any{"url": srv.URL})
	if a.count() < 2 {
		t.Errorf("the person saw %d question(s), yet the session's cap of 2 is spent: %q; then %q (status %+v)", a.count(), first, second, f.h.GrantStatus())
	}
}
