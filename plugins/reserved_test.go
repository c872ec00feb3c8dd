package plugins

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestCheckReserved(t *testing.T) {
	for _, tt := range []struct{ schema, want string }{
		{`{"type":"object","properties":{"text":{"type":"string"}}}`, ""},
		{`{"type":"object","properties":{"wasmtools_session":{"type":"string"}}}`, `property "wasmtools_session" is reserved`},
		{`{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}`, ""},
		{`{"type":"object","properties":{"s":{"type":"string","x-mcp-header":"wasmtools-session"}}}`, `x-mcp-header "wasmtools-session" is reserved`},
		{`{"type":"object","properties":{"o":{"type":"object","properties":{"s":{"type":"string","X-MCP-Header":"Wasmtools-Session"}}}}}`, "is reserved"},
		{`{"type":"object","properties":{"deep":{"$defs":{"wasmtools_session":{}}}}}`, ""},
	} {
		err := checkReserved(json.RawMessage(tt.schema))
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: err = %v; want %q", tt.schema, err, tt.want)
		}
	}
}
