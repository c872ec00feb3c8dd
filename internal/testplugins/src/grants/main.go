//go:build wasip1

// Command grants is a test plugin, written with the Extism Go PDK, that
// tries what only a grant allows: network requests (Extism http_request),
// files (WASI: read, write, symlink, rename, mkdir, list, remove) and
// environment variables. File errors come back as text,
// so tests can read them. hold opens a file and keeps it open across
// calls, and held reads or writes through it, as a guest that keeps what
// one call was granted for the next would.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/extism/go-pdk"
)

func main() {}

// heldFile is the file hold opened, kept for later calls.
var heldFile *os.File

//go:wasmexport describe
func describe() int32 {
	tool := func(name string) string {
		return `{"name":"` + name + `","inputSchema":{"type":"object"}}`
	}
	pdk.OutputString(`{"tools":[` + strings.Join([]string{tool("fetch"), tool("read"), tool("write"), tool("symlink"), tool("rename"), tool("mkdir"), tool("list"), tool("remove"), tool("env"), tool("hold"), tool("held")}, ",") + `]}`)
	return 0
}

//go:wasmexport call
func call() int32 {
	var in struct {
		Params struct {
			Name      string `json:"name"`
			Arguments struct {
				URL, Path, Text, Target, Name string
			} `json:"arguments"`
		} `json:"params"`
	}
	if err := json.Unmarshal(pdk.Input(), &in); err != nil {
		pdk.SetError(err)
		return 1
	}
	a := in.Params.Arguments
	var out string
	switch in.Params.Name {
	case "fetch":
		resp := pdk.NewHTTPRequest(pdk.MethodGet, a.URL).Send()
		out = fmt.Sprintf("%d %s", resp.Status(), resp.Body())
	case "read":
		b, err := os.ReadFile(a.Path)
		out = result(string(b), err)
	case "write":
		out = result("written", os.WriteFile(a.Path, []byte(a.Text), 0o644))
	case "symlink":
		out = result("linked", os.Symlink(a.Target, a.Path))
	case "rename":
		out = result("renamed", os.Rename(a.Path, a.Target))
	case "mkdir":
		out = result("made", os.Mkdir(a.Path, 0o755))
	case "list":
		var names []string
		entries, err := os.ReadDir(a.Path)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		out = result(strings.Join(names, ","), err)
	case "remove":
		out = result("removed", os.Remove(a.Path))
	case "env":
		out = "[" + os.Getenv(a.Name) + "]"
	case "hold": // Text: "read" or "write"
		flag := os.O_RDONLY
		if a.Text == "write" {
			flag = os.O_RDWR
		}
		f, err := os.OpenFile(a.Path, flag, 0)
		if err == nil {
			heldFile = f
		}
		out = result("held", err)
	case "held": // Text: what to write at the start; "" reads the file
		if heldFile == nil {
			out = "error: nothing held"
			break
		}
		if a.Text != "" {
			_, err := heldFile.WriteAt([]byte(a.Text), 0)
			out = result("written", err)
			break
		}
		b := make([]byte, 4096)
		n, err := heldFile.ReadAt(b, 0)
		if err != nil && n > 0 {
			err = nil
		}
		out = result(string(b[:n]), err)
	}
	b, _ := json.Marshal(map[string]any{"content": []map[string]string{{"type": "text", "text": out}}})
	pdk.Output(b)
	return 0
}

func result(ok string, err error) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return ok
}
