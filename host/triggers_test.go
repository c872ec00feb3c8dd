package host_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// The everything plugin's triggers change the tool and prompt lists from
// the calling instance, and a client is told: on its session (2025-11-25)
// or on its subscriptions/listen stream (2026-07-28). Over HTTP, the
// go-sdk client.
func TestTriggerListChanges(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	for _, protocol := range []string{"2026-07-28", "2025-11-25"} {
		t.Run(protocol, func(t *testing.T) {
			tools, prompts := make(chan struct{}, 16), make(chan struct{}, 16)
			cs := connectHTTPEra(t, url, protocol, &mcp.ClientOptions{
				ToolListChangedHandler:   func(context.Context, *mcp.ToolListChangedRequest) { tools <- struct{}{} },
				PromptListChangedHandler: func(context.Context, *mcp.PromptListChangedRequest) { prompts <- struct{}{} },
			}, http.DefaultTransport)
			for _, c := range []struct {
				trigger string
				told    chan struct{}
				prompts bool
			}{
				{"test_trigger_tool_change", tools, false},
				{"test_trigger_prompt_change", prompts, true},
			} {
				added := strings.TrimPrefix(strings.TrimPrefix(firstText(call(t, cs, c.trigger, nil)), "added tool "), "added prompt ")
				select {
				case <-c.told:
				case <-time.After(30 * time.Second):
					t.Fatalf("%s: no list_changed", c.trigger)
				}
				if names := listedNames(t, cs, c.prompts); !strings.Contains(" "+strings.Join(names, " ")+" ", " "+added+" ") {
					t.Errorf("%s added %q; the list is %v", c.trigger, added, names)
				}
			}
		})
	}
}

// listedNames lists the tools, or the prompts, a client is served.
func listedNames(t *testing.T, cs *mcp.ClientSession, prompts bool) []string {
	t.Helper()
	var names []string
	if prompts {
		res, err := cs.ListPrompts(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range res.Prompts {
			names = append(names, p.Name)
		}
		return names
	}
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names
}
