package plugins

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// BenchmarkValidateArguments: one call's argument validation, warm (the
// schema compiled once, at load), for the test plugins' two shapes of
// schema: the counter's empty object with no arguments, and the servlet's
// echo with a 50-byte text.
func BenchmarkValidateArguments(b *testing.B) {
	for _, c := range []struct{ name, schema, args string }{
		{"empty", `{"type":"object"}`, `{}`},
		{"echo", `{"type":"object","properties":{"text":{"type":"string","description":"the text to return"}},"required":["text"]}`, `{"text":"` + strings.Repeat("x", 50) + `"}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			s, err := compileSchema(json.RawMessage(c.schema))
			if err != nil {
				b.Fatal(err)
			}
			t := &Tool{schema: s}
			args := json.RawMessage(c.args)
			b.ReportAllocs()
			for b.Loop() {
				if err := t.ValidateArguments(args); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// flatCases are schemas and arguments on which flatSchema's proof is
// checked against the full validator: it may only prove valid what the
// validator accepts.
var flatCases = struct{ schemas, args []string }{
	schemas: []string{
		`{"type":"object"}`,
		`{"type":"object","properties":{"text":{"type":"string","description":"d"}},"required":["text"]}`,
		`{"type":"object","properties":{"text":{"type":"string"},"b":{"type":"boolean"}},"additionalProperties":false}`,
		`{"type":"object","properties":{"a":{"type":"string"}},"required":["a","z"]}`,
		`{"type":"object","properties":{"a":{"type":"string"}},"required":["z"],"additionalProperties":false}`,
		`{"type":"object","properties":{"t\ufffdxt":{"type":"boolean"}}}`,
	},
	args: []string{
		``, `null`, `{}`, ` { } `, `[]`, `"x"`, `{"text":"x"}`, `{"text":1}`, `{"text":"x","text":true}`, `{"text":true,"text":"x"}`,
		`{"text":"a\"b\\","b":false}`, `{"b":true}`, `{"c":"x"}`, `{"a":"x","z":true}`, `{"z":"y"}`, `{"t\u0065xt":1}`,
		"{\"t\xffxt\":\"s\"}", `{"text":null}`, `{"text":"x"} x`, `{"text":"x",}`, `{"TEXT":"x"}`, `{"text":"x","n":1e400}`,
		"\f{}", "\v", "{}\u0085", "\u00a0{}", "\u00a0null", "\t{}\r\n",
	},
}

func TestFlatSchemaAgrees(t *testing.T) {
	for _, schema := range flatCases.schemas {
		for _, args := range flatCases.args {
			checkFlatAgrees(t, schema, args)
		}
	}
}

func FuzzFlatSchemaAgrees(f *testing.F) {
	for i := range flatCases.schemas {
		for _, a := range flatCases.args {
			f.Add(i, a)
		}
	}
	f.Fuzz(func(t *testing.T, i int, args string) {
		checkFlatAgrees(t, flatCases.schemas[uint(i)%uint(len(flatCases.schemas))], args)
	})
}

// checkFlatAgrees fails if ValidateArguments' verdict on args differs
// from the full validator's (decoding into any, then Validate).
func checkFlatAgrees(t *testing.T, schema, args string) {
	t.Helper()
	s, err := compileSchema(json.RawMessage(schema))
	if err != nil {
		t.Fatal(err)
	}
	if s.flat == nil {
		t.Fatalf("schema %s is not flat", schema)
	}
	if s.checkArguments([]byte(args)) != nil {
		return
	}
	got := (&Tool{schema: s}).ValidateArguments(json.RawMessage(args))
	var v any = map[string]any{}
	var want error
	if a := strings.Trim(args, jsonSpace); a != "" && a != "null" {
		if err := json.Unmarshal([]byte(args), &v); err != nil {
			want = err
		}
	}
	if _, ok := v.(map[string]any); want == nil && !ok {
		want = errors.New("not an object")
	}
	if want == nil {
		want = s.Validate(v)
	}
	if (got == nil) != (want == nil) {
		t.Errorf("schema %s, arguments %q: ValidateArguments says %v, the validator %v", schema, args, got, want)
	}
}
