package telemetry

import (
	"strings"
	"testing"
)

// A span's status keeps a URL's scheme and host only, and is bounded.
func TestStatusText(t *testing.T) {
	for in, want := range map[string]string{
		`Get "http://127.0.0.1:35389/v1/charges?api_key=sk_live_SECRET": EOF`: `Get "http://127.0.0.1:35389/…": EOF`,
		`request to https://api.example.com?token=x refused`:                  `request to https://api.example.com/… refused`,
		`dial tcp 127.0.0.1:80: connection refused`:                           `dial tcp 127.0.0.1:80: connection refused`,
		`see HTTPS://Example.com/a#frag and ftp://h/x`:                        `see HTTPS://Example.com/… and ftp://h/…`,
	} {
		if got := statusText(in); got != want {
			t.Errorf("statusText(%q) = %q, want %q", in, got, want)
		}
	}
	if got := statusText(strings.Repeat("é", 1000)); len(got) > maxStatus+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("a long status: %d bytes", len(got))
	}
}
