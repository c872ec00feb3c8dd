//go:build wasip1

// Command notes is a stateful example plugin: a notepad kept in the guest's
// memory. The host gives each MCP session its own instance, so each client
// sees only its own notes, and they last as long as its session. It hands
// its notes over to its next version when it is hot-swapped (package
// handoff), so an upgrade keeps every client's notes.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o notes.wasm .
package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/wasmtools/wasmtools/abi/guest"
	"github.com/wasmtools/wasmtools/abi/guest/handoff"
)

func main() {}

// notes belong to this instance, that is, to one client's session.
var notes []string

func init() {
	handoff.Register("notes/v1",
		func() (any, error) { return notes, nil },
		func(format string, state json.RawMessage) error {
			if format != "notes/v1" {
				return fmt.Errorf("unknown state format %q", format)
			}
			return json.Unmarshal(state, &notes)
		})
	// The notes are also resources (notes://all, notes://note/{n}) and
	// the subject of a prompt; like the tools, they read this session's
	// instance.
	guest.RegisterResource(
		guest.Resource{URI: "notes://all", Name: "all notes", MIMEType: "text/plain",
			Read: func(uri string, _ map[string]string) ([]guest.ResourceContents, error) {
				return []guest.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: strings.Join(notes, "\n")}}, nil
			}},
		guest.Resource{URITemplate: "notes://note/{n}", Name: "one note", MIMEType: "text/plain",
			Read: func(uri string, vars map[string]string) ([]guest.ResourceContents, error) {
				n, err := strconv.Atoi(vars["n"])
				if err != nil || n < 1 || n > len(notes) {
					return nil, fmt.Errorf("no note %q: there are %d", vars["n"], len(notes))
				}
				return []guest.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: notes[n-1]}}, nil
			},
			Complete: func(_, value string, _ map[string]string) []string {
				var out []string
				for i := range notes {
					if n := strconv.Itoa(i + 1); strings.HasPrefix(n, value) {
						out = append(out, n)
					}
				}
				return out
			}},
	)
	guest.RegisterPrompt(guest.Prompt{
		Name:        "summarize_notes",
		Description: "Asks the model to summarize this session's notes.",
		Arguments:   []guest.PromptArgument{{Name: "style", Description: "brief or detailed"}},
		Get: func(args map[string]string) (*guest.PromptResult, error) {
			style := args["style"]
			if style == "" {
				style = "brief"
			}
			return &guest.PromptResult{Messages: []guest.PromptMessage{{Role: "user",
				Content: guest.TextBlock(fmt.Sprintf("Summarize these notes (%s):\n%s", style, strings.Join(notes, "\n")))}}}, nil
		},
		Complete: func(_, value string, _ map[string]string) []string {
			var out []string
			for _, s := range []string{"brief", "detailed"} {
				if strings.HasPrefix(s, value) {
					out = append(out, s)
				}
			}
			return out
		},
	})
	guest.Register(
		guest.Tool{
			Name:        "note_add",
			Description: "Adds a note to this session's notepad and returns its number.",
			InputSchema: `{"type":"object","properties":{"text":{"type":"string","minLength":1,"maxLength":10000}},"required":["text"],"additionalProperties":false}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				var in struct {
					Text string `json:"text"`
				}
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				if len(notes) >= 1000 {
					return nil, fmt.Errorf("the notepad is full (1000 notes): clear it first")
				}
				notes = append(notes, in.Text)
				return guest.Text(fmt.Sprintf("note %d saved", len(notes))), nil
			},
		},
		guest.Tool{
			Name:        "note_list",
			Description: "Lists this session's notes, numbered from 1.",
			InputSchema: `{"type":"object","properties":{},"additionalProperties":false}`,
			Annotations: `{"readOnlyHint":true}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				if len(notes) == 0 {
					return guest.Text("no notes"), nil
				}
				var b strings.Builder
				for i, n := range notes {
					fmt.Fprintf(&b, "%d. %s\n", i+1, n)
				}
				return guest.Text(b.String()), nil
			},
		},
		guest.Tool{
			Name:        "note_clear",
			Description: "Deletes all of this session's notes.",
			InputSchema: `{"type":"object","properties":{},"additionalProperties":false}`,
			Annotations: `{"destructiveHint":true,"idempotentHint":true}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				n := len(notes)
				notes = nil
				return guest.Text(fmt.Sprintf("%d notes deleted", n)), nil
			},
		},
	)
}
