//go:build wasip1

// Command grantask is a test plugin, written with the Extism Go PDK, for
// run-time grants: its tools reach a URL (Extism http_request) or read a
// keyring secret (get_keyring_secret), first giving the host their reason
// with grant_reason when the arguments carry one. What the host refused
// comes back as the tool's error text.
package main

import (
	"encoding/json"
	"fmt"

	"github.com/extism/go-pdk"
)

func main() {}

//go:wasmimport extism:host/user grant_reason
func grantReason(uint64)

//go:wasmimport extism:host/user get_keyring_secret
func getKeyringSecret(uint64) uint64

//go:wasmexport describe
func describe() int32 {
	pdk.OutputString(`{"tools":[
 {"name":"fetch","inputSchema":{"type":"object","properties":{"url":{"type":"string"},"reason":{"type":"string"},"times":{"type":"integer"}},"required":["url"]}},
 {"name":"secret","inputSchema":{"type":"object","properties":{"name":{"type":"string"},"reason":{"type":"string"}},"required":["name"]}}]}`)
	return 0
}

//go:wasmexport call
func call() int32 {
	var in struct {
		Params struct {
			Name      string `json:"name"`
			Arguments struct {
				URL, Reason, Name string
				Times             int
			} `json:"arguments"`
		} `json:"params"`
	}
	if err := json.Unmarshal(pdk.Input(), &in); err != nil {
		pdk.SetError(err)
		return 1
	}
	a := in.Params.Arguments
	if a.Reason != "" {
		mem, _ := pdk.AllocateJSON(map[string]string{"reason": a.Reason})
		grantReason(mem.Offset())
	}
	var out string
	switch in.Params.Name {
	case "fetch":
		// Several requests in one call: the host asks once, then
		// remembers (or not) as the person said.
		for i := 0; i < max(a.Times, 1); i++ {
			resp := pdk.NewHTTPRequest(pdk.MethodGet, a.URL).Send()
			if i > 0 {
				out += "; "
			}
			out += fmt.Sprintf("%d %s", resp.Status(), resp.Body())
		}
	case "secret":
		service, user, _ := cut(a.Name)
		mem, _ := pdk.AllocateJSON(map[string]string{"service": service, "user": user})
		off := getKeyringSecret(mem.Offset())
		m := pdk.FindMemory(off)
		out = "secret: " + string(m.ReadBytes())
	}
	b, _ := json.Marshal(map[string]any{"content": []map[string]string{{"type": "text", "text": out}}})
	pdk.Output(b)
	return 0
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}
