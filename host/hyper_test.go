package host_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Issue 14: hyper-mcp's plugins run unmodified. hyperhost imports every
// host function hyper-mcp offers; each of its tools returns what the host
// answered.

// tokenServer is an OAuth 2.0 token endpoint on 127.0.0.1 that grants
// client "cc" with secret "pw" the client-credentials grant.
type tokenServer struct {
	*httptest.Server
	requests atomic.Int32
}

func newTokenServer(t *testing.T) *tokenServer {
	ts := &tokenServer{}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := ts.requests.Add(1)
		r.ParseForm()
		id, secret, ok := r.BasicAuth()
		if !ok {
			id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		}
		if r.Method != http.MethodPost || r.PostForm.Get("grant_type") != "client_credentials" || id != "cc" || secret != "pw" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"invalid_client"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":"tok-%d","token_type":"bearer","expires_in":3600,"scope":"read write"}`, n)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func hyperFixture(t *testing.T, tokenURL string, fakeClock bool) *fixture {
	t.Helper()
	host := strings.TrimPrefix(tokenURL, "http://")
	return newFixtureWith(t, nil, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithFakeClock(fakeClock)
		if tokenURL != "" {
			pol = pol.WithNetwork(sandbox.Network{AllowedHosts: []string{host}, AllowPrivate: true})
		}
		return plugins.Options{
			Policy:       &pol,
			Secrets:      map[string]string{"github/bot": "s3cret"},
			AccessTokens: map[string]string{"static-client": "static-token"},
		}
	}, map[string]string{"hyperhost.wasm": testplugins.Test(t, "hyperhost")})
}

// clientKind is a transport and a protocol revision a test runs under.
type clientKind struct{ transport, protocol string }

func (k clientKind) String() string { return k.transport + "/" + k.protocol }

var clientKinds = []clientKind{{"memory", "2025-11-25"}, {"memory", ""}, {"http", "2025-11-25"}, {"http", ""}}

// connectKind connects a go-sdk client with copts and roots to the
// fixture's host over k's transport (url: the fixture served over HTTP).
func connectKind(t *testing.T, f *fixture, url string, k clientKind, copts *mcp.ClientOptions, roots ...*mcp.Root) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts)
	c.AddRoots(roots...)
	var tr mcp.Transport
	if k.transport == "memory" {
		st, ct := mcp.NewInMemoryTransports()
		if _, err := f.h.Server().Connect(ctx, st, nil); err != nil {
			t.Fatal(err)
		}
		tr = ct
	} else {
		tr = &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}
	}
	cs, err := c.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: k.protocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callText calls tool and returns its text, failing on a refusal.
func callText(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	return firstText(res), res.IsError
}

func TestHyperHostFunctions(t *testing.T) {
	ts := newTokenServer(t)
	f := hyperFixture(t, ts.URL, false)
	url := serveHTTP(t, f)
	for _, k := range clientKinds {
		t.Run(k.String(), func(t *testing.T) {
			t.Run("list_roots", func(t *testing.T) {
				cs := connectKind(t, f, url, k, nil, &mcp.Root{URI: "file:///srv/project", Name: "project"})
				if got, _ := callText(t, cs, "roots", nil); !strings.Contains(got, `"uri":"file:///srv/project"`) {
					t.Errorf("roots of a client with roots: %s", got)
				}
				cs = connectKind(t, f, url, k, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
				if got, _ := callText(t, cs, "roots", nil); !strings.Contains(got, `"roots":[]`) || !strings.Contains(got, "does not offer roots") {
					t.Errorf("roots of a client without roots: %s", got)
				}
			})
			t.Run("get_keyring_secret", func(t *testing.T) {
				cs := connectKind(t, f, url, k, nil)
				if got, isErr := callText(t, cs, "secret", map[string]any{"service": "github", "user": "bot"}); got != "s3cret" || isErr {
					t.Errorf("granted secret = %q (isError %v)", got, isErr)
				}
				got, isErr := callText(t, cs, "secret", map[string]any{"service": "github", "user": "admin"})
				if !isErr || !strings.Contains(got, `"github/admin" is not granted`) || !strings.Contains(got, "[plugins.hyperhost.secrets]") {
					t.Errorf("ungranted secret: %q (isError %v)", got, isErr)
				}
				if strings.Contains(got, "wazero") || strings.Contains(got, "wasm stack trace") {
					t.Errorf("the client sees wazero's internals: %q", got)
				}
			})
			t.Run("create_elicitation without the capability", func(t *testing.T) {
				cs := connectKind(t, f, url, k, nil)
				got, _ := callText(t, cs, "elicit", nil)
				var a struct {
					Action  string         `json:"action"`
					Content map[string]any `json:"content"`
				}
				if json.Unmarshal([]byte(got), &a); a.Action != "decline" || a.Content["error"] != "the client does not offer elicitation" {
					t.Errorf("answer = %s; want hyper-mcp's decline with content.error", got)
				}
			})
			t.Run("notify_url_elicitation_completed", func(t *testing.T) {
				var mu sync.Mutex
				var completed []string
				cs := connectKind(t, f, url, k, &mcp.ClientOptions{
					Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
					ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
						return &mcp.ElicitResult{Action: "accept"}, nil
					},
					ElicitationCompleteHandler: func(_ context.Context, r *mcp.ElicitationCompleteNotificationRequest) {
						mu.Lock()
						completed = append(completed, r.Params.ElicitationID)
						mu.Unlock()
						activity.fire()
					},
				})
				if got, _ := callText(t, cs, "url_elicit", nil); !strings.Contains(got, `"action":"accept"`) {
					t.Errorf("url elicitation: %s", got)
				}
				eventually(t, "notifications/elicitation/complete", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(completed) == 1 && completed[0] == "signin-1"
				})
			})
			t.Run("create_message", func(t *testing.T) {
				cs := connectKind(t, f, url, k, &mcp.ClientOptions{
					CreateMessageHandler: func(_ context.Context, r *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
						return &mcp.CreateMessageResult{Role: "assistant", Model: "test-model", Content: &mcp.TextContent{Text: "hi back"}}, nil
					},
				})
				if got, _ := callText(t, cs, "sample", nil); !strings.Contains(got, `"model":"test-model"`) || !strings.Contains(got, "hi back") {
					t.Errorf("sampling: %s", got)
				}
			})
			t.Run("notifications", func(t *testing.T) {
				var pl progressLog
				var logs, updates atomic.Int32
				cs := connectKind(t, f, url, k, &mcp.ClientOptions{
					ProgressNotificationHandler: pl.handler,
					LoggingMessageHandler:       func(context.Context, *mcp.LoggingMessageRequest) { logs.Add(1); activity.fire() },
					ResourceUpdatedHandler:      func(context.Context, *mcp.ResourceUpdatedNotificationRequest) { updates.Add(1); activity.fire() },
				})
				subscribed := k.protocol != "" // 2026-07-28 has no resources/subscribe
				if subscribed {
					if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "hyper://state"}); err != nil {
						t.Fatal(err)
					}
				}
				params := &mcp.CallToolParams{Name: "notify", Meta: mcp.Meta{"progressToken": "p1", mcp.MetaKeyLogLevel: "info"}}
				if k.protocol != "" {
					cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "info"})
				}
				res, err := cs.CallTool(context.Background(), params)
				if err != nil || res.IsError {
					t.Fatalf("notify: %v %v", err, res)
				}
				if got := firstText(res); !strings.HasPrefix(got, "notified (request ") || strings.Contains(got, "<nil>") {
					t.Errorf("the guest's context has no request id: %q", got)
				}
				eventually(t, "the progress and the log message", func() bool { return len(pl.all()) == 1 && logs.Load() == 1 })
				if subscribed {
					eventually(t, "notifications/resources/updated", func() bool { return updates.Load() == 1 })
				}
			})
			t.Run("get_access_token", func(t *testing.T) {
				cs := connectKind(t, f, url, k, nil)
				token := func(creds map[string]any) map[string]any {
					t.Helper()
					got, isErr := callText(t, cs, "token", map[string]any{"credentials": creds})
					var m map[string]any
					if err := json.Unmarshal([]byte(got), &m); err != nil || isErr {
						t.Fatalf("token: %q (isError %v)", got, isErr)
					}
					return m
				}
				if got := token(map[string]any{"client_id": "static-client", "token_endpoint_url": "https://auth.invalid/token"}); got["AccessToken"].(map[string]any)["access_token"] != "static-token" {
					t.Errorf("configured token: %v", got)
				}
				before := ts.requests.Load()
				creds := map[string]any{"client_id": "cc", "client_secret": "pw", "token_endpoint_url": ts.URL + "/token", "scopes": []string{"read"}, "auth_type": "BasicAuth"}
				first := token(creds)
				at, _ := first["AccessToken"].(map[string]any)
				if at == nil || !strings.HasPrefix(fmt.Sprint(at["access_token"]), "tok-") || at["expires_at"] == nil {
					t.Fatalf("client-credentials token: %v", first)
				}
				// The host keeps the token until shortly before it expires:
				// one request at most (none once an earlier client got it).
				if again := token(creds); fmt.Sprint(again) != fmt.Sprint(first) || ts.requests.Load()-before > 1 {
					t.Errorf("the token is not cached: %v then %v (%d requests)", first, again, ts.requests.Load()-before)
				}
				if got := token(map[string]any{"client_id": "cc", "client_secret": "wrong", "token_endpoint_url": ts.URL + "/token"}); !strings.Contains(fmt.Sprint(got["Error"]), "invalid_client") {
					t.Errorf("refused credentials: %v", got)
				}
				if got := token(map[string]any{"client_id": "cc", "client_secret": "pw", "token_endpoint_url": "http://127.0.0.2:9/token"}); !strings.Contains(fmt.Sprint(got["Error"]), "127.0.0.2") {
					t.Errorf("an endpoint outside the grant: %v; want an error naming the host", got)
				}
				if got := token(map[string]any{"client_id": "cc", "token_endpoint_url": ts.URL + "/token", "device_authorization_url": ts.URL + "/device"}); !strings.Contains(fmt.Sprint(got["Error"]), "device-code") {
					t.Errorf("device flow: %v", got)
				}
			})
		})
	}
}

// TestClocks: a guest reads the real time by default, and the fixed epoch
// with a fake clock.
func TestClocks(t *testing.T) {
	real := hyperFixture(t, "", false)
	cs := real.connect(t, "", nil)
	before := time.Now()
	got, _ := callText(t, cs, "now", nil)
	after := time.Now()
	now, err := time.Parse(time.RFC3339Nano, got)
	if err != nil || now.Before(before.Add(-time.Second)) || now.After(after.Add(time.Second)) {
		t.Errorf("guest time %q (%v), want within a second of [%v, %v]", got, err, before, after)
	}
	fake := hyperFixture(t, "", true)
	cs = fake.connect(t, "", nil)
	if got, _ := callText(t, cs, "now", nil); !strings.HasPrefix(got, "2022-01-01T00:00:00") {
		t.Errorf("guest time with a fake clock: %q, want 2022-01-01T00:00:00…", got)
	}
}

// TestEmptyResourceText: a text resource whose text is empty is sent with
// "text": "" (the notes example with no notes), which clients that
// validate results require.
func TestEmptyResourceText(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	for _, proto := range protocols {
		var wire syncBuffer
		ctx := context.Background()
		st, ct := mcp.NewInMemoryTransports()
		if _, err := f.h.Server().Connect(ctx, st, nil); err != nil {
			t.Fatal(err)
		}
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.LoggingTransport{Transport: ct, Writer: &wire}, &mcp.ClientSessionOptions{ProtocolVersion: proto})
		if err != nil {
			t.Fatal(err)
		}
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "notes://all"})
		cs.Close()
		if err != nil || len(res.Contents) != 1 || res.Contents[0].Text != "" {
			t.Fatalf("%s: read notes://all: %v %v", proto, res, err)
		}
		var sent bool
		for _, line := range bytes.Split([]byte(wire.String()), []byte("\n")) {
			if bytes.Contains(line, []byte(`"contents"`)) && bytes.Contains(line, []byte(`"text":""`)) {
				sent = true
			}
		}
		if !sent {
			t.Errorf("%s: the result on the wire has no \"text\":\"\":\n%s", proto, wire.String())
		}
	}
}

// methodCounter counts the HTTP requests of each MCP method (by the
// Mcp-Method header the go-sdk client sends on 2026-07-28 requests, or
// the JSON-RPC method of the body).
type methodCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *methodCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	method := r.Header.Get("Mcp-Method")
	if method == "" && r.Body != nil && r.Method == http.MethodPost {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		var m struct {
			Method string `json:"method"`
		}
		json.Unmarshal(b, &m)
		method = m.Method
	}
	c.mu.Lock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[method]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *methodCounter) count(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[method]
}

// askingClient answers every kind of question: a name, a greeting from
// its "model", and one root.
func askingClient(sampling bool) *mcp.ClientOptions {
	o := &mcp.ClientOptions{
		ElicitationHandler: func(_ context.Context, r *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": "Alice", "context": "ctx-1"}}, nil
		},
	}
	if sampling {
		o.CreateMessageHandler = func(context.Context, *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			return &mcp.CreateMessageResult{Role: "assistant", Model: "m", Content: &mcp.TextContent{Text: "Hello there!"}}, nil
		}
	}
	return o
}

func connectCounted(t *testing.T, url, protocol string, copts *mcp.ClientOptions, counter *methodCounter, roots ...*mcp.Root) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts)
	c.AddRoots(roots...)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: counter}}, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestSeveralInputsInOneRound (issue 15, item 2): request_inputs asks an
// elicitation, a sampling request and the roots at once: one input-required
// round for a 2026-07-28 client, server requests in turn before; a request
// the client cannot be asked is refused alone.
func TestSeveralInputsInOneRound(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			var counter methodCounter
			cs := connectCounted(t, url, proto, askingClient(true), &counter, &mcp.Root{URI: "file:///srv", Name: "srv"})
			got, isErr := callText(t, cs, "test_input_required_result_multiple_inputs", nil)
			if isErr || got != "Received 3 answers (client_roots, greeting, user_name); refused: map[]" {
				t.Errorf("all three asked: %q (isError %v)", got, isErr)
			}
			if n := counter.count("tools/call"); proto == "" && n != 2 {
				t.Errorf("the 2026-07-28 client made %d tools/call requests; want 2, one round for the three", n)
			}
			cs = connectCounted(t, url, proto, askingClient(false), &counter, &mcp.Root{URI: "file:///srv", Name: "srv"})
			if got, _ := callText(t, cs, "test_input_required_result_multiple_inputs", nil); got != "Received 2 answers (client_roots, user_name); refused: map[greeting:the client does not offer sampling]" {
				t.Errorf("without sampling: %q", got)
			}
			got, _ = callText(t, cs, "test_input_required_result_list_roots", nil)
			if got != "Client roots: [file:///srv]" {
				t.Errorf("roots alone: %q", got)
			}
		})
	}
}

// TestRequestsThatAsk (issue 15, item 3): prompts, resource reads and
// completions may ask the client, parked and resumed like tool calls for
// 2026-07-28 clients (a completion cannot be: its result has no input
// requests), asked with server requests before.
func TestRequestsThatAsk(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{
		"everything.wasm": testplugins.Example(t, "everything"),
		"hyperhost.wasm":  testplugins.Test(t, "hyperhost"),
	})
	url := serveHTTP(t, f)
	ctx := context.Background()
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			var counter methodCounter
			cs := connectCounted(t, url, proto, askingClient(false), &counter, &mcp.Root{URI: "file:///srv", Name: "srv"})
			p, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "test_input_required_result_prompt"})
			if err != nil || len(p.Messages) != 1 || p.Messages[0].Content.(*mcp.TextContent).Text != "Context (accept): ctx-1" {
				t.Fatalf("prompt that asks: %v %v", p, err)
			}
			if n := counter.count("prompts/get"); proto == "" && n != 2 {
				t.Errorf("prompts/get requests: %d, want 2 (an input-required round)", n)
			}
			p, err = cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "rooted"})
			if err != nil || !strings.Contains(p.Messages[0].Content.(*mcp.TextContent).Text, "file:///srv") {
				t.Errorf("prompt that asks for roots: %v %v", p, err)
			}
			r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "hyper://roots"})
			if err != nil || !strings.Contains(r.Contents[0].Text, "file:///srv") {
				t.Errorf("resource that asks for roots: %v %v", r, err)
			}
			c, err := cs.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "rooted"}, Argument: mcp.CompleteParamsArgument{Name: "root"}})
			want := []string{"srv"}
			if proto == "" {
				want = []string{} // refused: the guest gets no roots
			}
			if err != nil || fmt.Sprint(c.Completion.Values) != fmt.Sprint(want) {
				t.Errorf("completion that asks: %v %v, want values %v", c, err, want)
			}
		})
	}
}
