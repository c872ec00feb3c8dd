package telemetry

import (
	"strings"
	"testing"
)

// A review (stop 64): statusText said a URL is cut to "its scheme and host",
// but the host pattern ([^/\s"'?#]+) takes the userinfo with it, so a
// password or token in user:pass@ stays in the exported span status, with
// or without a path after the host.
func TestStatusTextDropsUserinfo(t *testing.T) {
	for _, in := range []string{
		`request to https://bob:s3cretpw@api.example.com/v1/x failed`,
		`request to https://ghp_TOKEN123@api.example.com failed`,
	} {
		if got := statusText(in); strings.Contains(got, "s3cretpw") || strings.Contains(got, "ghp_TOKEN123") {
			t.Errorf("statusText(%q) = %q: the URL's credentials are kept in the span status", in, got)
		}
	}
}
