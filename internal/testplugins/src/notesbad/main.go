//go:build wasip1

// Command notesbad is a test plugin with the notes example's tools whose
// state restore always fails: swapping it in for notes must fall back to a
// fresh instance and say so.
package main

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/wasmtools/wasmtools/abi/guest"
	"github.com/wasmtools/wasmtools/abi/guest/handoff"
)

func main() {}

var notes []string

func init() {
	handoff.Register("notes/v1",
		func() (any, error) { return notes, nil },
		func(string, json.RawMessage) error { return errors.New("this version cannot read old notes") })
	guest.Register(
		guest.Tool{Name: "note_add", InputSchema: `{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				var in struct{ Text string }
				c.Bind(&in)
				notes = append(notes, in.Text)
				return guest.Text("saved"), nil
			}},
		guest.Tool{Name: "note_list", InputSchema: `{"type":"object"}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				if len(notes) == 0 {
					return guest.Text("no notes"), nil
				}
				return guest.Text(strings.Join(notes, "\n")), nil
			}},
	)
}
