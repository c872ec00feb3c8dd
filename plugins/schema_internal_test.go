package plugins

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestCompileSchemaRefs(t *testing.T) {
	tests := []struct{ name, schema, want string }{
		{"root self-reference", `{"type":"object","$ref":"#"}`, "leads back to itself"},
		{"through allOf", `{"type":"object","allOf":[{"$ref":"#/$defs/a"}],"$defs":{"a":{"anyOf":[{"$ref":"#"}]}}}`, "leads back to itself"},
		{"defs loop", `{"type":"object","$ref":"#/$defs/a","$defs":{"a":{"$ref":"#/$defs/b"},"b":{"not":{"$ref":"#/$defs/a"}}}}`, "leads back to itself"},
		{"remote", `{"type":"object","properties":{"x":{"$ref":"https://example.com/s.json"}}}`, "only local references"},
		{"dangling", `{"type":"object","properties":{"x":{"$ref":"#/$defs/nope"}}}`, "does not resolve"},
		{"dynamic", `{"type":"object","$dynamicRef":"#meta"}`, "not supported"},
		{"descending recursion is fine", `{"type":"object","properties":{"child":{"$ref":"#"}}}`, ""},
		{"defs are fine", `{"type":"object","properties":{"a":{"$ref":"#/$defs/s"}},"$defs":{"s":{"type":"string"}}}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := compileSchema(json.RawMessage(tt.schema))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v; want %q", err, tt.want)
			}
		})
	}
}
