package host_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

func TestPromptsAndResources(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"notes.wasm": testplugins.Example(t, "notes")})
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			ctx := context.Background()
			a, b := f.connect(t, proto, nil), f.connect(t, proto, nil)
			call(t, a, "note_add", map[string]any{"text": "buy milk"})
			call(t, a, "note_add", map[string]any{"text": "call bob"})
			call(t, b, "note_add", map[string]any{"text": "b's own"})

			prompts, err := a.ListPrompts(ctx, nil)
			if err != nil || len(prompts.Prompts) != 1 || prompts.Prompts[0].Name != "summarize_notes" || len(prompts.Prompts[0].Arguments) != 1 {
				t.Fatalf("prompts/list: %+v, %v", prompts, err)
			}
			got, err := a.GetPrompt(ctx, &mcp.GetPromptParams{Name: "summarize_notes", Arguments: map[string]string{"style": "detailed"}})
			if err != nil || len(got.Messages) != 1 || got.Messages[0].Content.(*mcp.TextContent).Text != "Summarize these notes (detailed):\nbuy milk\ncall bob" {
				t.Fatalf("prompts/get: %+v, %v", got, err)
			}

			res, err := a.ListResources(ctx, nil)
			if err != nil || len(res.Resources) != 1 || res.Resources[0].URI != "notes://all" {
				t.Fatalf("resources/list: %+v, %v", res, err)
			}
			tpl, err := a.ListResourceTemplates(ctx, nil)
			if err != nil || len(tpl.ResourceTemplates) != 1 || tpl.ResourceTemplates[0].URITemplate != "notes://note/{n}" {
				t.Fatalf("resources/templates/list: %+v, %v", tpl, err)
			}
			for _, c := range []struct {
				cs        *mcp.ClientSession
				uri, want string
			}{{a, "notes://all", "buy milk\ncall bob"}, {a, "notes://note/2", "call bob"}, {b, "notes://all", "b's own"}} {
				rr, err := c.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: c.uri})
				if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != c.want {
					t.Errorf("read %s: %+v, %v; want %q", c.uri, rr, err, c.want)
				}
			}
			if _, err := a.ReadResource(ctx, &mcp.ReadResourceParams{URI: "notes://note/9"}); err == nil || !strings.Contains(err.Error(), "no note") {
				t.Errorf("read a missing note: %v", err)
			}

			comp, err := a.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/prompt", Name: "summarize_notes"}, Argument: mcp.CompleteParamsArgument{Name: "style", Value: "d"}})
			if err != nil || cmp.Diff([]string{"detailed"}, comp.Completion.Values) != "" {
				t.Errorf("complete prompt: %+v, %v", comp, err)
			}
			comp, err = a.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "notes://note/{n}"}, Argument: mcp.CompleteParamsArgument{Name: "n", Value: ""}})
			if err != nil || cmp.Diff([]string{"1", "2"}, comp.Completion.Values) != "" {
				t.Errorf("complete template: %+v, %v", comp, err)
			}
		})
	}
}
