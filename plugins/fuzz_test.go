package plugins

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Fuzz targets for what a plugin hands the host across the ABI: its tool
// list and its results, as bytes it chooses (see docs/SECURITY.md).

// FuzzDecodeOutput decodes guest output as Load and CallTool do. Output
// it accepts must be valid UTF-8 JSON, one value and nothing else. A
// result that textResult takes must be decodeJSON's, byte for byte; and
// textResult must take what encoding/json writes for a result of text
// blocks, the fuzzed bytes as their text.
func FuzzDecodeOutput(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"hi"}]}`,
		`{"content":[],"structuredContent":{"n":1},"isError":true,"_meta":{"k":"v"}}`,
		`{"tools":[{"name":"a","inputSchema":{"type":"object"}}],"nextCursor":"x"}`,
		`{"format":"v1","state":{"n":[1,2,3]}}`,
		`{"content":[]} {}`, "\xff", `{"content":"x"}`, ` {"content":null} `, `[[[[[[[[[[`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, out []byte) {
		for _, v := range []any{&abi.CallToolResult{}, &abi.ServletDescribeResult{}, &abi.ListToolsResult{}, &abi.Snapshot{}} {
			if err := decodeJSON(out, v); err != nil {
				continue
			}
			if !utf8.Valid(out) || !json.Valid(out) {
				t.Fatalf("decodeJSON accepted %q into %T, which is not valid UTF-8 JSON", out, v)
			}
		}
		if got, ok := textResult(out); ok {
			var want abi.CallToolResult
			if err := decodeJSON(out, &want); err != nil {
				t.Fatalf("textResult took %q, which decodeJSON refuses: %v", out, err)
			}
			same := len(got.Content) == len(want.Content) && got.IsError == want.IsError &&
				got.StructuredContent == nil && want.StructuredContent == nil && got.Meta == nil && want.Meta == nil
			for i := range got.Content {
				same = same && bytes.Equal(got.Content[i], want.Content[i])
			}
			if !same {
				t.Fatalf("textResult(%q) = %+v, decodeJSON gives %+v", out, got, want)
			}
		}
		type textOnly struct {
			Content []abi.TextContent `json:"content"`
			IsError bool              `json:"isError,omitempty"`
		}
		blocks := []abi.TextContent{}
		for _, text := range bytes.SplitN(out, []byte{0}, 4) {
			blocks = append(blocks, abi.TextContent{Type: "text", Text: string(text)})
		}
		b, err := json.Marshal(textOnly{Content: blocks, IsError: len(out)%2 == 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := textResult(b); !ok {
			t.Fatalf("textResult does not take %s, as encoding/json writes a result of text blocks", b)
		}
	})
}

// echoPlugin loads internal/testplugins' hostileecho, whose describe
// outputs describe and whose call outputs result, byte for byte.
func echoPlugin(tb testing.TB, rt *sandbox.Runtime, wasm []byte, describe, result []byte) (*Plugin, error) {
	policy := sandbox.NewPolicy().WithConfig(map[string]string{"describe": string(describe), "result": string(result)})
	return Load(context.Background(), rt, "hostileecho.wasm", wasm, Options{Policy: &policy})
}

// FuzzLoadAndCall loads a plugin whose tool list is the fuzzed bytes, and
// calls each tool it lists, the guest returning the other fuzzed bytes.
// Loading either fails with an error or gives tools with valid names and
// object schemas; a call either fails with an error or gives a result.
// Nothing may panic or hang.
func FuzzLoadAndCall(f *testing.F) {
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rt.Close(context.Background()) })
	wasm := testplugins.Bytes(f, testplugins.Test(f, "hostileecho"))
	// The plumbing works: the tool list and the result are the config's.
	describe, result := []byte(`{"tools":[{"name":"t","inputSchema":{"type":"object","properties":{"a":{"type":"string"}}}}]}`), []byte(`{"content":[{"type":"text","text":"hi"}]}`)
	if p, err := echoPlugin(f, rt, wasm, describe, result); err != nil || len(p.Tools()) != 1 {
		f.Fatalf("hostileecho: %v", err)
	} else {
		inst, err := p.NewInstance(context.Background())
		if err != nil {
			f.Fatal(err)
		}
		res, err := inst.CallTool(context.Background(), &Call{Tool: p.Tools()[0], Arguments: json.RawMessage(`{}`)})
		if err != nil || len(res.Content) != 1 || string(res.Content[0]) != `{"type":"text","text":"hi"}` {
			f.Fatalf("hostileecho call: %v %v", res, err)
		}
		p.Close(context.Background())
	}
	f.Add(describe, result)
	f.Add([]byte(`{"tools":[{"name":"t"},{"name":"u","inputSchema":{"type":"object","$defs":{"d":{"type":"integer"}},"properties":{"n":{"$ref":"#/$defs/d"}}}}]}`), []byte(`{"content":[{"type":"image","data":"aGk=","mimeType":"image/png"}],"structuredContent":[1]}`))
	f.Add([]byte(`{"tools":[{"name":"bad name"}]}`), []byte(`{}`))
	f.Add([]byte(`{"tools":[{"name":"t","inputSchema":{"type":"object","$ref":"https://example.com/s"}}]}`), []byte("\xff"))
	// Issue 12: validation exponential in the argument's depth, and an
	// $id below the root that made "#" refer to itself in place.
	f.Add([]byte(`{"tools":[{"name":"t","inputSchema":{"type":"object","$ref":"#/$defs/n","$defs":{"n":{"anyOf":[{"properties":{"a":{"$ref":"#/$defs/n"}}},{"properties":{"a":{"$ref":"#/$defs/n"}}}]}}}}]}`), []byte(`{"content":[]}`))
	f.Add([]byte(`{"tools":[{"name":"t","inputSchema":{"type":"object","properties":{"a":{"$id":"http://example.com/a","anyOf":[{"$ref":"#"}]}}}}]}`), []byte(`{"content":[]}`))
	f.Fuzz(func(t *testing.T, describe, result []byte) {
		if len(describe) > 1<<16 || len(result) > 1<<16 {
			return
		}
		p, err := echoPlugin(t, rt, wasm, describe, result)
		if err != nil {
			return
		}
		defer p.Close(context.Background())
		inst, err := p.NewInstance(context.Background())
		if err != nil {
			t.Fatalf("a plugin that loaded does not start: %v", err)
		}
		defer inst.Close(context.Background())
		for _, tool := range p.Tools() {
			if !validName.MatchString(tool.Name) {
				t.Fatalf("tool name %q was accepted", tool.Name)
			}
			var schema struct {
				Type string `json:"type"`
			}
			if err := json.Unmarshal(tool.Def.InputSchema, &schema); err != nil || schema.Type != "object" {
				t.Fatalf("input schema %s was accepted", tool.Def.InputSchema)
			}
			_ = tool.ValidateArguments(json.RawMessage(`{"a":"x","n":1}`))
			res, err := inst.CallTool(context.Background(), &Call{Tool: tool, Arguments: json.RawMessage(`{}`)})
			if err != nil {
				continue
			}
			if !utf8.Valid(result) || !json.Valid(result) {
				t.Fatalf("result %q was accepted", result)
			}
			if _, err := json.Marshal(res); err != nil {
				t.Fatalf("an accepted result does not encode: %v", err)
			}
		}
	})
}

// FuzzValidateArguments checks a model's arguments against a schema with
// the keywords tools use. Arguments it accepts must be a JSON object (or
// nothing, which means {}).
func FuzzValidateArguments(f *testing.F) {
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { rt.Close(context.Background()) })
	wasm := testplugins.Bytes(f, testplugins.Test(f, "hostileecho"))
	p, err := echoPlugin(f, rt, wasm, []byte(`{"tools":[{"name":"t","inputSchema":{"type":"object",
		"properties":{"s":{"type":"string","pattern":"^[a-z]+$","maxLength":8},"n":{"type":"integer","minimum":0,"maximum":10},
		"e":{"enum":["a","b"]},"l":{"type":"array","items":{"type":"number"},"maxItems":3},"o":{"type":"object","additionalProperties":{"type":"boolean"}}},
		"required":["s"],"additionalProperties":false}}]}`), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { p.Close(context.Background()) })
	tool := p.Tools()[0]
	for _, s := range []string{`{"s":"abc"}`, `{"s":"abc","n":3,"e":"a","l":[1,2],"o":{"x":true}}`, `{"s":1}`, `[]`, `null`, ``, `{"s":"a","z":0}`, `{"s":"a"} x`,
		`{"s":"a","o":{"x":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}`, `{"s":"a","l":["[{\"]"]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, args []byte) {
		if err := tool.ValidateArguments(args); err != nil {
			return
		}
		trimmed := bytes.TrimSpace(args)
		if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
			return
		}
		var v map[string]any
		if err := json.Unmarshal(args, &v); err != nil {
			t.Fatalf("accepted arguments %q that are not a JSON object: %v", args, err)
		}
		if _, ok := v["s"].(string); !ok {
			t.Fatalf("accepted arguments %q without the required string s", args)
		}
	})
}

// FuzzCallInput encodes a call's input as callInput does, for both
// interfaces: what appendServletInput and appendCallToolInput write must
// be json.Marshal's encoding byte for byte, and they must write the input
// whose tool name needs no escape and whose arguments are as json.Marshal
// writes them (a guest's usual call), rather than leave it to json.Marshal.
func FuzzCallInput(f *testing.F) {
	f.Add("echo", []byte(`{"text":"hi there"}`), []byte(`{"progressToken":1}`), int64(7), true, "sid", "2025-06-18", "")
	f.Add("echo", []byte(`{ "text" : "a<b" }`), []byte(``), int64(-1), false, "", "", "c")
	f.Add("é", []byte("{\"t\":\"\xe2\x80\xa8\"}"), []byte(`[]`), int64(0), true, "a\"b", "", "")
	f.Add("x", []byte(`{"t":"\"\\u003c\\\\"}`), []byte(`null`), int64(1), true, "", "v", "")
	f.Fuzz(func(t *testing.T, name string, args, meta []byte, id int64, numbered bool, session, version, cursor string) {
		p := abi.CallParams{Name: name, Arguments: args, Meta: meta}
		c := abi.CallContext{Meta: meta, SessionID: session, ProtocolVersion: version, Cursor: cursor}
		if numbered {
			c.ID = id
		}
		check := func(got []byte, in any) {
			want, err := json.Marshal(in)
			if got != nil && (err != nil || !bytes.Equal(got, want)) {
				t.Fatalf("wrote %s, json.Marshal writes %s (%v)", got, want, err)
			}
		}
		check(appendServletInput(nil, &p), abi.ServletCallInput{Params: p})
		check(appendCallToolInput(nil, &p, &c), abi.CallToolInput{Request: p, Context: c})

		plain := true
		for i := 0; i < len(name); i++ {
			c := name[i]
			plain = plain && c >= 0x20 && c < 0x7f && !strings.ContainsRune(`"\<>&`, rune(c))
		}
		m, err := json.Marshal(json.RawMessage(args))
		if !plain || err != nil {
			return
		}
		p = abi.CallParams{Name: name, Arguments: m}
		if appendServletInput(nil, &p) == nil {
			t.Fatalf("left the call of %q with arguments %s to json.Marshal", name, m)
		}
		for _, c := range []abi.CallContext{{ID: id, Meta: json.RawMessage(`{}`), SessionID: "s", ProtocolVersion: "2025-06-18"}, {Meta: m}, {ID: id, Cursor: "c"}} {
			in := appendCallToolInput(nil, &p, &c)
			if in == nil {
				t.Fatalf("left the call of %q with arguments %s and context %+v to json.Marshal", name, m, c)
			}
			check(in, abi.CallToolInput{Request: p, Context: c})
		}
	})
}
