package host_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// hyperstrict (internal/testplugins/src/hyperstrict, in Rust with no
// crates) accepts only hyper-mcp's v2 messages, byte for byte in shape, and
// traps on anything else: a message of another shape fails these tests.

// strictContext is the context echo_context and strict://context return.
type strictContext struct {
	ID              any             `json:"id"`
	Meta            json.RawMessage `json:"_meta"`
	SessionID       *string         `json:"session_id"`
	ProtocolVersion *string         `json:"protocol_version"`
}

// checkStrictContext decodes a context the plugin echoed and checks that
// its id is a number or a string and its _meta an object.
func checkStrictContext(t *testing.T, what, raw string) (strictContext, map[string]any) {
	t.Helper()
	var c strictContext
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		t.Fatalf("%s: the context is not JSON: %v: %q", what, err, raw)
	}
	switch c.ID.(type) {
	case float64, string:
	default:
		t.Errorf("%s: context.id = %#v, want a number or a string: %s", what, c.ID, raw)
	}
	var meta map[string]any
	if err := json.Unmarshal(c.Meta, &meta); err != nil || meta == nil {
		t.Errorf("%s: context._meta = %s, want an object: %s", what, c.Meta, raw)
	}
	return c, meta
}

// TestStrictHyperMessages serves hyperstrict over the in-memory transport
// and streamable HTTP, in both protocol eras, and uses all it offers: a
// message the host sends in any other shape than hyper-mcp's traps.
func TestStrictHyperMessages(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"hyperstrict.wasm": testplugins.Test(t, "hyperstrict")})
	url := serveHTTP(t, f)
	for _, transport := range []string{"memory", "http"} {
		for _, proto := range protocols {
			t.Run(transport+"/protocol="+proto, func(t *testing.T) {
				ctx := context.Background()
				client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
				var tr mcp.Transport
				if transport == "memory" {
					st, ct := mcp.NewInMemoryTransports()
					if _, err := f.h.Server().Connect(ctx, st, nil); err != nil {
						t.Fatal(err)
					}
					tr = ct
				} else {
					tr = &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}
				}
				cs, err := client.Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: proto})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { cs.Close() })
				sessionless := cs.InitializeResult().ProtocolVersion >= "2026-07-28"

				tools, err := cs.ListTools(ctx, nil)
				var names []string
				if err == nil {
					for _, tool := range tools.Tools {
						names = append(names, tool.Name)
					}
				}
				if err != nil || cmp.Diff([]string{"echo_context", "roots_changed"}, names) != "" {
					t.Fatalf("tools/list: %v, %v", names, err)
				}

				// The client's _meta, a progress token here, reaches the
				// guest in context._meta.
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo_context", Meta: mcp.Meta{"progressToken": "strict-1"}})
				if err != nil || res.IsError {
					t.Fatalf("echo_context: %v, %v", text(res), err)
				}
				c, meta := checkStrictContext(t, "echo_context", firstText(res))
				if meta["progressToken"] != "strict-1" {
					t.Errorf("echo_context: context._meta = %s, want the client's progressToken", c.Meta)
				}
				if want := sessionLabel(cs.ID()); transport == "http" && !sessionless && (c.SessionID == nil || *c.SessionID != want) {
					t.Errorf("echo_context: context.session_id = %v, want the HTTP session's label %q", c.SessionID, want)
				}
				if pv := cs.InitializeResult().ProtocolVersion; c.ProtocolVersion != nil && *c.ProtocolVersion != pv {
					t.Errorf("echo_context: context.protocol_version = %q, want %q", *c.ProtocolVersion, pv)
				}
				// A call with no _meta gets {}. (A 2026-07-28 client sends
				// its capabilities in every request's _meta.)
				res = call(t, cs, "echo_context", nil)
				if _, meta := checkStrictContext(t, "echo_context without _meta", firstText(res)); res.IsError || (!sessionless && len(meta) != 0) {
					t.Errorf("echo_context without _meta: %q; want _meta {}", text(res))
				}

				prompts, err := cs.ListPrompts(ctx, nil)
				if err != nil || len(prompts.Prompts) != 1 || prompts.Prompts[0].Name != "strict_prompt" {
					t.Fatalf("prompts/list: %+v, %v", prompts, err)
				}
				got, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "strict_prompt", Arguments: map[string]string{"topic": "wasm"}})
				if err != nil || len(got.Messages) != 1 || got.Messages[0].Role != "user" {
					t.Fatalf("prompts/get: %+v, %v", got, err)
				}
				if tc, ok := got.Messages[0].Content.(*mcp.TextContent); !ok || tc.Text != "Tell me about wasm." {
					t.Errorf("prompts/get: message %+v", got.Messages[0].Content)
				}

				resources, err := cs.ListResources(ctx, nil)
				if err != nil || len(resources.Resources) != 1 || resources.Resources[0].URI != "strict://context" {
					t.Fatalf("resources/list: %+v, %v", resources, err)
				}
				templates, err := cs.ListResourceTemplates(ctx, nil)
				if err != nil || len(templates.ResourceTemplates) != 1 || templates.ResourceTemplates[0].URITemplate != "strict://item/{id}" {
					t.Fatalf("resources/templates/list: %+v, %v", templates, err)
				}
				rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "strict://context", Meta: mcp.Meta{"strict": "read"}})
				if err != nil || len(rr.Contents) != 1 {
					t.Fatalf("read strict://context: %+v, %v", rr, err)
				}
				if _, meta := checkStrictContext(t, "strict://context", rr.Contents[0].Text); meta["strict"] != "read" {
					t.Errorf("read strict://context: %s; want the request's _meta in the context", rr.Contents[0].Text)
				}
				rr, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "strict://item/42"})
				if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "item 42" {
					t.Errorf("read strict://item/42: %+v, %v", rr, err)
				}

				for _, c := range []struct {
					name string
					p    mcp.CompleteParams
					want []string
				}{
					{"prompt", mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "strict_prompt"}, Argument: mcp.CompleteParamsArgument{Name: "topic", Value: "a"}}, []string{"alpha"}},
					{"prompt all", mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "strict_prompt"}, Argument: mcp.CompleteParamsArgument{Name: "topic", Value: ""}}, []string{"alpha", "beta"}},
					{"prompt with context", mcp.CompleteParams{
						Ref:      &mcp.CompleteReference{Type: "ref/prompt", Name: "strict_prompt"},
						Argument: mcp.CompleteParamsArgument{Name: "topic", Value: "b"},
						Context:  &mcp.CompleteContext{Arguments: map[string]string{"other": "x"}},
						Meta:     mcp.Meta{"strict": "complete"},
					}, []string{"beta"}},
					{"template", mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "strict://item/{id}"}, Argument: mcp.CompleteParamsArgument{Name: "id", Value: "4"}}, []string{}},
				} {
					comp, err := cs.Complete(ctx, &c.p)
					if err != nil {
						t.Errorf("complete %s: %v", c.name, err)
					} else if diff := cmp.Diff(c.want, comp.Completion.Values); diff != "" {
						t.Errorf("complete %s (-want +got):\n%s", c.name, diff)
					}
				}

				// A trap above threw the session's instance away, and the
				// host tells only instances it holds that roots changed:
				// waiting would only add a minute to the failure.
				if !sessionless && !t.Failed() {
					// The count before: nothing has told this instance yet.
					if got := firstText(call(t, cs, "roots_changed", nil)); got != "0" {
						t.Fatalf("roots_changed = %q before any notification, want 0", got)
					}
					waitRootsChanged(t, f, cs, "1", func() { client.AddRoots(&mcp.Root{URI: "file:///strict", Name: "strict"}) })
				}
			})
		}
	}
	if strings.Contains(f.log.String(), "hyperstrict:") {
		t.Errorf("hyperstrict refused a message; the log:\n%s", f.log.String())
	}
}

// waitRootsChanged calls roots_changed until it answers want. Delivery runs
// after the notification's handler returns, so the count moves some time
// after AddRoots; a trap of on_roots_list_changed (its panic is in the log)
// fails at once rather than at the deadline.
func waitRootsChanged(t *testing.T, f *fixture, cs *mcp.ClientSession, want string, change func()) {
	t.Helper()
	const delivered = "on_roots_list_changed delivered"
	n := strings.Count(f.log.String(), delivered) // the fixture serves other subtests' sessions too
	change()
	f.waitLog(t, delivered, n+1)
	if strings.Contains(f.log.String(), "hyperstrict: on_roots_list_changed") {
		t.Fatalf("on_roots_list_changed trapped; the log:\n%s", f.log.String())
	}
	if res := call(t, cs, "roots_changed", nil); firstText(res) != want || res.IsError {
		t.Fatalf("roots_changed = %q, want %s", text(res), want)
	}
}

// TestStrictPluginTraps calls hyperstrict's exports directly, so that the
// test above can fail: each message here differs from hyper-mcp's by one
// thing, and must trap with the reason in the guest's log, while the good
// ones beside them are served.
func TestStrictPluginTraps(t *testing.T) {
	ctx := context.Background()
	const c = `"context":{"id":7,"_meta":{}}`
	for _, tc := range []struct {
		name, export, input string
		want                string // in the trap's log; "" for a call that succeeds
	}{
		{"list ok", "list_tools", `{"context":{"id":0,"_meta":{},"cursor":"2"}}`, ""},
		{"call ok", "call_tool", `{"request":{"name":"echo_context","arguments":{},"_meta":{"progressToken":1}},"context":{"id":"r1","_meta":{"a":1},"session_id":"s","protocol_version":"2025-11-25"}}`, ""},
		{"complete ok", "complete", `{"request":{"ref":{"type":"prompt","name":"strict_prompt"},"argument":{"name":"topic","value":"a"}},` + c + `}`, ""},
		{"roots ok", "on_roots_list_changed", `{"context":{"_meta":{}}}`, ""},

		{"complete ref/prompt", "complete", `{"request":{"ref":{"type":"ref/prompt","name":"strict_prompt"},"argument":{"name":"topic","value":"a"}},` + c + `}`, `"ref/prompt"`},
		{"complete resource by name", "complete", `{"request":{"ref":{"type":"resource","name":"x"},"argument":{"name":"id","value":""}},` + c + `}`, `lacks "uri"`},
		{"extra top-level key", "list_tools", `{"context":{"id":0,"_meta":{}},"params":{}}`, `has the key "params"`},
		{"servlet shape", "call_tool", `{"params":{"name":"echo_context"}}`, `lacks "request"`},
		{"no context", "list_prompts", `{}`, `lacks "context"`},
		{"id null", "call_tool", `{"request":{"name":"echo_context"},"context":{"id":null,"_meta":{}}}`, "context.id is null"},
		{"no _meta", "read_resource", `{"request":{"uri":"strict://context"},"context":{"id":1}}`, `lacks "_meta"`},
		{"_meta null", "list_resources", `{"context":{"id":0,"_meta":null}}`, "_meta is null, want an object"},
		{"unknown context key", "call_tool", `{"request":{"name":"echo_context"},"context":{"id":1,"_meta":{},"request_id":1}}`, `has the key "request_id"`},
		{"cursor outside a list", "call_tool", `{"request":{"name":"echo_context"},"context":{"id":1,"_meta":{},"cursor":"x"}}`, `has the key "cursor"`},
		{"session_id a number", "list_resource_templates", `{"context":{"id":0,"_meta":{},"session_id":3}}`, "session_id is a number"},
		{"session argument left in", "call_tool", `{"request":{"name":"echo_context","arguments":{"wasmtools_session":"h"}},` + c + `}`, `has the key "wasmtools_session"`},
		{"prompt argument a number", "get_prompt", `{"request":{"name":"strict_prompt","arguments":{"topic":1}},` + c + `}`, "arguments.topic is a number"},
		{"2026 request state", "read_resource", `{"request":{"uri":"strict://context","requestState":"x"},` + c + `}`, `has the key "requestState"`},
		{"roots with an id", "on_roots_list_changed", `{"context":{"id":1,"_meta":{}}}`, `has the key "id"`},
		{"roots without context", "on_roots_list_changed", `{}`, `lacks "context"`},
		{"trailing data", "list_tools", `{"context":{"id":0,"_meta":{}}} {}`, "not valid JSON"},
		{"duplicate key", "list_tools", `{"context":{"id":0,"_meta":{}},"context":{"id":0,"_meta":{}}}`, "duplicate key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := &syncBuffer{}
			rt := testplugins.Runtime(t)
			compiled, err := rt.Compile(ctx, testplugins.Bytes(t, testplugins.Test(t, "hyperstrict")), sandbox.NewPolicy().WithLogger(newTestLogger(log)))
			if err != nil {
				t.Fatal(err)
			}
			inst, err := compiled.Instantiate(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Close(ctx)
			out, err := inst.Call(ctx, tc.export, []byte(tc.input), nil)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("%s %s: %v; log:\n%s", tc.export, tc.input, err, log.String())
				}
				if tc.export != "on_roots_list_changed" && !json.Valid(out) {
					t.Errorf("%s: output is not JSON: %q", tc.export, out)
				}
				return
			}
			var te *sandbox.TrapError
			if !errors.As(err, &te) {
				t.Fatalf("%s %s: %v (output %q); want a trap", tc.export, tc.input, err, out)
			}
			// The log's text format escapes the quotes the reasons use.
			if !strings.Contains(strings.ReplaceAll(log.String(), `\"`, `"`), tc.want) {
				t.Errorf("%s %s: trapped, but the log does not say %s:\n%s", tc.export, tc.input, tc.want, log.String())
			}
		})
	}
}

// sessionLabel is what a guest is told of a stateful HTTP session: a
// digest of its Mcp-Session-Id, never the ID.
func sessionLabel(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "session-" + hex.EncodeToString(sum[:8])
}
