package host

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
)

// Fuzz targets for what the host makes of bytes that a plugin or a client
// chose (see docs/SECURITY.md): a guest's result, shaped and capped for
// the client; a guest's question; a client's request state.

// FuzzToMCP converts a guest's result as callTool does, and caps it. A
// result that converts must encode for the client, and what the cap keeps
// must fit the limit. A block plainText takes (the fuzzed bytes as one)
// must decode to the same text block; and plainText must take what
// encoding/json writes for a text block whose text needs no escape.
func FuzzToMCP(f *testing.F) {
	for _, s := range []string{
		`{"content":[{"type":"text","text":"hello"}]}`,
		`{"content":[{"type":"text","text":"héllo ✓"},{"type":"image","data":"aGk=","mimeType":"image/png"}],"structuredContent":{"n":1},"isError":true,"_meta":{"k":"v"}}`,
		`{"content":[{"type":"text","text":"a","annotations":{"audience":["user"]},"_meta":{"x":1}}]}`,
		`{"content":[{"type":"resource","resource":{"uri":"file:///x","text":"t"}}]}`,
		`{"content":[{"type":"audio","data":"aGk=","mimeType":"audio/wav"},{"type":"resource_link","uri":"x:y","name":"n"}]}`,
		`{"content":[{"type":"hologram"}]}`, `{"content":[1]}`, `{"content":[],"_meta":[]}`,
	} {
		f.Add([]byte(s), 10)
		f.Add([]byte(s), 0)
	}
	f.Fuzz(func(t *testing.T, out []byte, limit int) {
		if text, ok := plainText(out); ok {
			var block struct {
				Type        string          `json:"type"`
				Text        string          `json:"text"`
				Annotations json.RawMessage `json:"annotations"`
				Meta        json.RawMessage `json:"_meta"`
			}
			if err := json.Unmarshal(out, &block); err != nil || block.Type != "text" || block.Text != text || block.Annotations != nil || block.Meta != nil {
				t.Fatalf("plainText(%q) = %q, a decoder reads %+v (%v)", out, text, block, err)
			}
		}
		if b, err := json.Marshal(abi.TextContent{Type: "text", Text: string(out)}); err != nil {
			t.Fatal(err)
		} else if _, ok := plainText(b); !ok && !bytes.ContainsRune(b, '\\') {
			t.Fatalf("plainText does not take %s, as encoding/json writes a text block", b)
		}
		var r abi.CallToolResult
		if json.Unmarshal(out, &r) != nil {
			return // decodeJSON refuses it first
		}
		res, err := toMCP(&r)
		if err != nil {
			return
		}
		if _, err := json.Marshal(res); err != nil {
			t.Fatalf("a converted result does not encode for the client: %v", err)
		}
		if limit < 0 {
			limit = -limit
		}
		limit %= 1 << 16
		capResult(res, limit)
		if _, err := json.Marshal(res); err != nil {
			t.Fatalf("a capped result does not encode for the client: %v", err)
		}
		kept := 0
		for i, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				if i == len(res.Content)-1 && (strings.HasPrefix(tc.Text, "[wasmtools: the result was over the") || strings.HasPrefix(tc.Text, "[wasmtools: the result had more than")) {
					continue // the note
				}
				kept += utf8.RuneCountInString(tc.Text)
				continue
			}
			b, _ := json.Marshal(c)
			kept += utf8.RuneCount(b)
		}
		if res.StructuredContent != nil {
			b, _ := json.Marshal(res.StructuredContent)
			kept += utf8.RuneCount(b)
		}
		if kept > limit {
			t.Fatalf("capped at %d, the result keeps %d", limit, kept)
		}
	})
}

// FuzzElicitParams checks a guest's question as create_elicitation does,
// and an answer against a form question's schema. A question it accepts
// must be one MCP allows: a form of primitive properties, or a URL with an
// elicitation ID.
func FuzzElicitParams(f *testing.F) {
	for _, s := range []string{
		`{"message":"Name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}`,
		`{"mode":"form","message":"Sure?","requestedSchema":{"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":1}}}}`,
		`{"mode":"url","message":"Sign in","url":"https://example.com/","elicitationId":"e1"}`,
		`{"message":"x","requestedSchema":{"type":"object","properties":{"o":{"type":"object"}}}}`,
		`{"message":"x","requestedSchema":{"type":"string"}}`,
		`{"mode":"voice","message":"x"}`, `{"message":""}`,
	} {
		f.Add([]byte(s), []byte(`{"name":"ann","ok":true,"n":2}`))
	}
	f.Fuzz(func(t *testing.T, in, answer []byte) {
		var r abi.ElicitRequest
		if strictJSON(in, &r) != nil {
			return
		}
		params, schema, err := elicitParams(r)
		if err != nil {
			return
		}
		switch params.Mode {
		case "url":
			if params.URL == "" || params.ElicitationID == "" || params.Message == "" {
				t.Fatalf("accepted a url question without its url, ID or message: %+v", params)
			}
			if len(params.ElicitationID) > maxElicitationID {
				t.Fatalf("accepted a url question whose ID is %d bytes, over %d", len(params.ElicitationID), maxElicitationID)
			}
		case "form":
			var s struct {
				Type       string                     `json:"type"`
				Properties map[string]json.RawMessage `json:"properties"`
			}
			if err := json.Unmarshal(schema, &s); err != nil || s.Type != "object" {
				t.Fatalf("accepted a form schema %s that is not an object schema", schema)
			}
			for name, p := range s.Properties {
				var prop struct {
					Type string `json:"type"`
				}
				json.Unmarshal(p, &prop)
				if prop.Type != "string" && prop.Type != "number" && prop.Type != "integer" && prop.Type != "boolean" {
					t.Fatalf("accepted a form property %q of type %q", name, prop.Type)
				}
			}
			var content map[string]any
			if json.Unmarshal(answer, &content) == nil {
				_ = validateAnswer(schema, content)
			}
		default:
			t.Fatalf("accepted a question of mode %q", params.Mode)
		}
		if _, err := json.Marshal(params); err != nil {
			t.Fatalf("an accepted question does not encode for the client: %v", err)
		}
	})
}

// FuzzVerifyState checks request states as a retried call's are checked.
// The host must accept only a state it signed, unexpired, for the tool it
// names: whatever it accepts must name a call, round and tool it signed.
func FuzzVerifyState(f *testing.F) {
	h := &Host{stateKey: []byte("a key of 32 bytes for the fuzzer")}
	type signed struct {
		id    string
		round int
		tool  string
	}
	valid := map[signed]bool{}
	for _, s := range []signed{{"00112233445566778899aabb", 2, "ask"}, {"ffeeddccbbaa998877665544", 7, "delete"}} {
		valid[s] = true
		f.Add(h.signState(s.id, s.round, time.Now().Add(time.Hour), s.tool), s.tool)
	}
	expired := h.signState("0123456789abcdef01234567", 1, time.Now().Add(-time.Minute), "ask")
	f.Add(expired, "ask")
	f.Add("garbage", "ask")
	f.Add(".", "")
	f.Add("djF8aWR8MXw5OTk5OTk5OTk5fGFzaw.AAAA", "ask")
	f.Fuzz(func(t *testing.T, state, tool string) {
		id, round, err := h.verifyState(state, tool)
		if err != nil {
			return
		}
		if !valid[signed{id, round, tool}] {
			t.Fatalf("accepted state %q for tool %q, naming call %q round %d, which the host never signed", state, tool, id, round)
		}
	})
}

// FuzzHandles checks a client's session handle and splits a client's
// arguments. A handle is accepted only as minted, for the subject it was
// minted for. What splitting leaves is an object without the session
// argument, whose members are those of a decoder's reading of the
// arguments less that one (splitByMap, the decoding the scan replaced),
// and the handle it reads is the argument's string.
func FuzzHandles(f *testing.F) {
	h := &Host{macs: newHandleMACs([]byte("a key of 32 bytes for the fuzzer"))}
	sign := func(replica, id, subject string) string {
		body := replica + strings.Join([]string{handleVersion, id, h.subjectTag(subject)}, ".")
		return body + "." + h.handleMAC(body)
	}
	minted := map[string]string{} // handle -> subject
	for _, m := range [][3]string{{"", "AAAAAAAAAAAAAAAAAAAAAA", ""}, {"r1.", "q83vEjRWeJCrze8SNFZ4kA", "alice"}} {
		handle := sign(m[0], m[1], m[2])
		minted[handle] = m[2]
		f.Add(handle, m[2], `{"wasmtools_session":"`+handle+`","x":1}`)
		f.Add(handle, "bob", `{"x":{"wasmtools_session":1}}`)
		f.Add(handle+"A", m[2], ` { "y" : [1,{"z":"}"}] , "wasmtools_session" : "`+handle+`" } `)
	}
	f.Add("wt1.-.x.-.y", "", `{"wasmtools_session":null}`)
	f.Add("", "", `[1,"wasmtools_session"]`)
	f.Add("wt1....", "", `{"wasmtools_session":7}`)
	f.Add("", "", `{"wasmtools\u005fsession":"x","y":"\u00e9"}`)
	f.Add("", "", `{"a":1,"wasmtools_session":"x","a":2,"wasmtools_session":"y","b":"\"}"}`)
	f.Add("", "", `{"wasmtools_session":"x"}`)
	f.Add("", "", `{"wasmtools_session":"x","a":1e999,"b":"<\u00e9>"}`)
	f.Fuzz(func(t *testing.T, handle, subject, args string) {
		key, err := h.checkHandle(handle, subject)
		s, ok := minted[handle]
		switch {
		case err == nil && (!ok || s != subject):
			t.Fatalf("accepted handle %q for subject %q, which the host never minted", handle, subject)
		case err == nil:
			if fields := strings.Split(handle, "."); key != handleKey(fields[len(fields)-3]) {
				t.Fatalf("handle %q: key %v, not its id's", handle, key)
			}
		case ok && s == subject:
			t.Fatalf("refused handle %q, minted for subject %q: %v", handle, subject, err)
		}
		rest, got, err := splitSessionArgument(json.RawMessage(args))
		want, wantHandle, wantErr := splitByMap(json.RawMessage(args))
		if (err == nil) != (wantErr == nil) || got != wantHandle {
			t.Fatalf("split %q: handle %q, %v; the decoder's: %q, %v", args, got, err, wantHandle, wantErr)
		}
		if string(want) == args {
			if string(rest) != args {
				t.Fatalf("split %q into %q; the decoder left it whole", args, rest)
			}
			return // not an object with the argument: untouched
		}
		// Numbers as written: a float64 refuses 1e999, which is JSON.
		decode := func(b []byte, v any) error {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			return d.Decode(v)
		}
		var m, wm map[string]any
		if decode(rest, &m) != nil {
			t.Fatalf("split %q into %q, not an object", args, rest)
		}
		if _, ok := m[SessionArgument]; ok {
			t.Fatalf("split %q kept the session argument: %q", args, rest)
		}
		decode(want, &wm)
		if !reflect.DeepEqual(m, wm) {
			t.Fatalf("split %q into %q; the decoder's: %q", args, rest, want)
		}
	})
}

// splitByMap is splitSessionArgument as it was, by a decoding into a map
// and an encoding back: FuzzHandles's reference.
func splitByMap(args json.RawMessage) (rest json.RawMessage, handle string, err error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(args, &m) != nil {
		return args, "", nil
	}
	raw, ok := m[SessionArgument]
	if !ok {
		return args, "", nil
	}
	delete(m, SessionArgument)
	if rest, err = json.Marshal(m); err != nil {
		return args, "", nil
	}
	if string(raw) == "null" {
		return rest, "", nil
	}
	if json.Unmarshal(raw, &handle) != nil {
		return rest, "", fmt.Errorf("%w: the %s argument must be a string", ErrHandle, SessionArgument)
	}
	return rest, handle, nil
}
