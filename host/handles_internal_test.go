package host

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestWithoutHandle: the guest never gets the handle a request carries in
// _meta (a capability over the client's instances of every plugin), and
// the request's own _meta is not changed.
func TestWithoutHandle(t *testing.T) {
	in := mcp.Meta{MetaSession: "wt1.-.x.-.y", "progressToken": "p"}
	out := withoutHandle(in)
	if _, ok := out[MetaSession]; ok || out["progressToken"] != "p" {
		t.Errorf("withoutHandle = %v", out)
	}
	if _, ok := in[MetaSession]; !ok {
		t.Error("withoutHandle changed the request's _meta")
	}
	if _, _, err := metaHandle(mcp.Meta{MetaSession: 7}); err == nil {
		t.Error("a handle that is not a string was accepted")
	}
}

// TestSplitEscapedName: an argument name written with escapes is the
// same argument, and is split off too.
func TestSplitEscapedName(t *testing.T) {
	rest, h, err := splitSessionArgument(json.RawMessage(`{"x":1,"wasmtools\u005fsession":"wt1.a"}`))
	if err != nil || h != "wt1.a" || string(rest) != `{"x":1}` {
		t.Errorf("split = %s, %q, %v", rest, h, err)
	}
}

// TestSharedTokenIsNoSubject: a subject's token that is also the shared
// token identifies no one.
func TestSharedTokenIsNoSubject(t *testing.T) {
	var got *auth.TokenInfo
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = auth.TokenInfoFromContext(r.Context()) })
	h := RequireTokens("same-token-0123456789", map[string]string{"alice": "same-token-0123456789", "bob": "bob-token-0123456789"}, next)
	for token, want := range map[string]string{"same-token-0123456789": "", "bob-token-0123456789": "bob"} {
		r := httptest.NewRequest("POST", "/mcp", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		got = nil
		h.ServeHTTP(httptest.NewRecorder(), r)
		if got == nil || got.UserID != want {
			t.Errorf("token %s: %+v; want subject %q", token, got, want)
		}
	}
}
