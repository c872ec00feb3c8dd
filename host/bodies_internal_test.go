package host

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// TestBodyBudgetCommonPathAllocates: counting a small body of known
// length, a subject's, allocates nothing (every request with a body
// passes here), and gives its bytes back.
func TestBodyBudgetCommonPathAllocates(t *testing.T) {
	b := newBodyBudget(DefaultRequestBytes, DefaultRequestBytes/4, DefaultMaxRequestBody)
	served := 0
	h := b.wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ }))
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(strings.Repeat("x", 4<<10)))
	r = r.WithContext(context.WithValue(r.Context(), verifiedKey{}, &auth.TokenInfo{UserID: "bob"}))
	w := httptest.NewRecorder()
	if allocs := testing.AllocsPerRun(100, func() { h.ServeHTTP(w, r) }); allocs > 0 {
		t.Errorf("counting a 4 KiB body: %v allocations; want none", allocs)
	}
	if served == 0 || b.held.total != 0 || len(b.held.held) != 0 {
		t.Errorf("served %d, %d bytes held for %d tenants after; want served, nothing held", served, b.held.total, len(b.held.held))
	}
}
