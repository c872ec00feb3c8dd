package host

import (
	"net/http"
	"strings"
	"testing"
)

// TestOnlyA2026ListenIsLongLived: a request is taken for a 2026-07-28
// client's subscriptions/listen (a stream: out of the drain's count, its
// writes queued) only when it is one of that revision's: no session, its
// protocol 2026-07-28 or later. The go-sdk holds the Mcp-Method header to
// the body's method from that revision on; a 2025-11-25 session's POST
// naming subscriptions/listen in it was taken for a listen.
func TestOnlyA2026ListenIsLongLived(t *testing.T) {
	for _, c := range []struct {
		name           string
		session, proto string
		want           bool
	}{
		{"2026-07-28 listen", "", "2026-07-28", true},
		{"2025-11-25 session POST naming it", "s1.abc", "2025-11-25", false},
		{"a session with a 2026 protocol header", "s1.abc", "2026-07-28", false},
		{"no session, an older protocol", "", "2025-11-25", false},
	} {
		r, _ := http.NewRequest(http.MethodPost, "/mcp", strings.NewReader(`{}`))
		r.Header.Set("Mcp-Method", "subscriptions/listen")
		if c.session != "" {
			r.Header.Set("Mcp-Session-Id", c.session)
		}
		r.Header.Set("Mcp-Protocol-Version", c.proto)
		if got := longLived(r); got != c.want {
			t.Errorf("%s: longLived %v, want %v", c.name, got, c.want)
		}
	}
}
