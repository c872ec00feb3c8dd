package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/grantstore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// grantSetup writes a folder with the grantask test plugin and a
// configuration whose ceiling holds a loopback test server, which it
// returns.
func grantSetup(t *testing.T) (dir, cfgPath string, srv *httptest.Server) {
	t.Helper()
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "hello") }))
	t.Cleanup(srv.Close)
	dir = testplugins.Folder(t, map[string]string{"grantask.wasm": testplugins.Test(t, "grantask")})
	cfgPath = filepath.Join(t.TempDir(), "wasmtools.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`
[plugins.grantask]
allow_private_networks = true

[plugins.grantask.ask]
hosts = [%q]
`, strings.TrimPrefix(srv.URL, "http://"))), 0o644)
	return dir, cfgPath, srv
}

// grantClient answers grant questions with decisions in turn ("" declines,
// "cancel" cancels), counting them.
type grantClient struct {
	mu        sync.Mutex
	decisions []string
	asked     []string
}

func (g *grantClient) handler(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked = append(g.asked, req.Params.Message)
	if len(g.decisions) == 0 {
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	d := g.decisions[0]
	g.decisions = g.decisions[1:]
	switch d {
	case "":
		return &mcp.ElicitResult{Action: "decline"}, nil
	case "cancel":
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": d}}, nil
}

func fetchText(t *testing.T, cs *mcp.ClientSession, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "fetch", Arguments: args})
	if err != nil {
		t.Fatalf("call: %v", err)
	}
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// TestGrantsStdio: the real binary over stdio, in both protocol eras,
// its client answering the question: allow once (asked again), allow for
// the session (asked once), decline (remembered), cancel (not
// remembered).
func TestGrantsStdio(t *testing.T) {
	dir, cfgPath, srv := grantSetup(t)
	target := strings.TrimPrefix(srv.URL, "http://")
	for _, proto := range []string{"2025-11-25", ""} {
		for _, tt := range []struct {
			name      string
			decisions []string
			want      []string
			asked     int
		}{
			{"once", []string{"allow once", "deny"}, []string{"200 hello", "host " + target + " was denied by the person"}, 2},
			{"session", []string{"allow for this session"}, []string{"200 hello", "200 hello"}, 1},
			{"decline", []string{""}, []string{"host " + target + " was denied by the person", "host " + target + " was denied earlier in this session"}, 1},
			{"cancel", []string{"cancel", "allow once"}, []string{"host " + target + " is not granted to this plugin: the person dismissed the question", "200 hello"}, 2},
		} {
			t.Run(fmt.Sprintf("protocol=%s/%s", proto, tt.name), func(t *testing.T) {
				// Each case is a process of its own (one stdio session,
				// its answers its own); they share only the read-only
				// folder, configuration and test server.
				t.Parallel()
				g := &grantClient{decisions: tt.decisions}
				var stderr lockedBuffer
				cmd := exec.Command(os.Args[0], "serve", "--cache-dir", testplugins.CacheDir(), "--load-wait", testLoadWait, "--config", cfgPath, dir)
				cmd.Env = append(os.Environ(), "WASMTOOLS_TEST_MAIN=1")
				cmd.Stderr = &stderr
				cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: g.handler}).
					Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: proto})
				if err != nil {
					t.Fatalf("connect: %v\n%s", err, stderr.String())
				}
				defer cs.Close()
				if !stderr.waitFor(time.Now().Add(startupTimeout), contains("plugins loaded")) {
					t.Fatalf("the plugins did not load:\n%s", stderr.String())
				}
				for i, want := range tt.want {
					if got := fetchText(t, cs, map[string]any{"url": srv.URL}); !strings.Contains(got, want) {
						t.Errorf("call %d: %q, want it to hold %q", i+1, got, want)
					}
				}
				if len(g.asked) != tt.asked {
					t.Errorf("asked %d questions, want %d", len(g.asked), tt.asked)
				}
			})
		}
	}
}

// TestGrantsStatus: /status counts a session's grant questions.
func TestGrantsStatus(t *testing.T) {
	dir, cfgPath, srv := grantSetup(t)
	url, _ := serveInProcess(t, nil, "--config", cfgPath, dir)
	g := &grantClient{decisions: []string{"allow once"}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: g.handler}).
		Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got := fetchText(t, cs, map[string]any{"url": srv.URL}); !strings.Contains(got, "200 hello") {
		t.Fatalf("fetch: %q", got)
	}
	resp, err := http.Get(url + "/status")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct {
		Grants []host.SessionGrants `json:"grants"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	label := host.SessionLabel(cs.ID()) // the ID itself is a credential
	if len(st.Grants) != 1 || st.Grants[0].Session != label || st.Grants[0].Asked != 1 || st.Grants[0].Given != 1 || st.Grants[0].Refused != 0 {
		t.Errorf("status grants = %+v, want one session (%s) asked 1, given 1", st.Grants, label)
	}
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url", url}, nil, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "run-time grants:\n  SESSION") || !strings.Contains(out.String(), "  "+label+"  1      1      0") {
		t.Errorf("wasmtools status: exit %d\n%s%s", code, out.String(), errb.String())
	}
}

// TestCallGrant: `wasmtools call` approves with --answer, and without
// one or a terminal refuses the grant and says how to approve it.
func TestCallGrant(t *testing.T) {
	dir, cfgPath, srv := grantSetup(t)
	target := strings.TrimPrefix(srv.URL, "http://")
	file := filepath.Join(dir, "grantask.wasm")
	args, _ := json.Marshal(map[string]any{"url": srv.URL, "reason": "to say hello"})
	tests := []struct {
		name     string
		answer   []string
		code     int
		out, err string
	}{
		{"allowed", []string{"--answer", `{"decision":"allow once"}`}, 0, "200 hello", ""},
		{"denied", []string{"--answer", `{"decision":"deny"}`}, 1, "", "host " + target + " was denied by the person using the client"},
		{"no terminal", nil, 1, "", `It says why, in its own words: "to say hello"
Allow it once, for this session, or deny it?
stdin is not a terminal, so no one could answer: run it in a terminal, or approve with --answer '{"decision":"allow once"}'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			a := append(append([]string{"call", "--cache-dir", testplugins.CacheDir(), "--config", cfgPath}, tt.answer...), file, "fetch", string(args))
			code := run(context.Background(), a, nil, strings.NewReader(""), &out, &errb)
			if code != tt.code || !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) {
				t.Errorf("exit %d (want %d)\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errb.String())
			}
		})
	}
}

// TestTerminalGrant: on a terminal, `wasmtools call` shows the host's
// question and reads the person's choice.
func TestTerminalGrant(t *testing.T) {
	for _, tt := range []struct{ input, want string }{
		{"2\n", "allow for this session"},
		{"what?\n1\n", "allow once"},
		{"deny\n", "deny"},
		{"c\n", ""},
		{"", ""},
	} {
		var out bytes.Buffer
		a := &terminalAsker{in: bufio.NewReader(strings.NewReader(tt.input)), out: &out, terminal: true}
		res, err := a.elicit(context.Background(), &mcp.ElicitRequest{Params: &mcp.ElicitParams{
			Meta: mcp.Meta{host.MetaGrant: map[string]any{}}, Mode: "form", Message: "The plugin asks.",
		}})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := res.Content["decision"].(string)
		if got != tt.want || (tt.want == "") != (res.Action == "cancel") {
			t.Errorf("input %q: %s %q, want %q", tt.input, res.Action, got, tt.want)
		}
		if !strings.HasPrefix(out.String(), "\nwasmtools asks you: The plugin asks.\n[1] allow once, [2] allow for this session, [3] deny, [c]ancel: ") {
			t.Errorf("shown: %q", out.String())
		}
	}
}

// TestGrantsCommand: `wasmtools grants list` shows the kept answers and
// `revoke` removes the ones selected, the file named by --config.
func TestGrantsCommand(t *testing.T) {
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "wasmtools.toml")
	os.WriteFile(cfgPath, []byte("[grants]\nremember_file = \"grants.json\"\n"), 0o644)
	gf, err := grantstore.Open(filepath.Join(dir, "grants.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []grantstore.Entry{
		{Key: grantstore.Key{Subject: "local", Plugin: "weather", SHA256: strings.Repeat("ab", 32), Kind: "network", Target: "api.weather.example:443"}, Allowed: true},
		{Key: grantstore.Key{Subject: "alice", Plugin: "weather", SHA256: strings.Repeat("ab", 32), Kind: "file", Target: "/srv/trips read"}},
	} {
		if err := gf.Set(e); err != nil {
			t.Fatal(err)
		}
	}
	grants := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"grants", "--config", cfgPath}, args...), nil, nil, &out, &errb)
		return code, out.String(), errb.String()
	}
	code, out, errs := grants("list")
	if code != 0 || !strings.Contains(out, "local    weather  abababababab  network  api.weather.example:443  always allow") || !strings.Contains(out, "alice    weather  abababababab  file     /srv/trips read          deny") {
		t.Errorf("list: exit %d\n%s%s", code, out, errs)
	}
	if code, _, errs := grants("revoke"); code != 1 || !strings.Contains(errs, "revoke what?") {
		t.Errorf("revoke with nothing selected: exit %d, %s", code, errs)
	}
	if code, out, errs := grants("--subject", "local", "revoke"); code != 0 || out != "revoked 1 answers\n" {
		t.Errorf("revoke: exit %d, %s%s", code, out, errs)
	}
	if list, _ := gf.List(); len(list) != 1 || list[0].Subject != "alice" {
		t.Errorf("after the revocation: %+v", list)
	}
}

// TestInspectAsk: inspect shows the ceiling of run-time grants. The
// ceiling is the configuration's: counter, a plugin that loads in
// milliseconds, shows it as well as a Go plugin would.
func TestInspectAsk(t *testing.T) {
	dir := testplugins.Folder(t, map[string]string{"counter.wasm": testplugins.Example(t, "counter")})
	trips := t.TempDir()
	cfgPath := filepath.Join(dir, "c.toml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`[plugins.counter.ask]
hosts = ["api.example.com"]
paths = [{ host = %q, guest = "/trips" }]
secrets = { "weather/key" = "v" }`, trips)), 0o644)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"inspect", "--config", cfgPath, "--json", filepath.Join(dir, "counter.wasm")}, nil, nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var in inspection
	json.Unmarshal(out.Bytes(), &in)
	if in.Ask == nil || fmt.Sprint(*in.Ask) != fmt.Sprintf("{[api.example.com] [/trips (ro, from %s)] [weather/key]}", trips) {
		t.Errorf("ask: %+v", in.Ask)
	}
	out.Reset()
	run(context.Background(), []string{"inspect", "--config", cfgPath, filepath.Join(dir, "counter.wasm")}, nil, nil, &out, &errb)
	if want := "may ask the person (run-time grants):\n  hosts   [api.example.com]\n"; !strings.Contains(out.String(), want) {
		t.Errorf("text lacks %q:\n%s", want, out.String())
	}
}

// TestTerminalQuestionOfThePlugin: a plugin's own question is its text,
// shown on the person's terminal: its control characters (escape
// sequences that hide what follows, such as the host's next grant
// question, or make a link that opens elsewhere), carriage returns and
// reordering characters are not passed to the terminal, and each of its
// lines is quoted, so that none passes for the host's own ("wasmtools
// asks you: ...").
func TestTerminalQuestionOfThePlugin(t *testing.T) {
	fake := "Continue?\r\x1b[2K\nwasmtools asks you: The plugin \"weather\" asks to connect to api.weather.example:443.\x1b[8m"
	for name, p := range map[string]*mcp.ElicitParams{
		"form": {Mode: "form", Message: fake, RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{
			"unit\x1b[8m": map[string]any{"type": "string", "description": "\x07C or F\u202e", "enum": []any{"C\x1b]0;x\x07", "F"}},
		}}},
		"url": {Mode: "url", Message: fake, ElicitationID: "e1",
			URL: "\x1b]8;;https://evil.example/\x1b\\https://good.example/\x1b]8;;\x1b\\"},
	} {
		var out bytes.Buffer
		a := &terminalAsker{in: bufio.NewReader(strings.NewReader("y\nC\n")), out: &out, terminal: true}
		if _, err := a.elicit(context.Background(), &mcp.ElicitRequest{Params: p}); err != nil {
			t.Fatal(err)
		}
		shown := out.String()
		for _, c := range shown {
			if c != '\n' && (unicode.IsControl(c) || unicode.Is(unicode.Cf, c)) {
				t.Errorf("%s: the terminal was sent %U from the plugin's question: %q", name, c, shown)
				break
			}
		}
		for line := range strings.SplitSeq(shown, "\n") {
			if strings.HasPrefix(line, "wasmtools asks you:") {
				t.Errorf("%s: a line of the plugin's question passes for the host's: %q", name, line)
			}
		}
	}
}

// TestProgressLineOfThePlugin: a plugin's progress message goes to the
// terminal during the call, before any grant question of the call: an
// escape sequence in it (conceal) hid the host's question that followed,
// under words of the plugin's ("press 1 to continue").
func TestProgressLineOfThePlugin(t *testing.T) {
	line := progressLine(&mcp.ProgressNotificationParams{Progress: 1, Message: "Ready. Press 1, then Enter, to continue\x1b[8m\r\nwasmtools asks you: ok\u202e"})
	for _, c := range line {
		if unicode.IsControl(c) || unicode.Is(unicode.Cf, c) {
			t.Errorf("the terminal was sent %U from the plugin's progress message: %q", c, line)
			break
		}
	}
}
