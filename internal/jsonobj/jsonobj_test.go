package jsonobj_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/wasmtools/wasmtools/internal/jsonobj"
)

func TestCut(t *testing.T) {
	for _, c := range []struct {
		obj, rest, value string
		found            bool
	}{
		{`{"a":1,"s":"h"}`, `{"a":1}`, `"h"`, true},
		{`{"s":"h","a":1}`, `{"a":1}`, `"h"`, true},
		{`{"s":"h"}`, `{}`, `"h"`, true},
		{` { "a" : [1, {"s":"}"}] ,	"s" : null , "b":"\"s\"" } `, `{"a" : [1, {"s":"}"}],"b":"\"s\""}`, `null`, true},
		{`{"s":1,"a":{"b":[]},"s":{"x":"y"}}`, `{"a":{"b":[]}}`, `{"x":"y"}`, true},
		{`{"\u0073":true,"a":-1.5e3}`, `{"a":-1.5e3}`, `true`, true},
		{`{"a":{"s":1}}`, `{"a":{"s":1}}`, ``, false},
		{`{"ss":1,"a":"s"}`, `{"ss":1,"a":"s"}`, ``, false},
		{`["s",1]`, `["s",1]`, ``, false},
		{`"s"`, `"s"`, ``, false},
		{`{"s":1`, `{"s":1`, ``, false},
		{`{"s":1}{}`, `{"s":1}{}`, ``, false},
		{`{}`, `{}`, ``, false},
	} {
		rest, value, found := jsonobj.Cut([]byte(c.obj), "s")
		if string(rest) != c.rest || string(value) != c.value || found != c.found {
			t.Errorf("Cut(%s) = %s, %s, %v; want %s, %s, %v", c.obj, rest, value, found, c.rest, c.value, c.found)
		}
	}
}

// FuzzCut checks Cut against a decoder: what it leaves decodes as the
// object less the name, and the value it returns is the one a decoder
// reads for the name. What a decoder does not read as an object with the
// name, Cut returns as it is.
func FuzzCut(f *testing.F) {
	for _, s := range []string{`{"s":"h","a":1}`, `{"a":[{"s":1}],"\u0073":2,"s":3}`, `{"s" : "\"}\\"}`, `[{"s":1}]`, `{"s":1,}`, `{"a":"\ud800","s":[]}`} {
		f.Add([]byte(s), "s")
	}
	f.Add([]byte(`{"a\/b":1}`), "a/b")
	f.Add([]byte("{\"s\xff\":1}"), "s\ufffd")
	f.Fuzz(func(t *testing.T, obj []byte, name string) {
		if !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == '"' || r == '\\' }) {
			return // not a name Cut takes
		}
		rest, value, found := jsonobj.Cut(obj, name)
		var m map[string]json.RawMessage
		want, ok := json.RawMessage(nil), false
		if json.Unmarshal(obj, &m) == nil {
			want, ok = m[name]
		}
		if found != ok {
			t.Fatalf("Cut(%q, %q): found %v; a decoder: %v", obj, name, found, ok)
		}
		if !found {
			if !bytes.Equal(rest, obj) || value != nil {
				t.Fatalf("Cut(%q, %q) = %q, %q; want it as it is", obj, name, rest, value)
			}
			return
		}
		var got, wantv any
		if json.Unmarshal(value, &got) != nil || json.Unmarshal(want, &wantv) != nil || !reflect.DeepEqual(got, wantv) {
			t.Fatalf("Cut(%q, %q): value %q; a decoder's %q", obj, name, value, want)
		}
		var r map[string]any
		if err := json.Unmarshal(rest, &r); err != nil {
			t.Fatalf("Cut(%q, %q) left %q: %v", obj, name, rest, err)
		}
		var full map[string]any
		json.Unmarshal(obj, &full)
		delete(full, name)
		if !reflect.DeepEqual(r, full) {
			t.Fatalf("Cut(%q, %q) left %q; want the members of %v", obj, name, rest, full)
		}
	})
}
