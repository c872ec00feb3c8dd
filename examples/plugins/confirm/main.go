//go:build wasip1

// Command confirm is an example plugin that asks before it acts: `delete`
// asks the user to confirm (MCP elicitation) before it deletes an item
// from this session's list, and writes a record of what it deleted. `add`
// and `list` manage the list.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o confirm.wasm .
package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/abi/guest"
)

func main() {}

// items belong to this instance, that is, to one client's session.
var items []string

func init() {
	guest.Register(
		guest.Tool{
			Name:        "add",
			Description: "Adds an item to this session's list.",
			InputSchema: `{"type":"object","properties":{"item":{"type":"string","minLength":1}},"required":["item"]}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				var in struct{ Item string }
				if err := c.Bind(&in); err != nil {
					return nil, err
				}
				items = append(items, in.Item)
				return guest.Text(fmt.Sprintf("added %q", in.Item)), nil
			},
		},
		guest.Tool{
			Name:        "list",
			Description: "Lists this session's items.",
			InputSchema: `{"type":"object"}`,
			Handler: func(c *guest.Call) (*guest.Result, error) {
				return guest.Text(strings.Join(items, "\n")), nil
			},
		},
		guest.Tool{
			Name:        "delete",
			Description: "Deletes an item after the user confirms, and records the deletion.",
			InputSchema: `{"type":"object","properties":{"item":{"type":"string"}},"required":["item"]}`,
			Annotations: `{"destructiveHint":true}`,
			Handler:     deleteItem,
		},
	)
}

func deleteItem(c *guest.Call) (*guest.Result, error) {
	var in struct{ Item string }
	if err := c.Bind(&in); err != nil {
		return nil, err
	}
	i := slices.Index(items, in.Item)
	if i < 0 {
		return nil, fmt.Errorf("no item %q", in.Item)
	}
	res, err := guest.Elicit(abi.ElicitRequest{
		Message:         fmt.Sprintf("Delete %q?", in.Item),
		RequestedSchema: []byte(`{"type":"object","properties":{"confirm":{"type":"boolean","description":"Yes, delete it"},"reason":{"type":"string"}},"required":["confirm"]}`),
	})
	if err != nil {
		return guest.Text(fmt.Sprintf("not deleted: could not ask (%v)", err)), nil
	}
	if res.Action != abi.ActionAccept || res.Content["confirm"] != true {
		return guest.Text(fmt.Sprintf("not deleted (%s)", res.Action)), nil
	}
	items = slices.Delete(items, i, i+1)
	if err := guest.WriteRecord("dev.wasmtools.examples/confirm", map[string]any{"deleted": in.Item, "reason": res.Content["reason"]}); err != nil {
		guest.Log("warning", "record refused: "+err.Error())
	}
	return guest.Text(fmt.Sprintf("deleted %q", in.Item)), nil
}
