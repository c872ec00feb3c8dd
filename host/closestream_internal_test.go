package host

import (
	"context"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
)

// close_stream checks its input like every host function: its shape, and
// the reconnection delay a guest may ask a client for. Outside an HTTP
// session it does nothing.
func TestCloseStreamInput(t *testing.T) {
	for _, tt := range []struct {
		name, input, want string
	}{
		{"default delay", `{}`, ""},
		{"a delay", `{"retryAfterMs":100}`, ""},
		{"the longest", `{"retryAfterMs":60000}`, ""},
		{"too long", `{"retryAfterMs":60001}`, "retryAfterMs 60001 is outside 0 to 60000"},
		{"negative", `{"retryAfterMs":-1}`, "outside"},
		{"wrong type", `{"retryAfterMs":"soon"}`, "input is not the expected JSON"},
		{"not JSON", `retry`, "input is not the expected JSON"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := &callEnv{} // no request: a call over stdio or in-memory
			_, err := e.hostFunc(context.Background(), abi.FuncCloseStream, []byte(tt.input))
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("error %v; want none", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("error %v; want one saying %q", err, tt.want)
			}
		})
	}
}
