package plugins

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// Pathological input schemas (issue 12, "Validation outside the
// deadline"): each makes jsonschema-go's validation time grow
// exponentially in the depth of a small argument, or in the length of a
// small schema. Before checkCost, "anyOf twice, through properties" took
// 4.4 s for a 110-byte argument (18 levels), "oneOf twice, through items"
// 2.6 s for 42 bytes, and "allOf chain" 5 s for {} with a 1.3 KiB schema,
// each doubling with every level.
var pathologicalSchemas = []struct {
	name, schema, want string
}{
	{"anyOf twice, through properties", `{"type":"object","$ref":"#/$defs/n","$defs":{"n":{"anyOf":[{"type":"object","properties":{"a":{"$ref":"#/$defs/n"}}},{"type":"object","properties":{"a":{"$ref":"#/$defs/n"}}}]}}}`, "at /a/a/a/a/a/a/a/a/a/a/a (depth 12)"},
	{"anyOf twice, through items", `{"type":"object","properties":{"x":{"$ref":"#/$defs/l"}},"$defs":{"l":{"anyOf":[{"items":{"$ref":"#/$defs/l"}},{"items":{"$ref":"#/$defs/l"}}]}}}`, "at /x/*/*/*/*/*/*/*/*/*/*/* (depth 13)"},
	{"oneOf twice, through items", `{"type":"object","properties":{"x":{"$ref":"#/$defs/l"}},"$defs":{"l":{"oneOf":[{"items":{"$ref":"#/$defs/l"}},{"items":{"$ref":"#/$defs/l"},"minItems":0}]}}}`, "most often #/$defs/l"},
	{"not of anyOf", `{"type":"object","properties":{"x":{"$ref":"#/$defs/l"}},"$defs":{"l":{"not":{"anyOf":[{"items":{"$ref":"#/$defs/l"}},{"items":{"$ref":"#/$defs/l"}}]}}}}`, "most often #/$defs/l"},
	{"allOf of anyOfs", `{"type":"object","properties":{"x":{"$ref":"#/$defs/l"}},"$defs":{"l":{"allOf":[{"anyOf":[{"items":{"$ref":"#/$defs/l"}},{"type":"array"}]},{"anyOf":[{"items":{"$ref":"#/$defs/l"}},{"type":"array"}]}]}}}`, "most often #/$defs/l"},
	{"items and contains", `{"type":"object","properties":{"x":{"$ref":"#/$defs/l"}},"$defs":{"l":{"type":"array","items":{"$ref":"#/$defs/l"},"contains":{"$ref":"#/$defs/l"}}}}`, "at /x/*/*"},
	{"properties and patternProperties", `{"type":"object","$ref":"#/$defs/o","$defs":{"o":{"type":"object","properties":{"a":{"$ref":"#/$defs/o"}},"patternProperties":{"^a":{"$ref":"#/$defs/o"}}}}}`, "at /a/a/a"},
	{"two patternProperties", `{"type":"object","patternProperties":{"^x":{"$ref":"#"},"y$":{"$ref":"#"}}}`, "at /*/*/*"},
	{"additionalProperties and unevaluatedProperties", `{"type":"object","additionalProperties":{"$ref":"#"},"unevaluatedProperties":{"$ref":"#"}}`, "at /*/*/*"},
	{"if then else", `{"type":"object","properties":{"x":{"$ref":"#/$defs/l"}},"$defs":{"l":{"if":{"items":{"$ref":"#/$defs/l"}},"then":{"items":{"$ref":"#/$defs/l"}}}}}`, "most often #/$defs/l"},
	{"allOf chain", allOfChain(14), "at / (depth 1)"},
	{"anyOf of wide allOfs", `{"type":"object","$defs":{"w":{"allOf":[{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"},{"$ref":"#/$defs/v"}]},"v":{"anyOf":[{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"},{"$ref":"#/$defs/u"}]},"u":{"oneOf":[{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"},{"$ref":"#/$defs/t"}]},"t":{"anyOf":[{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"},{"$ref":"#/$defs/s"}]},"s":{"not":{"type":"null"}}},"properties":{"p":{"$ref":"#/$defs/w"}}}`, "at /p (depth 2)"},
	// Key case does not matter to encoding/json: "ANYOF" is anyOf.
	{"keys in another case", `{"type":"object","properties":{"x":{"$REF":"#/$defs/l"}},"$defs":{"l":{"ANYOF":[{"items":{"$ref":"#/$defs/l"}},{"Items":{"$ref":"#/$defs/l"}}]}}}`, "most often #/$defs/l"},
	// The validator percent-decodes a $ref's fragment: "a%62" is "ab" to
	// it, while checkRefs found the harmless "a%62".
	{"percent-encoded $ref", `{"type":"object","properties":{"x":{"$ref":"#/$defs/a%62"}},"$defs":{"a%62":{},"ab":{"anyOf":[{"items":{"$ref":"#/$defs/a%62"}},{"items":{"$ref":"#/$defs/a%62"}}]}}}`, "percent-encoded"},
	// Below an $id, "#" means that subschema to the validator, not the root
	// checkRefs resolves it against: this one overflowed the stack.
	{"nested $id", `{"type":"object","properties":{"x":{"$id":"http://example.com/x","anyOf":[{"$ref":"#"}]}}}`, "$id is only allowed at the root"},
}

// allOfChain is a schema of n definitions, each applying the next one
// twice: 2^n applications to the arguments, in 66n bytes.
func allOfChain(n int) string {
	return chainSchema(n, `{"type":"object","$ref":"#/$defs/d0"`, `{"type":"object"}`)
}

// chainSchema is the schema head, then $defs: n definitions each applying
// the next twice, and the last one, leaf.
func chainSchema(n int, head, leaf string) string {
	var defs []string
	for i := range n {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i+1, i+1))
	}
	defs = append(defs, fmt.Sprintf(`"d%d":%s`, n, leaf))
	return head + `,"$defs":{` + strings.Join(defs, ",") + `}}`
}

func TestCompileSchemaRefusesCostly(t *testing.T) {
	for _, tt := range pathologicalSchemas {
		t.Run(tt.name, func(t *testing.T) {
			_, err := compileSchema(json.RawMessage(tt.schema))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want %q", err, tt.want)
			}
			if !strings.Contains(err.Error(), "$id") && !strings.Contains(err.Error(), "percent-encoded") && !strings.Contains(err.Error(), "validation could blow up") {
				t.Errorf("err = %v; want the reason", err)
			}
		})
	}
}

// typicalSchemas are input schemas as MCP tools write them; none may be
// refused.
var typicalSchemas = map[string]string{
	"empty":   `{"type":"object"}`,
	"typed":   `{"type":"object","properties":{"path":{"type":"string","minLength":1},"limit":{"type":"integer","minimum":1,"maximum":100},"recursive":{"type":"boolean","default":false}},"required":["path"],"additionalProperties":false}`,
	"enums":   `{"type":"object","properties":{"tz":{"type":"string","enum":[` + strings.Repeat(`"Europe/Paris",`, 599) + `"UTC"]},"mode":{"enum":["a","b","c"]}}}`,
	"objects": `{"type":"object","properties":{"issues":{"type":"array","maxItems":50,"items":{"type":"object","properties":{"title":{"type":"string"},"labels":{"type":"array","items":{"type":"string"},"uniqueItems":true},"assignee":{"type":["string","null"]}},"required":["title"]}}}}`,
	"oneOf": `{"type":"object","properties":{"target":{"oneOf":[{"type":"object","properties":{"kind":{"const":"file"},"path":{"type":"string"}},"required":["kind","path"]},
		{"type":"object","properties":{"kind":{"const":"url"},"url":{"type":"string","format":"uri"}},"required":["kind","url"]},
		{"type":"object","properties":{"kind":{"const":"text"},"text":{"type":"string"}},"required":["kind","text"]}]},
		"filter":{"anyOf":[{"type":"string"},{"type":"array","items":{"type":"string"}}]}}}`,
	"defs": `{"type":"object","$defs":{"point":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}}},"box":{"type":"object","properties":{"min":{"$ref":"#/$defs/point"},"max":{"$ref":"#/$defs/point"}}}},
		"properties":{"boxes":{"type":"array","items":{"$ref":"#/$defs/box"}},"origin":{"$ref":"#/$defs/point"}}}`,
	"tree":               `{"type":"object","$defs":{"node":{"type":"object","properties":{"value":{"type":"string"},"left":{"$ref":"#/$defs/node"},"right":{"$ref":"#/$defs/node"},"children":{"type":"array","items":{"$ref":"#/$defs/node"}}}}},"properties":{"root":{"$ref":"#/$defs/node"}}}`,
	"json value":         `{"type":"object","$defs":{"v":{"anyOf":[{"type":"null"},{"type":"boolean"},{"type":"number"},{"type":"string"},{"type":"array","items":{"$ref":"#/$defs/v"}},{"type":"object","additionalProperties":{"$ref":"#/$defs/v"}}]}},"properties":{"data":{"$ref":"#/$defs/v"}}}`,
	"conditions":         `{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"if":{"required":["a"]},"then":{"required":["b"]},"dependentSchemas":{"b":{"properties":{"c":{"type":"integer"}}}}}`,
	"draft-07":           `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object","definitions":{"s":{"type":"string"}},"properties":{"l":{"type":"array","items":[{"$ref":"#/definitions/s"},{"type":"integer"}],"additionalItems":false}},"dependencies":{"l":["m"]}}`,
	"root $id":           `{"$id":"https://example.com/tool.json","type":"object","properties":{"x":{"$ref":"#/$defs/x"}},"$defs":{"x":{"type":"string"}}}`,
	"allOf chain":        allOfChain(10),
	"wide and recursive": wideSchema(300),
}

// wideSchema has n properties, each an object whose properties are again
// the n properties: a large recursive schema, costly to analyse.
func wideSchema(n int) string {
	var props []string
	for i := range n {
		props = append(props, fmt.Sprintf(`"p%d":{"$ref":"#/$defs/o"}`, i))
	}
	return `{"type":"object","$ref":"#/$defs/o","$defs":{"o":{"type":"object","properties":{` + strings.Join(props, ",") + `},"additionalProperties":{"type":"string"}}}}`
}

func TestCompileSchemaAcceptsTypical(t *testing.T) {
	for name, schema := range typicalSchemas {
		t.Run(name, func(t *testing.T) {
			start := time.Now()
			if _, err := compileSchema(json.RawMessage(schema)); err != nil {
				t.Fatalf("refused: %v", err)
			}
			t.Logf("compiled in %v", time.Since(start))
		})
	}
}

// TestLoadAcceptsRealSchemas loads the example plugins and the test
// plugins that list tools: the cost check refuses none of their schemas.
func TestLoadAcceptsRealSchemas(t *testing.T) {
	rt := testplugins.Runtime(t)
	paths := []string{}
	for _, name := range []string{"confirm", "counter", "everything", "hash", "longtask", "notes"} {
		paths = append(paths, testplugins.Example(t, name))
	}
	for _, name := range []string{"servlet", "pdkhost", "relister", "notesbad"} {
		paths = append(paths, testplugins.Test(t, name))
	}
	for _, path := range paths {
		p, err := Load(context.Background(), rt, path, testplugins.Bytes(t, path), Options{})
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		most := sat(0)
		for _, tool := range p.Tools() {
			most = max(most, tool.schema.perValue)
		}
		t.Logf("%s: %d tools, up to %d checks per value", filepath.Base(path), len(p.Tools()), most)
		p.Close(context.Background())
	}
}

func TestValidateArgumentsBounds(t *testing.T) {
	worst, err := compileSchema(json.RawMessage(allOfChain(10)))
	if err != nil {
		t.Fatal(err)
	}
	flat, err := compileSchema(json.RawMessage(`{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		schema *inputSchema
		args   string
		want   string
	}{
		{"too deep", flat, `{"a":` + strings.Repeat("[", MaxArgumentDepth) + strings.Repeat("]", MaxArgumentDepth) + `}`, "nested deeper than 64 levels"},
		{"deep enough", flat, `{"b":` + strings.Repeat("[", MaxArgumentDepth-1) + strings.Repeat("]", MaxArgumentDepth-1) + `}`, ""},
		{"brackets in strings", flat, `{"b":"` + strings.Repeat("[", 100) + `\"{"}`, ""},
		{"too big", flat, `{"b":"` + strings.Repeat("x", MaxArgumentBytes) + `"}`, "over the limit of 4194304"},
		{"too many values for the schema", worst, `{"a":[` + strings.Repeat("1,", 300) + `1]}`, "over the limit of 1048576 for one call"},
		{"as many values for a flat schema", flat, `{"a":[` + strings.Repeat("1,", 300) + `1]}`, ""},
		{"too long a string for the schema", worst, `{"b":"` + strings.Repeat("x", 64<<10) + `"}`, "over the limit of 1048576 for one call"},
		{"as long a string for a flat schema", flat, `{"b":"` + strings.Repeat("x", 64<<10) + `"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool := &Tool{schema: tt.schema}
			err := tool.ValidateArguments(json.RawMessage(tt.args))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidArguments) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want %q", err, tt.want)
			}
		})
	}
}

// TestValidationCostBounded validates, against the costliest schemas
// accepted, the largest arguments accepted for them, and compares the time
// with a flat schema's largest argument, measured in the same test: each
// costs a small multiple of that baseline, not 2^depth of it. The worst
// cases are an allOf chain of 4094 applications to every array item, and
// anyOf of the JSON types with a failing check printing the argument at
// every level (a factor of the depth, before values were weighted by it).
func TestValidationCostBounded(t *testing.T) {
	compile := func(schema string) *inputSchema {
		s, err := compileSchema(json.RawMessage(schema))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	// largest is an argument {"a": [[…[1,1,…]…]]}, nested depth deep, with
	// as many items as the schema accepts.
	largest := func(s *inputSchema, depth int) json.RawMessage {
		n := int(maxCallApplications/max(s.perValue, 1))/(depth+1) - 3*depth
		return json.RawMessage(`{"a":` + strings.Repeat("[", depth) + strings.Repeat("1,", n) + "1" + strings.Repeat("]", depth) + `}`)
	}
	measure := func(s *inputSchema, args json.RawMessage) time.Duration {
		tool := &Tool{schema: s}
		best := time.Duration(1 << 62)
		for range 3 {
			start := time.Now()
			if err := tool.ValidateArguments(args); err != nil {
				t.Fatalf("largest accepted argument refused: %v", err)
			}
			best = min(best, time.Since(start))
		}
		return best
	}
	flat := compile(`{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}}}`)
	baseArgs := largest(flat, 1)
	base := measure(flat, baseArgs)
	t.Logf("baseline: flat schema, %d bytes in %v", len(baseArgs), base)
	chain := compile(chainSchema(10, `{"type":"object","properties":{"a":{"type":"array","items":{"$ref":"#/$defs/d0"}}}`, `{"type":"integer"}`))
	jsonValue := compile(`{"type":"object","$defs":{"v":{"anyOf":[{"type":"null"},{"type":"boolean"},{"type":"number"},{"type":"string"},{"type":"array","items":{"$ref":"#/$defs/v"}},{"type":"object","additionalProperties":{"$ref":"#/$defs/v"}}]}},"properties":{"a":{"$ref":"#/$defs/v"}}}`)
	const hostname = `"^[a-z0-9-]{1,63}(\\.[a-z0-9-]{1,63})*$"`
	chainPattern := compile(chainSchema(8, `{"type":"object","properties":{"a":{"$ref":"#/$defs/d0"}}`, `{"type":"string","pattern":`+hostname+`}`))
	flatPattern := compile(`{"type":"object","properties":{"a":{"type":"string","pattern":` + hostname + `}}}`)
	// longest is an argument {"a": "a.a.a…"} as long as the schema accepts.
	longest := func(s *inputSchema) json.RawMessage {
		n := min(int(maxCallApplications/max(s.perValue, 1)-4)*64, MaxArgumentBytes-16)
		return json.RawMessage(`{"a":"` + strings.Repeat("a.", n/2) + `a"}`)
	}
	for _, tt := range []struct {
		name   string
		schema *inputSchema
		args   json.RawMessage
	}{
		{"allOf chain", chain, largest(chain, 1)},
		{"JSON value", jsonValue, largest(jsonValue, 1)},
		{"JSON value, deep", jsonValue, largest(jsonValue, MaxArgumentDepth-2)},
		{"allOf chain to a pattern", chainPattern, longest(chainPattern)},
		{"pattern", flatPattern, longest(flatPattern)},
	} {
		args := tt.args
		got := measure(tt.schema, args)
		t.Logf("%s: %d per value, %d bytes in %v", tt.name, tt.schema.perValue, len(args), got)
		if got > 20*base {
			t.Errorf("%s: %v, over 20 times the baseline %v", tt.name, got, base)
		}
	}
}
