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
		name, obj, rest, value string
		found                  bool
	}{
		{"last", `{"a":1,"s":"h"}`, `{"a":1}`, `"h"`, true},
		{"first", `{"s":"h","a":1}`, `{"a":1}`, `"h"`, true},
		{"alone", `{"s":"h"}`, `{}`, `"h"`, true},
		{"spaced_and_nested", ` { "a" : [1, {"s":"}"}] ,	"s" : null , "b":"\"s\"" } `, `{"a" : [1, {"s":"}"}],"b":"\"s\""}`, `null`, true},
		{"twice", `{"s":1,"a":{"b":[]},"s":{"x":"y"}}`, `{"a":{"b":[]}}`, `{"x":"y"}`, true},
		{"escaped_name", `{"\u0073":true,"a":-1.5e3}`, `{"a":-1.5e3}`, `true`, true},
		{"after_an_escape", `{"a":"\u00e9","b":2,"s":3,"c":4}`, `{"a":"\u00e9","b":2,"c":4}`, `3`, true},
		{"nested_only", `{"a":{"s":1}}`, `{"a":{"s":1}}`, ``, false},
		{"longer_name", `{"ss":1,"a":"s"}`, `{"ss":1,"a":"s"}`, ``, false},
		{"array", `["s",1]`, `["s",1]`, ``, false},
		{"string", `"s"`, `"s"`, ``, false},
		{"truncated", `{"s":1`, `{"s":1`, ``, false},
		{"two_values", `{"s":1}{}`, `{"s":1}{}`, ``, false},
		{"empty", `{}`, `{}`, ``, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rest, value, found := jsonobj.Cut([]byte(c.obj), "s")
			if string(rest) != c.rest || string(value) != c.value || found != c.found {
				t.Errorf("Cut(%s) = %s, %s, %v; want %s, %s, %v", c.obj, rest, value, found, c.rest, c.value, c.found)
			}
		})
	}
}

// FuzzCut checks Cut against a decoder: what it leaves decodes as the
// object less the name, and the value it returns is the one a decoder
// reads for the name. What a decoder does not read as an object with the
// name, Cut returns as it is.
func FuzzCut(f *testing.F) {
	for _, s := range []string{`{"s":1e999,"a":1e999}`, `{"s":"h","a":1}`, `{"a":[{"s":1}],"\u0073":2,"s":3}`, `{"s" : "\"}\\"}`, `[{"s":1}]`, `{"s":1,}`, `{"a":"\ud800","s":[]}`} {
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
		if !bytes.Equal(value, want) {
			t.Fatalf("Cut(%q, %q): value %q; a decoder's %q", obj, name, value, want)
		}
		var r map[string]json.RawMessage
		if err := json.Unmarshal(rest, &r); err != nil {
			t.Fatalf("Cut(%q, %q) left %q: %v", obj, name, rest, err)
		}
		delete(m, name)
		if !reflect.DeepEqual(r, m) {
			t.Fatalf("Cut(%q, %q) left %q; want the members of %q", obj, name, rest, m)
		}
	})
}
