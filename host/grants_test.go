package host_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/grantstore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// grantFixture serves the grantask test plugin with a ceiling of one
// loopback test server (which it returns, with its host:port) and the
// secret weather/key, and nothing granted.
func grantFixture(t *testing.T, opts *host.Options) (*fixture, *httptest.Server, string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") }))
	t.Cleanup(srv.Close)
	target := strings.TrimPrefix(srv.URL, "http://")
	f := newFixtureWith(t, opts, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{target}, AllowPrivate: true})
		return plugins.Options{Policy: &pol, AskSecrets: map[string]string{"weather/key": "k3y"}}
	}, map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")})
	return f, srv, target
}

// grantAnswerer answers grant questions with decisions in turn ("" for
// the action "decline", "cancel" for "cancel"), recording each question.
type grantAnswerer struct {
	mu        sync.Mutex
	decisions []string
	asked     []*mcp.ElicitParams
}

func (a *grantAnswerer) handler(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, req.Params)
	if len(a.decisions) == 0 {
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	d := a.decisions[0]
	a.decisions = a.decisions[1:]
	switch d {
	case "":
		return &mcp.ElicitResult{Action: "decline"}, nil
	case "cancel":
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": d}}, nil
}

func (a *grantAnswerer) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.asked)
}

// grantSession calls tools in one session, passing back the session
// handle a 2026-07-28 HTTP client is given.
type grantSession struct {
	cs     *mcp.ClientSession
	handle string
}

func (s *grantSession) call(t *testing.T, tool string, args map[string]any) string {
	t.Helper()
	if s.handle != "" {
		args[host.SessionArgument] = s.handle
	}
	res := call(t, s.cs, tool, args)
	if h := handleOf(res); h != "" {
		s.handle = h
	}
	return firstText(res)
}

// transports connect a client over in-memory (stdio's framing aside, the
// same server session as stdio) and over streamable HTTP.
var grantTransports = []string{"memory", "http"}

func (f *fixture) connectOver(t *testing.T, transport, proto, url string, copts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	if transport == "http" {
		cs := connectHTTPEra(t, url, proto, copts, nil)
		// A 2026-07-28 client learns from the list which parameters go
		// in headers (the session handle does).
		if _, err := cs.ListTools(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	return f.connect(t, proto, copts)
}

// TestGrantAnswers: the person's answers, through a real go-sdk client
// in both protocol eras over in-memory and HTTP transports: allow once
// (asked again next time), allow for the session (not asked again),
// decline and deny (remembered: not asked again), cancel (not
// remembered); a plugin reaches the loopback server only once allowed.
func TestGrantAnswers(t *testing.T) {
	f, srv, target := grantFixture(t, nil)
	url := serveHTTP(t, f)
	refusedNow := "request to " + target + " refused: host " + target + " was denied by the person using the client"
	refusedBefore := "host " + target + " was denied earlier in this session by the person using the client"
	dismissed := "host " + target + " is not granted to this plugin: the person dismissed the question"
	tests := []struct {
		name      string
		decisions []string
		want      []string // each call's result holds it
		asked     int
	}{
		{"allow once", []string{"allow once", "deny"}, []string{"200 hello", refusedNow}, 2},
		{"allow for this session", []string{"allow for this session"}, []string{"200 hello", "200 hello", "200 hello"}, 1},
		{"deny remembered", []string{"deny"}, []string{refusedNow, refusedBefore}, 1},
		{"decline remembered", []string{""}, []string{refusedNow, refusedBefore}, 1},
		{"cancel not remembered", []string{"cancel", "allow for this session"}, []string{dismissed, "200 hello", "200 hello"}, 2},
	}
	for _, transport := range grantTransports {
		for _, proto := range protocols {
			for _, tt := range tests {
				t.Run(fmt.Sprintf("%s/protocol=%s/%s", transport, proto, tt.name), func(t *testing.T) {
					a := &grantAnswerer{decisions: tt.decisions}
					s := &grantSession{cs: f.connectOver(t, transport, proto, url, &mcp.ClientOptions{ElicitationHandler: a.handler})}
					for i, want := range tt.want {
						if got := s.call(t, "fetch", map[string]any{"url": srv.URL}); !strings.Contains(got, want) {
							t.Errorf("call %d: %q, want it to hold %q", i+1, got, want)
						}
					}
					if got := a.count(); got != tt.asked {
						t.Errorf("asked %d questions, want %d", got, tt.asked)
					}
				})
			}
		}
	}
}

// TestGrantQuestionText: the host writes the question; the plugin's
// reason is shown quoted, control characters removed, and bounded.
func TestGrantQuestionText(t *testing.T) {
	f, srv, target := grantFixture(t, nil)
	var sum string
	for _, p := range f.h.Catalogue().Plugins() {
		sum = p.SHA256()
	}
	for _, proto := range protocols {
		a := &grantAnswerer{decisions: []string{"allow once", "allow once", "allow once"}}
		cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: a.handler})
		call(t, cs, "fetch", map[string]any{"url": srv.URL, "reason": "to read\x07 the\nweather \"now\"\x1b[31m"})
		call(t, cs, "fetch", map[string]any{"url": srv.URL})
		call(t, cs, "fetch", map[string]any{"url": srv.URL, "reason": strings.Repeat("é", 300)})
		want := []string{
			`The plugin "grantask" (sha256 ` + sum + `) asks to connect to ` + target + `.
It says why, in its own words: "to read the weather \"now\"[31m"
Allow it once, for this session, or deny it?`,
			`The plugin "grantask" (sha256 ` + sum + `) asks to connect to ` + target + `.
It gives no reason.
Allow it once, for this session, or deny it?`,
			`The plugin "grantask" (sha256 ` + sum + `) asks to connect to ` + target + `.
It says why, in its own words: "` + strings.Repeat("é", 200) + `"
Allow it once, for this session, or deny it?`,
		}
		checkQuestions(t, proto, a.asked, want)
		for _, q := range a.asked {
			if q.Mode != "form" && q.Mode != "" {
				t.Errorf("%s: mode %q, want form", proto, q.Mode)
			}
			if got := fmt.Sprint(q.RequestedSchema); got != "map[properties:map[decision:map[enum:[allow once allow for this session deny] title:Decision type:string]] required:[decision] type:object]" {
				t.Errorf("%s: schema %s", proto, got)
			}
		}
	}
}

// checkQuestions checks the text of each question asked.
func checkQuestions(t *testing.T, proto string, asked []*mcp.ElicitParams, want []string) {
	t.Helper()
	if len(asked) != len(want) {
		t.Fatalf("%s: asked %d questions, want %d", proto, len(asked), len(want))
	}
	for i, q := range asked {
		if q.Message != want[i] {
			t.Errorf("%s: question %d:\n%s\nwant\n%s", proto, i+1, q.Message, want[i])
		}
	}
}

// TestGrantRefusedWithoutAsking: outside the ceiling, nothing is asked;
// a client without elicitation gets a refusal saying one with it could
// approve the grant; the per-session cap stops a plugin asking again and
// again; another session's answer counts for nothing.
func TestGrantRefusedWithoutAsking(t *testing.T) {
	log := &syncBuffer{}
	f, srv, target := grantFixture(t, &host.Options{MaxGrantQuestions: 2, RecordLog: log})
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "other") }))
	defer other.Close()
	for _, proto := range protocols {
		a := &grantAnswerer{decisions: []string{"allow for this session"}}
		cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: a.handler})
		otherTarget := strings.TrimPrefix(other.URL, "http://")
		if got := text(call(t, cs, "fetch", map[string]any{"url": other.URL})); !strings.Contains(got, `needs "`+otherTarget+`" in allowed_hosts`) || a.count() != 0 {
			t.Errorf("%s: outside the ceiling: %q, %d questions; want refused unasked", proto, got, a.count())
		}
		if got := text(call(t, cs, "fetch", map[string]any{"url": srv.URL})); !strings.Contains(got, "200 hello") {
			t.Errorf("%s: allowed: %q", proto, got)
		}

		// Another session, whose client cannot ask, learns nothing of the
		// first one's grant.
		mute := f.connect(t, proto, nil)
		want := "host " + target + " is not granted to this plugin; the operator allows it to be approved at run time, but the client does not offer elicitation: a client that supports elicitation could approve it"
		if got := text(call(t, mute, "fetch", map[string]any{"url": srv.URL})); !strings.Contains(got, want) {
			t.Errorf("%s: no elicitation: %q, want it to hold %q", proto, got, want)
		}

		// The cap: two questions a session, dismissed, then no more.
		pest := &grantAnswerer{decisions: []string{"cancel", "cancel", "allow for this session"}}
		ps := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: pest.handler})
		for range 2 {
			call(t, ps, "fetch", map[string]any{"url": srv.URL})
		}
		if got := text(call(t, ps, "fetch", map[string]any{"url": srv.URL})); !strings.Contains(got, "this session was asked the most grant questions it may be (2)") || pest.count() != 2 {
			t.Errorf("%s: past the cap: %q, %d questions; want refused after 2", proto, got, pest.count())
		}
	}
	// Counts per session in the status, events in the record log.
	var asked, given, refused int
	for _, s := range f.h.GrantStatus() {
		asked, given, refused = asked+s.Asked, given+s.Given, refused+s.Refused
	}
	if asked != 6 || given != 2 || refused != 8 {
		t.Errorf("status: asked %d given %d refused %d, want 6, 2 and 8 (%+v)", asked, given, refused, f.h.GrantStatus())
	}
	for _, want := range []string{`"grant":{"kind":"network","target":"` + target + `","event":"asked"}`, `"event":"given","how":"session"`, `"event":"refused","how":"cannot-ask"`, `"event":"refused","how":"cap"`, `"event":"refused","how":"dismissed"`} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("record log lacks %s:\n%s", want, log.String())
		}
	}
}

// TestGrantSecret: a secret in the ceiling is served once approved, and
// one outside it is refused unasked.
func TestGrantSecret(t *testing.T) {
	f, _, _ := grantFixture(t, nil)
	for _, proto := range protocols {
		a := &grantAnswerer{decisions: []string{"allow for this session"}}
		cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: a.handler})
		if got := text(call(t, cs, "secret", map[string]any{"name": "weather/key", "reason": "to sign requests"})); got != "secret: k3y" {
			t.Errorf("%s: secret: %q", proto, got)
		}
		if got := text(call(t, cs, "secret", map[string]any{"name": "weather/key"})); got != "secret: k3y" || a.count() != 1 {
			t.Errorf("%s: secret again: %q after %d questions", proto, got, a.count())
		}
		if len(a.asked) > 0 && !strings.Contains(a.asked[0].Message, `asks for the secret "weather/key".`) {
			t.Errorf("%s: question %q", proto, a.asked[0].Message)
		}
		if got := text(call(t, cs, "secret", map[string]any{"name": "other/key"})); !strings.Contains(got, `secret "other/key" is not granted`) || a.count() != 1 {
			t.Errorf("%s: outside the ceiling: %q after %d questions", proto, got, a.count())
		}
	}
}

// TestGrantFolder: a folder in the ceiling is read once the person allows
// it, for the session; changing a read-write one asks again, for
// changing.
func TestGrantFolder(t *testing.T) {
	ro, rw := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(ro, "a.txt"), []byte("hello"), 0o644)
	f := newFixtureWith(t, nil, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithAskMounts(sandbox.Mount{HostPath: ro, GuestPath: "/docs", ReadOnly: true}, sandbox.Mount{HostPath: rw, GuestPath: "/out"})
		return plugins.Options{Policy: &pol}
	}, map[string]string{"grants.wasm": testplugins.Test(t, "grants")})
	sum := f.h.Catalogue().Plugins()[0].SHA256()
	for _, proto := range protocols {
		a := &grantAnswerer{decisions: []string{"allow for this session", "allow once", "deny"}}
		cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: a.handler})
		for i, want := range []string{"hello", "hello"} {
			if got := text(call(t, cs, "read", map[string]any{"path": "/docs/a.txt"})); got != want {
				t.Errorf("%s: read %d: %q", proto, i+1, got)
			}
		}
		if got := text(call(t, cs, "write", map[string]any{"path": "/out/b.txt", "text": "x"})); got != "written" {
			t.Errorf("%s: write: %q", proto, got)
		}
		if got := text(call(t, cs, "write", map[string]any{"path": "/out/c.txt", "text": "x"})); got != "error: open /out/c.txt: Permission denied" {
			t.Errorf("%s: write denied: %q", proto, got)
		}
		want := []string{
			`The plugin "grants" (sha256 ` + sum + `) asks to read the files in the folder ` + ro + `.
It gives no reason.
Allow it once, for this session, or deny it?`,
			`The plugin "grants" (sha256 ` + sum + `) asks to read and change the files in the folder ` + rw + `.
It gives no reason.
Allow it once, for this session, or deny it?`,
			`The plugin "grants" (sha256 ` + sum + `) asks to read and change the files in the folder ` + rw + `.
It gives no reason.
Allow it once, for this session, or deny it?`,
		}
		checkQuestions(t, proto, a.asked, want)

		// Changing allowed covers reading; reading denied denies changing.
		both := &grantAnswerer{decisions: []string{"allow for this session"}}
		cs = f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: both.handler})
		if got := text(call(t, cs, "write", map[string]any{"path": "/out/d.txt", "text": "x"})); got != "written" {
			t.Errorf("%s: write: %q", proto, got)
		}
		if got := text(call(t, cs, "list", map[string]any{"path": "/out"})); !strings.Contains(got, "d.txt") || both.count() != 1 {
			t.Errorf("%s: list after read-write for the session: %q after %d questions, want listed unasked", proto, got, both.count())
		}
		none := &grantAnswerer{decisions: []string{"deny"}}
		cs = f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: none.handler})
		call(t, cs, "list", map[string]any{"path": "/out"})
		if got := text(call(t, cs, "write", map[string]any{"path": "/out/e.txt", "text": "x"})); got != "error: open /out/e.txt: Permission denied" || none.count() != 1 {
			t.Errorf("%s: write after reading was denied: %q after %d questions, want refused unasked", proto, got, none.count())
		}
	}
	if _, err := os.Stat(filepath.Join(rw, "c.txt")); err == nil {
		t.Error("a denied write made its file")
	}
}

// TestGrantRemembered: with a grant file, "always allow" and "deny" hold
// for the subject's later sessions ("local" for in-memory and stdio ones)
// until revoked; an HTTP session with no subject is not offered "always".
func TestGrantRemembered(t *testing.T) {
	gf, err := grantstore.Open(filepath.Join(t.TempDir(), "grants.json"))
	if err != nil {
		t.Fatal(err)
	}
	f, srv, target := grantFixture(t, &host.Options{GrantFile: gf})
	fetch := func(cs *mcp.ClientSession) string {
		return text(call(t, cs, "fetch", map[string]any{"url": srv.URL}))
	}
	a := &grantAnswerer{decisions: []string{"always allow"}}
	if got := fetch(f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: a.handler})); !strings.Contains(got, "200 hello") {
		t.Fatalf("always allow: %q", got)
	}
	if len(a.asked) != 1 || !strings.HasSuffix(a.asked[0].Message, "\nAllow it once, for this session, always, or deny it?") ||
		fmt.Sprint(a.asked[0].RequestedSchema.(map[string]any)["properties"]) != "map[decision:map[enum:[allow once allow for this session always allow deny] title:Decision type:string]]" {
		t.Fatalf("question: %+v", a.asked)
	}
	list, _ := gf.List()
	if len(list) != 1 || list[0].Subject != "local" || list[0].Target != target || !list[0].Allowed || list[0].Plugin != "grantask" {
		t.Fatalf("file: %+v", list)
	}
	// Another session of the same subject, in the other era: not asked.
	b := &grantAnswerer{decisions: []string{"deny"}}
	later := f.connect(t, "", &mcp.ClientOptions{ElicitationHandler: b.handler})
	if got := fetch(later); !strings.Contains(got, "200 hello") || b.count() != 0 {
		t.Fatalf("later session: %q after %d questions, want allowed unasked", got, b.count())
	}
	// Revoked: asked again at once, in the same session; denied, kept.
	if n, err := gf.Revoke(func(grantstore.Entry) bool { return true }); n != 1 || err != nil {
		t.Fatalf("revoke: %d %v", n, err)
	}
	if got := fetch(later); !strings.Contains(got, "was denied by the person") || b.count() != 1 {
		t.Fatalf("after the revocation: %q after %d questions", got, b.count())
	}
	c := &grantAnswerer{}
	if got := fetch(f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: c.handler})); !strings.Contains(got, "was denied by the person using the client, who said to remember it") || c.count() != 0 {
		t.Fatalf("a third session: %q after %d questions, want refused unasked", got, c.count())
	}
	// Over HTTP with no subject: nothing outlives the session.
	d := &grantAnswerer{decisions: []string{"allow once"}}
	cs := connectHTTPEra(t, serveHTTP(t, f), "2025-11-25", &mcp.ClientOptions{ElicitationHandler: d.handler}, nil)
	fetch(cs)
	if len(d.asked) != 1 || !strings.HasSuffix(d.asked[0].Message, "\nAllow it once, for this session, or deny it?") {
		t.Errorf("HTTP without a subject: %+v", d.asked)
	}
}

// TestGrantRememberedLocalNotATenant: "local" in the grant file is the
// person running a stdio (or in-memory) session; an HTTP tenant whose
// subject happens to be named "local" is not that person, and gets none
// of the answers kept for it. (A red team: [http.tokens] local = "…"
// was served every "always allow" the person at the machine had given,
// unasked.)
func TestGrantRememberedLocalNotATenant(t *testing.T) {
	gf, err := grantstore.Open(filepath.Join(t.TempDir(), "grants.json"))
	if err != nil {
		t.Fatal(err)
	}
	f, srv, _ := grantFixture(t, &host.Options{GrantFile: gf})
	fetch := func(cs *mcp.ClientSession) string {
		return text(call(t, cs, "fetch", map[string]any{"url": srv.URL}))
	}
	a := &grantAnswerer{decisions: []string{"always allow"}}
	if got := fetch(f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: a.handler})); !strings.Contains(got, "200 hello") {
		t.Fatalf("always allow: %q", got)
	}
	const token = "local-tenant-token-0123456789"
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"local": token}})
	b := &grantAnswerer{decisions: []string{"deny"}}
	tenant := connectHTTPEra(t, url, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: b.handler}, tenantTransport{token: token})
	if got := fetch(tenant); b.count() != 1 || strings.Contains(got, "200 hello") {
		t.Errorf("the HTTP tenant named local: %q after %d questions; want asked, and denied", got, b.count())
	}
	if list, _ := gf.List(); len(list) != 1 || !list[0].Allowed {
		t.Errorf("grant file: %+v; want the person's one answer, unchanged", list)
	}
}
