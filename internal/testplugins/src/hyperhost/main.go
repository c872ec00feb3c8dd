//go:build wasip1

// Command hyperhost is a test plugin written with the real Extism Go PDK
// that imports every host function hyper-mcp offers its plugins (module
// extism:host/user), by hyper-mcp's names and JSON shapes, and speaks the
// v2 interface as a hyper-mcp plugin does. Each tool exercises one host
// function and returns what the host answered, so a test sees both.
package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/extism/go-pdk"
)

func main() {}

//go:wasmimport extism:host/user create_elicitation
func createElicitation(uint64) uint64

//go:wasmimport extism:host/user create_message
func createMessage(uint64) uint64

//go:wasmimport extism:host/user get_access_token
func getAccessToken(uint64) uint64

//go:wasmimport extism:host/user get_keyring_secret
func getKeyringSecret(uint64) uint64

//go:wasmimport extism:host/user list_roots
func listRoots() uint64

//go:wasmimport extism:host/user notify_logging_message
func notifyLoggingMessage(uint64)

//go:wasmimport extism:host/user notify_progress
func notifyProgress(uint64)

//go:wasmimport extism:host/user notify_prompt_list_changed
func notifyPromptListChanged()

//go:wasmimport extism:host/user notify_resource_list_changed
func notifyResourceListChanged()

//go:wasmimport extism:host/user notify_resource_updated
func notifyResourceUpdated(uint64)

//go:wasmimport extism:host/user notify_tool_list_changed
func notifyToolListChanged()

//go:wasmimport extism:host/user notify_url_elicitation_completed
func notifyURLElicitationCompleted(uint64)

const tools = `{"tools":[
 {"name":"roots","inputSchema":{"type":"object"}},
 {"name":"secret","inputSchema":{"type":"object","properties":{"service":{"type":"string"},"user":{"type":"string"}},"required":["service","user"]}},
 {"name":"token","inputSchema":{"type":"object","properties":{"credentials":{"type":"object"}},"required":["credentials"]}},
 {"name":"elicit","inputSchema":{"type":"object"}},
 {"name":"url_elicit","inputSchema":{"type":"object"}},
 {"name":"url_flood","inputSchema":{"type":"object","properties":{"count":{"type":"integer"}}}},
 {"name":"sample","inputSchema":{"type":"object"}},
 {"name":"notify","inputSchema":{"type":"object"}},
 {"name":"now","inputSchema":{"type":"object"}}
]}`

//go:wasmexport list_tools
func listTools() int32 {
	pdk.OutputString(tools)
	return 0
}

//go:wasmexport list_resources
func listResources() int32 {
	pdk.OutputString(`{"resources":[{"uri":"hyper://state","name":"state"},{"uri":"hyper://roots","name":"the client's roots"}]}`)
	return 0
}

//go:wasmexport list_prompts
func listPrompts() int32 {
	pdk.OutputString(`{"prompts":[{"name":"rooted","arguments":[{"name":"root"}]}]}`)
	return 0
}

// rootsText asks the client for its roots (a prompt, a resource read and
// a completion may ask, as a tool call may).
func rootsText() string {
	m := pdk.FindMemory(listRoots())
	return string(m.ReadBytes())
}

//go:wasmexport read_resource
func readResource() int32 {
	var in struct {
		Request struct {
			URI string `json:"uri"`
		} `json:"request"`
	}
	pdk.InputJSON(&in)
	text := "ok"
	if in.Request.URI == "hyper://roots" {
		text = rootsText()
	}
	out, _ := json.Marshal(map[string]any{"contents": []any{map[string]any{"uri": in.Request.URI, "text": text}}})
	pdk.Output(out)
	return 0
}

//go:wasmexport get_prompt
func getPrompt() int32 {
	out, _ := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": map[string]any{"type": "text", "text": "roots: " + rootsText()}}}})
	pdk.Output(out)
	return 0
}

//go:wasmexport complete
func complete() int32 {
	var roots struct {
		Roots []struct {
			Name string `json:"name"`
		} `json:"roots"`
	}
	json.Unmarshal([]byte(rootsText()), &roots)
	values := []string{}
	for _, r := range roots.Roots {
		values = append(values, r.Name)
	}
	out, _ := json.Marshal(map[string]any{"completion": map[string]any{"values": values}})
	pdk.Output(out)
	return 0
}

type callInput struct {
	Request struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"request"`
	Context struct {
		ID   any            `json:"id"`
		Meta map[string]any `json:"_meta"`
	} `json:"context"`
}

func alloc(v any) uint64 {
	mem, err := pdk.AllocateJSON(v)
	if err != nil {
		panic(err)
	}
	return mem.Offset()
}

// answer returns the host's answer at off as text, as the host gave it.
func answer(off uint64) int32 {
	if off == 0 {
		return text("")
	}
	m := pdk.FindMemory(off)
	return text(string(m.ReadBytes()))
}

func text(s string) int32 {
	out, _ := json.Marshal(map[string]any{"content": []map[string]any{{"type": "text", "text": s}}})
	pdk.Output(out)
	return 0
}

//go:wasmexport call_tool
func callTool() int32 {
	var in callInput
	if err := pdk.InputJSON(&in); err != nil {
		pdk.SetError(err)
		return 1
	}
	var args struct {
		Count       int             `json:"count"`
		Service     string          `json:"service"`
		User        string          `json:"user"`
		Credentials json.RawMessage `json:"credentials"`
	}
	json.Unmarshal(in.Request.Arguments, &args)
	switch in.Request.Name {
	case "roots":
		return answer(listRoots())
	case "secret":
		return answer(getKeyringSecret(alloc(map[string]string{"service": args.Service, "user": args.User})))
	case "token":
		mem := pdk.AllocateBytes(args.Credentials)
		return answer(getAccessToken(mem.Offset()))
	case "elicit":
		return answer(createElicitation(alloc(map[string]any{"message": "name?", "requestedSchema": map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}}})))
	case "url_elicit":
		off := createElicitation(alloc(map[string]any{"mode": "url", "message": "sign in", "url": "https://example.com/signin", "elicitationId": "signin-1"}))
		notifyURLElicitationCompleted(alloc(map[string]string{"elicitationId": "signin-1"}))
		return answer(off)
	case "url_flood":
		// One URL elicitation, then count completions of its ID, of IDs
		// it never issued, and of an oversized ID (issue 26: 30-49
		// thousand notifications per call, IDs never issued forwarded).
		off := createElicitation(alloc(map[string]any{"mode": "url", "message": "sign in", "url": "https://example.com/signin", "elicitationId": "flood-1"}))
		for i := 0; i < args.Count; i++ {
			notifyURLElicitationCompleted(alloc(map[string]string{"elicitationId": "flood-1"}))
			notifyURLElicitationCompleted(alloc(map[string]string{"elicitationId": fmt.Sprintf("forged-%d", i)}))
		}
		return answer(off)
	case "sample":
		return answer(createMessage(alloc(map[string]any{"messages": []any{map[string]any{"role": "user", "content": map[string]any{"type": "text", "text": "hello"}}}, "maxTokens": 10})))
	case "notify":
		token := in.Context.Meta["progressToken"]
		notifyProgress(alloc(map[string]any{"progressToken": token, "progress": 1, "total": 2}))
		notifyLoggingMessage(alloc(map[string]any{"level": "info", "logger": "hyperhost", "data": "notified"}))
		notifyResourceUpdated(alloc(map[string]string{"uri": "hyper://state"}))
		notifyPromptListChanged()
		notifyResourceListChanged()
		notifyToolListChanged()
		return text(fmt.Sprintf("notified (request %v)", in.Context.ID))
	case "now":
		return text(time.Now().UTC().Format(time.RFC3339Nano))
	}
	pdk.SetErrorString("unknown tool " + in.Request.Name)
	return 1
}
