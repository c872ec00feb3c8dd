//go:build wasip1

// Command pdkhost is a test plugin written with the real Extism Go PDK
// that imports the MCP host functions by the names and JSON shapes
// hyper-mcp's plugins use (module extism:host/user), and speaks the v2
// interface (list_tools, call_tool), as a hyper-mcp plugin does. It proves
// that such plugins run unmodified.
package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/extism/go-pdk"
)

func main() {}

//go:wasmimport extism:host/user notify_progress
func notifyProgress(uint64)

//go:wasmimport extism:host/user notify_logging_message
func notifyLoggingMessage(uint64)

//go:wasmimport extism:host/user create_elicitation
func createElicitation(uint64) uint64

//go:wasmimport extism:host/user notify_tool_list_changed
func notifyToolListChanged()

//go:wasmimport extism:host/user write_record
func writeRecord(uint64) uint64

// extra is set by the relist tool: the tool list then has one more tool.
var extra bool

const tools = `[
 {"name":"progress","inputSchema":{"type":"object","properties":{"steps":{"type":"integer"}},"required":["steps"]}},
 {"name":"ask","inputSchema":{"type":"object","properties":{"rounds":{"type":"integer"},"mode":{"type":"string"}},"required":["rounds"]}},
 {"name":"log","inputSchema":{"type":"object","properties":{"level":{"type":"string"},"message":{"type":"string"}},"required":["level","message"]}},
 {"name":"record","inputSchema":{"type":"object","properties":{"count":{"type":"integer"},"size":{"type":"integer"}},"required":["count"]}},
 {"name":"relist","inputSchema":{"type":"object"}},
 {"name":"spin","inputSchema":{"type":"object"}},
 {"name":"badjson","inputSchema":{"type":"object"}}`

//go:wasmexport list_tools
func listTools() int32 {
	list := tools
	if extra {
		list += `,{"name":"extra","inputSchema":{"type":"object"}}`
	}
	pdk.OutputString(`{"tools":` + list + `]}`)
	return 0
}

type callInput struct {
	Request struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"request"`
	Context struct {
		Meta map[string]any `json:"_meta"`
	} `json:"context"`
}

func send(f func(uint64), v any) {
	mem, err := pdk.AllocateJSON(v)
	if err != nil {
		panic(err)
	}
	f(mem.Offset())
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
		Steps   int    `json:"steps"`
		Rounds  int    `json:"rounds"`
		Mode    string `json:"mode"`
		Level   string `json:"level"`
		Message string `json:"message"`
		Count   int    `json:"count"`
		Size    int    `json:"size"`
	}
	json.Unmarshal(in.Request.Arguments, &args)
	token, _ := in.Context.Meta["progressToken"]
	switch in.Request.Name {
	case "progress":
		for i := 1; i <= args.Steps; i++ {
			send(notifyProgress, map[string]any{"progressToken": fmt.Sprint(token), "progress": i, "total": args.Steps, "message": fmt.Sprintf("step %d", i)})
		}
		return text(fmt.Sprintf("%d steps", args.Steps))
	case "ask":
		var answers []string
		for i := 1; i <= args.Rounds; i++ {
			req := map[string]any{"mode": "form", "message": fmt.Sprintf("question %d", i),
				"requestedSchema": map[string]any{"type": "object", "properties": map[string]any{"name": map[string]any{"type": "string"}}, "required": []string{"name"}}}
			if args.Mode == "url" {
				req = map[string]any{"mode": "url", "message": "open it", "url": "https://example.com/x", "elicitationId": "e1"}
			}
			mem, _ := pdk.AllocateJSON(req)
			var res struct {
				Action  string         `json:"action"`
				Content map[string]any `json:"content"`
				Error   string         `json:"error"`
			}
			if err := pdk.JSONFrom(createElicitation(mem.Offset()), &res); err != nil {
				pdk.SetError(err)
				return 1
			}
			a := res.Action
			if name, ok := res.Content["name"]; ok {
				a += ":" + fmt.Sprint(name)
			}
			if res.Error != "" {
				a += "(" + res.Error + ")"
			}
			answers = append(answers, a)
		}
		return text(strings.Join(answers, ","))
	case "log":
		send(notifyLoggingMessage, map[string]any{"level": args.Level, "logger": "pdkhost", "data": args.Message})
		return text("logged")
	case "record":
		var errs []string
		for i := 0; i < args.Count; i++ {
			mem, _ := pdk.AllocateJSON(map[string]any{"namespace": "test.pdkhost", "data": map[string]any{"i": i, "pad": strings.Repeat("x", args.Size)}})
			if off := writeRecord(mem.Offset()); off != 0 {
				m := pdk.FindMemory(off)
				errs = append(errs, string(m.ReadBytes()))
			}
		}
		if len(errs) > 0 {
			return text(fmt.Sprintf("%d refused: %s", len(errs), errs[0]))
		}
		return text("recorded")
	case "relist":
		extra = true
		notifyToolListChanged()
		return text("relisted")
	case "extra":
		return text("extra tool")
	case "spin":
		for {
		}
	case "badjson":
		mem := pdk.AllocateString("{not json")
		notifyProgress(mem.Offset())
		return text("unreachable")
	}
	pdk.SetErrorString("unknown tool " + in.Request.Name)
	return 1
}
