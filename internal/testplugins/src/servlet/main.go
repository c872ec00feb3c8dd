//go:build wasip1

// Command servlet is a test plugin written with the real Extism Go PDK
// (github.com/extism/go-pdk), not the wasmtools guest library, speaking the
// servlet interface (exports describe and call). It proves that plugins
// written outside this repository run unmodified.
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"strings"

	"github.com/extism/go-pdk"
)

func main() {}

type callInput struct {
	Params struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"params"`
}

type content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type result struct {
	Content []content `json:"content"`
	IsError bool      `json:"isError,omitempty"`
}

//go:wasmexport describe
func describe() int32 {
	pdk.OutputString(`{"tools":[
	 {"name":"echo","description":"Returns its text argument.","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},
	 {"name":"repeat","description":"Returns text repeated count times.","inputSchema":{"type":"object","properties":{"text":{"type":"string"},"count":{"type":"integer","minimum":0,"maximum":1000000}},"required":["text","count"]}},
	 {"name":"fail","description":"Fails through the Extism error channel.","inputSchema":{"type":"object"}},
	 {"name":"panic","description":"Panics: the Go runtime exits.","inputSchema":{"type":"object"}},
	 {"name":"config","description":"Returns the config value of key.","inputSchema":{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}},
	 {"name":"var_count","description":"Counts calls in an Extism var.","inputSchema":{"type":"object"}},
	 {"name":"image","description":"Returns an image block and an annotated text block.","inputSchema":{"type":"object"}},
	 {"name":"print","description":"Writes its text to stdout and stderr.","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}},
	 {"name":"remember","description":"Keeps text on the Go heap and returns everything kept so far.","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}},
	 {"name":"random","description":"Returns 16 bytes of crypto/rand, in hex.","inputSchema":{"type":"object"}},
	 {"name":"mathrand","description":"Returns the next math/rand/v2 number (the Go runtime's seeded generator).","inputSchema":{"type":"object"}}
	]}`)
	return 0
}

// remembered is state on the Go heap, kept across calls, for the tests
// of host-side snapshots.
var remembered []string

type callArgs struct {
	Text  string `json:"text"`
	Count int    `json:"count"`
	Key   string `json:"key"`
}

// preInitialize is Wizer's pre-initialisation export, which wasmtools
// calls once before it keeps the plugin's pre-initialised image: it runs
// the JSON of a call (encoding/json builds and caches a decoder and an
// encoder per type on first use, and the goroutine's stack grows to the
// depth a call needs), so that every session's first call finds that
// done. It handles no client's data.
//
//go:wasmexport wizer.initialize
func preInitialize() {
	var in callInput
	_ = json.Unmarshal([]byte(`{"params":{"name":"echo","arguments":{"text":"x","count":1,"key":"k"}}}`), &in)
	var args callArgs
	_ = json.Unmarshal(in.Params.Arguments, &args)
	_, _ = json.Marshal(result{Content: []content{{Type: "text", Text: args.Text}}})
}

//go:wasmexport call
func call() int32 {
	var in callInput
	if err := json.Unmarshal(pdk.Input(), &in); err != nil {
		pdk.SetError(err)
		return 1
	}
	var args callArgs
	_ = json.Unmarshal(in.Params.Arguments, &args)
	var text string
	switch in.Params.Name {
	case "echo":
		text = args.Text
	case "repeat":
		text = strings.Repeat(args.Text, args.Count)
	case "fail":
		pdk.SetErrorString("failed on purpose")
		return 1
	case "panic":
		panic("panicked on purpose")
	case "config":
		v, ok := pdk.GetConfig(args.Key)
		if !ok {
			v = "<unset>"
		}
		text = v
	case "var_count":
		n := pdk.GetVarInt("count") + 1
		pdk.SetVarInt("count", n)
		b, _ := json.Marshal(n)
		text = string(b)
	case "image":
		pdk.OutputString(`{"content":[{"type":"image","data":"aGVsbG8=","mimeType":"image/png"},{"type":"text","text":"caption","annotations":{"audience":["user"]}}],"structuredContent":{"n":1},"_meta":{"x.example/k":"v"}}`)
		return 0
	case "print":
		fmt.Println(args.Text)
		fmt.Fprintln(os.Stderr, args.Text)
		text = "printed"
	case "remember":
		remembered = append(remembered, args.Text)
		text = strings.Join(remembered, ",")
	case "mathrand":
		text = strconv.FormatUint(mrand.Uint64(), 16)
	case "random":
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		text = hex.EncodeToString(b)
	default:
		pdk.SetErrorString("unknown tool " + in.Params.Name)
		return 1
	}
	out, _ := json.Marshal(result{Content: []content{{Type: "text", Text: text}}})
	pdk.Output(out)
	return 0
}
