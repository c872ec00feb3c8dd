package plugins

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/wasmtools/wasmtools/abi"
)

// checkReserved refuses an input schema that uses what the host adds to
// it: a top-level property named [abi.SessionArgument], or an x-mcp-header
// named [abi.SessionHeader] anywhere (SEP-2243 header names must be unique,
// case-insensitively; clients drop a tool that repeats one).
func checkReserved(schema json.RawMessage) error {
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if json.Unmarshal(schema, &s) == nil {
		if _, ok := s.Properties[abi.SessionArgument]; ok {
			return fmt.Errorf("property %q is reserved for the host's session handle", abi.SessionArgument)
		}
	}
	if !bytes.Contains(bytes.ToLower(schema), []byte(`"x-mcp-header"`)) {
		return nil
	}
	var walk func(v any) error
	walk = func(v any) error {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if name, ok := x.(string); ok && strings.EqualFold(k, "x-mcp-header") && strings.EqualFold(name, abi.SessionHeader) {
					return fmt.Errorf("x-mcp-header %q is reserved for the host's session handle", name)
				}
				if err := walk(x); err != nil {
					return err
				}
			}
		case []any:
			for _, x := range v {
				if err := walk(x); err != nil {
					return err
				}
			}
		}
		return nil
	}
	var v any
	json.Unmarshal(schema, &v)
	return walk(v)
}
