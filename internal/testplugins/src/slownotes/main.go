//go:build wasip1

// Command slownotes is a test plugin for the fault suite (internal/faults):
// a notepad like examples/plugins/notes whose slow_add changes its state
// first and then works on for a while, reporting progress at each step, so
// that a replica can be killed in the middle of a call that has already
// changed its instance's state. The first progress report says the state
// has changed.
package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/wasmtools/wasmtools/abi/guest"
	"github.com/wasmtools/wasmtools/abi/guest/handoff"
)

func main() {}

var notes []string

// sink keeps the work from being optimised away.
var sink uint64

func init() {
	handoff.Register("notes/v1",
		func() (any, error) { return notes, nil },
		func(format string, state json.RawMessage) error {
			if format != "notes/v1" {
				return fmt.Errorf("unknown state format %q", format)
			}
			return json.Unmarshal(state, &notes)
		})
	guest.Register(
		guest.Tool{
			Name:        "slow_add",
			Description: "Adds a note, then works for steps steps (each 2^16 rounds of arithmetic), reporting progress after each; returns the note's number.",
			InputSchema: `{"type":"object","properties":{"text":{"type":"string","minLength":1,"maxLength":10000},"steps":{"type":"integer","minimum":0,"maximum":1000,"default":10}},"required":["text"],"additionalProperties":false}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				in := struct {
					Text  string `json:"text"`
					Steps *int   `json:"steps"`
				}{}
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				steps := 10
				if in.Steps != nil {
					steps = *in.Steps
				}
				notes = append(notes, in.Text)
				x := uint64(len(notes))
				for i := range steps {
					guest.Progress(float64(i), float64(steps), fmt.Sprintf("note %d added; working", len(notes)))
					for range 1 << 16 {
						x = x*6364136223846793005 + 1442695040888963407
					}
				}
				sink += x
				return guest.Text(fmt.Sprintf("note %d saved", len(notes))), nil
			},
		},
		guest.Tool{
			Name:        "slow_list",
			Description: "Lists the notes, numbered from 1.",
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
	)
}
