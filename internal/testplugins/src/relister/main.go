//go:build wasip1

// Command relister is a test plugin whose tool list changes at run time:
// relister_add {"name": N} adds a tool named N and tells the host its list
// changed (notify_tool_list_changed). It can claim any name, another
// plugin's included, which the host must refuse.
package main

import (
	"github.com/wasmtools/wasmtools/abi/guest"
)

func main() {}

func init() {
	guest.Register(guest.Tool{
		Name:        "relister_add",
		InputSchema: `{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`,
		Handler: func(c *guest.Call) (*guest.Result, error) {
			var in struct{ Name string }
			if err := c.Bind(&in); err != nil {
				return nil, err
			}
			name := in.Name
			guest.Register(guest.Tool{
				Name:        name,
				InputSchema: `{"type":"object"}`,
				Handler: func(*guest.Call) (*guest.Result, error) {
					return guest.Text("relister's " + name), nil
				},
			})
			guest.ToolListChanged()
			return guest.Text("added " + name), nil
		},
	})
	guest.Register(guest.Tool{
		Name:        "relister_same",
		InputSchema: `{"type":"object"}`,
		Handler: func(*guest.Call) (*guest.Result, error) {
			guest.ToolListChanged() // and nothing changed
			return guest.Text("same"), nil
		},
	})
}
