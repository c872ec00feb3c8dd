package host

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestLateEndKeepsReturningClientsGrants: a client whose key comes back
// while its old client's end still runs (the end waits for the old
// client's call) keeps the grant answers it gives meanwhile, and does not
// inherit the old client's (a review, stop 67: the old client's late end
// forgot every answer kept under the key, the new client's too, and its
// person was asked again).
func TestLateEndKeepsReturningClientsGrants(t *testing.T) {
	h, tool := counterHost(t)
	p := tool.Plugin()
	key := sessions.Client("returning")
	answer := func(target string, allowed bool) {
		h.grants.mu.Lock()
		defer h.grants.mu.Unlock()
		h.grants.session(key, "").answers[grantKey{plugin: p.Name(), sha256: p.SHA256(), kind: sandbox.GrantNetwork, target: target}] = allowed
	}

	returning(t, h, key, p, func() { answer("old.example:443", false) }, func() { answer("new.example:443", true) })

	got := string(h.grants.export(key))
	if !strings.Contains(got, "new.example:443") {
		t.Errorf("the new client's answers after the old client's late end: %q; want its allow of new.example:443 kept", got)
	}
	if strings.Contains(got, "old.example:443") {
		t.Errorf("the new client's answers: %q; want none of the old client's", got)
	}
}

// TestLateEndKeepsReturningClientsURLs: as TestLateEndKeepsReturningClientsGrants,
// for the URL elicitation IDs a client's plugins issued: the new client's
// completion of its own ID is sent after the old client's late end, and
// the old client's ID is not the new one's to complete.
func TestLateEndKeepsReturningClientsURLs(t *testing.T) {
	h, tool := counterHost(t)
	key := sessions.Client("returning")
	env := func() *callEnv { return keyedCallEnv(h, tool, key, nil) }
	issue := func(id string) func() {
		return func() {
			env().issueURLs(&mcp.ElicitParams{Mode: "url", ElicitationID: id, URL: "https://example.com/" + id})
		}
	}
	returning(t, h, key, tool.Plugin(), issue("old-1"), issue("new-1"))
	if ok, why := env().spendURL("new-1"); !ok {
		t.Errorf("the new client's completion of its own ID after the old client's late end: refused (%s)", why)
	}
	if ok, _ := env().spendURL("old-1"); ok {
		t.Error("the new client completed the old client's ID")
	}
}

// counterHost is a host of the counter example, and its tool.
func counterHost(t *testing.T) (*Host, *plugins.Tool) {
	t.Helper()
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	cat, errs := plugins.LoadAll(ctx, rt, []string{testplugins.Example(t, "counter")}, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	h := New(plugins.NewStatic(cat), nil)
	t.Cleanup(func() { h.Close(ctx) })
	tool, _ := cat.Tool("count")
	return h, tool
}

// returning runs key's old client's call, which keeps (old), then ends
// that client while the call runs; the key comes back meanwhile, a new
// client, which keeps (back) too; then the old call ends, and with it the
// old client's end, which tells the host.
func returning(t *testing.T, h *Host, key sessions.Key, p *plugins.Plugin, old, back func()) {
	t.Helper()
	l := acquire(t, h, key, p)
	old()
	finish := comeBack(t, h, key, p, l)
	back()
	finish()
}

// keyedCallEnv is the environment of a call of tool by key's client,
// holding l (nil: none).
func keyedCallEnv(h *Host, tool *plugins.Tool, key sessions.Key, l *sessions.Lease) *callEnv {
	e := h.newCallEnv(context.Background(), tool, &mcp.CallToolRequest{Params: &mcp.CallToolParamsRaw{Name: tool.Name}}, key.String())
	e.bind(clientRef{key: key})
	e.attach(l)
	return e
}

func acquire(t *testing.T, h *Host, key sessions.Key, p *plugins.Plugin) *sessions.Lease {
	t.Helper()
	l, err := h.ses.Acquire(context.Background(), key, p)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// comeBack ends key's client, whose call holds old, while that call runs,
// and makes the key's next client meanwhile, with a call of its own.
// finish ends both calls, the new client's first, and waits for the old
// client's end, which waits for its call.
func comeBack(t *testing.T, h *Host, key sessions.Key, p *plugins.Plugin, old *sessions.Lease) (finish func()) {
	t.Helper()
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		h.ses.End(context.Background(), key) // waits for the old client's call
	}()
	// Acquire makes the key's next client whichever comes first: it
	// finds the old client forgotten (End forgets it before it waits for
	// the call), or it waits for the old client's slot, which old holds,
	// and that wait ends with the client. Bounded for an End that would
	// never forget it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	back, err := h.ses.Acquire(ctx, key, p)
	if err == nil && back.Client() == old.Client() {
		back.Done(nil)
		err = fmt.Errorf("the old client %d's lease", old.Client())
	}
	if err != nil {
		cancel()
		old.Done(nil) // for the host's Close
		t.Fatalf("the key's next client: %v", err)
	}
	return func() {
		back.Done(nil)
		cancel()
		old.Done(nil)
		<-ended
	}
}

// TestClientlessAnswersKeptByFirstClient: answers and URL elicitation IDs
// kept while the key had no session-layer client (a 2025-11-25 session
// whose calls so far were of a stateless plugin, which runs on a pooled
// instance and makes none) are the session's still once a stateful
// plugin's call makes its client: they are not an ended client's. The
// grant book took them for an earlier client's and forgot them, so a
// person's "deny for this session" no longer held, and the stateless
// plugin's completion of its own URL elicitation was dropped.
func TestClientlessAnswersKeptByFirstClient(t *testing.T) {
	h, tool := counterHost(t)
	p := tool.Plugin()
	key := sessions.Client("clientless")
	gk := grantKey{plugin: p.Name(), sha256: p.SHA256(), kind: sandbox.GrantNetwork, target: "denied.example:443"}
	h.grants.mu.Lock()
	h.grants.session(key, "").answers[gk] = false
	h.grants.mu.Unlock()
	env := func() *callEnv { return keyedCallEnv(h, tool, key, nil) }
	env().issueURLs(&mcp.ElicitParams{Mode: "url", ElicitationID: "before", URL: "https://example.com/before"})

	l, err := h.ses.Acquire(context.Background(), key, p) // the key's first client
	if err != nil {
		t.Fatal(err)
	}
	defer l.Done(nil)
	h.grants.mu.Lock()
	allowed, known := h.grants.session(key, "").answers[gk]
	h.grants.mu.Unlock()
	if !known || allowed {
		t.Errorf("the deny given before the key's first client: known %v, allowed %v; want it kept", known, allowed)
	}
	if ok, why := env().spendURL("before"); !ok {
		t.Errorf("the completion of an ID issued before the key's first client: refused (%s)", why)
	}
}

// TestOldClientsCallKeepsOutOfReturningClients: a call of key's old
// client still running once the key came back as a new client (the old
// client's end waits for it) keeps what it leaves out of the new
// client's: its grant counts, and the URL elicitation IDs its plugin
// issues, which are not the new client's to complete (a review: both
// went by the key's live client, the new one, not the client whose
// instance the call holds).
func TestOldClientsCallKeepsOutOfReturningClients(t *testing.T) {
	h, tool := counterHost(t)
	p := tool.Plugin()
	key := sessions.Client("returning")
	env := func(l *sessions.Lease) *callEnv { return keyedCallEnv(h, tool, key, l) }
	// As returning, with the old client's lease at hand.
	ctx := context.Background()
	l := acquire(t, h, key, p)
	finish := comeBack(t, h, key, p, l)
	e := env(l)
	// Refused unasked (a redirect): counted in the session's record.
	if err := e.AskGrant(ctx, sandbox.GrantRequest{Kind: sandbox.GrantNetwork, Target: "old.example:443", Redirect: true}); err == nil {
		t.Error("a grant for a redirect: given")
	}
	e.issueURLs(&mcp.ElicitParams{Mode: "url", ElicitationID: "old-late", URL: "https://example.com/old-late"})
	e.attach(nil)
	finish()

	for _, s := range h.GrantStatus() {
		if s.Session == key.String() && s.Refused > 0 {
			t.Errorf("the new client's grant counts: %+v; want none of the old client's call", s.GrantCounts)
		}
	}
	if ok, _ := env(nil).spendURL("old-late"); ok {
		t.Error("the new client completed an ID its old client's call issued after the key came back")
	}
}

// A review found URL elicitation IDs issued while the key had no client
// tagged as an ended client's by that client's late call once the key's
// next client was live: the live client's completion of them was then
// refused, its IDs forgotten.
func TestOldClientsCallLeavesClientlessURLsToLiveClient(t *testing.T) {
	h, tool := counterHost(t)
	p := tool.Plugin()
	key := sessions.Client("returning")
	env := func(l *sessions.Lease) *callEnv { return keyedCallEnv(h, tool, key, l) }
	env(nil).issueURLs(&mcp.ElicitParams{Mode: "url", ElicitationID: "clientless", URL: "https://example.com/clientless"})
	l := acquire(t, h, key, p)
	finish := comeBack(t, h, key, p, l)
	e := env(l)
	e.issueURLs(&mcp.ElicitParams{Mode: "url", ElicitationID: "old-late", URL: "https://example.com/old-late"})
	if ok, _ := e.spendURL("clientless"); ok {
		t.Error("the old client's late call completed an ID issued before its key had a client")
	}
	e.attach(nil)
	if ok, why := env(nil).spendURL("clientless"); !ok {
		t.Errorf("the live client's completion of an ID issued before the key had a client: refused (%s)", why)
	}
	finish()
}

// A call of a stateless plugin runs on a pooled instance, with no lease to
// say whose it is: it goes by the key's client when it began. It went by
// the key's live client when it asked, so an old client's late call,
// once the key came back, counted its refusals and issued its URL IDs as
// the new client's.
func TestOldClientsPooledCallKeepsOutOfReturningClients(t *testing.T) {
	h, tool := counterHost(t)
	p := tool.Plugin()
	key := sessions.Client("returning")
	l := acquire(t, h, key, p)
	e := keyedCallEnv(h, tool, key, nil) // the old client's, pooled
	finish := comeBack(t, h, key, p, l)
	if err := e.AskGrant(context.Background(), sandbox.GrantRequest{Kind: sandbox.GrantNetwork, Target: "old.example:443", Redirect: true}); err == nil {
		t.Error("a grant for a redirect: given")
	}
	e.issueURLs(&mcp.ElicitParams{Mode: "url", ElicitationID: "old-pooled", URL: "https://example.com/old-pooled"})
	finish()
	for _, s := range h.GrantStatus() {
		if s.Session == key.String() && s.Refused > 0 {
			t.Errorf("the new client's grant counts: %+v; want none of the old client's pooled call", s.GrantCounts)
		}
	}
	if ok, _ := keyedCallEnv(h, tool, key, nil).spendURL("old-pooled"); ok {
		t.Error("the new client completed an ID its old client's pooled call issued after the key came back")
	}
}
