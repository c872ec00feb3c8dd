package host

import (
	"strconv"
	"strings"
	"testing"
)

// TestStandingResume: a priming event's ID says where its client was,
// and comes back as the go-sdk's ID of that event; each is new; an ID of
// the host's form it never gave is refused, and anything the host
// passes on is the go-sdk's standalone stream's "_k" (k >= 0), nothing,
// or not of the standing stream.
func TestStandingResume(t *testing.T) {
	seen := map[string]bool{}
	for _, sdk := range []string{"", "_0", "_7", "_2147483645"} {
		for range 3 {
			id := primeID(sdk)
			if seen[id] {
				t.Fatalf("primeID(%q) = %q twice", sdk, id)
			}
			seen[id] = true
			got, standing, ok := standingResume(id)
			if got != sdk || !standing || !ok {
				t.Errorf("standingResume(primeID(%q) = %q) = %q, %v, %v", sdk, id, got, standing, ok)
			}
		}
	}
	for _, eid := range []string{
		"~", "~_", "~_0", "~x_1", "~0123456789abcdef", "~0123456789abcdef_", "~0123456789abcdef_-1",
		"~0123456789abcdef_+1", "~0123456789abcdef_1_2", "~0123456789abcdef_01", "~0123456789abcdef_2147483648",
		"~0123456789abcdef_99999999999999999999", "~0123456789ABCDEF_1", "~0123456789abcdef0_1", "~~0123456789abcdef_1",
		"~0123456789abcdef_1 ", "~0123456789abcdef_" + strings.Repeat("9", 1000),
	} {
		if sdk, _, ok := standingResume(eid); ok {
			t.Errorf("standingResume(%.40q) = %q, accepted", eid, sdk)
		}
	}
	for _, eid := range []string{"_-1", "_x", "abc_1", "abc", "_1_2", "~0123456789abcdef_2147483647", "~0123456789abcdef_0"} {
		sdk, standing, ok := standingResume(eid)
		if !ok {
			t.Errorf("standingResume(%q) refused", eid)
			continue
		}
		if k, found := strings.CutPrefix(sdk, "_"); standing && sdk != "" && eid[0] == '~' {
			if n, err := strconv.Atoi(k); !found || err != nil || n < 0 {
				t.Errorf("standingResume(%q) = %q: not a go-sdk index", eid, sdk)
			}
		}
	}
}
