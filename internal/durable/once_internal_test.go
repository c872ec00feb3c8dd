package durable

import (
	"fmt"
	"strings"
	"testing"
)

// The results kept for at-most-once calls stay within their bounds:
// maxOnce per plugin, maxResends of them resends, maxOnceBytes in all; a
// result too large is kept as a refusal to run again.
func TestOnceBounds(t *testing.T) {
	c := newClaim("s.x")
	for i := range 20 {
		c.remember("p", &Once{Key: fmt.Sprint("k:", i), Result: []byte(`{}`)})
		c.remember("p", &Once{Key: fmt.Sprint("r:", i), Result: []byte(`{}`)})
	}
	got := c.done["p"]
	resends := 0
	for _, o := range got {
		if strings.HasPrefix(o.Key, "r:") {
			resends++
		}
	}
	if len(got) != maxOnce || resends != maxResends || got[len(got)-1].Key != "r:19" {
		t.Fatalf("kept %d results, %d resends, newest %q", len(got), resends, got[len(got)-1].Key)
	}
	c.remember("p", &Once{Key: "k:big", Result: []byte(`"` + strings.Repeat("x", maxOnceBytes) + `"`)})
	last := c.done["p"][len(c.done["p"])-1]
	if last.Key != "k:big" || len(last.Result) > maxOnceBytes || !strings.Contains(string(last.Result), "too large") {
		t.Fatalf("a result over the bound: %q %d bytes", last.Key, len(last.Result))
	}
}
