package sandbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/sandbox"
)

// Until stop 64 (a red team; issue 30, "no look-alike or reordering characters reach the
// person"): plainHost accepts anything netip.ParseAddr does, and an IPv6
// literal may carry a zone of any text ("%25" in the URL). Under a
// wildcard ceiling (ask = ["*:443"]), the guest puts words and a
// right-to-left override into the target the person reads
// ("[fe80::1%api.example.com (verified)]:443").
func TestZoneSmugglesNoTextIntoQuestion(t *testing.T) {
	for _, raw := range []string{
		"https://[fe80::1%25\u202egro.elgoog]/",
		"https://[fe80::1%25api.example.com%20(verified%20by%20wasmtools)]/",
	} {
		inst := grantsInstance(t, sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{"*:443"}, AllowPrivate: true}))
		a := &recordingAsker{allow: map[string]bool{}}
		b, _ := json.Marshal(map[string]string{"url": raw})
		inst.Call(sandbox.WithAsker(context.Background(), a), "call", []byte(`{"params":{"name":"fetch","arguments":`+string(b)+`}}`), nil)
		if len(a.asked) != 0 {
			t.Errorf("%s: the person was asked for target %q: a zone's free text (and a right-to-left override) reaches the question", raw, a.asked[0].Target)
		}
	}
}

// A host name that is no DNS name (over 253 characters, or a label over
// 63) reaches nothing once approved, and under a wildcard ceiling it let
// the guest put a question of up to a megabyte before the person, the
// ceiling's domain at its far end: refused without asking.
func TestLongNameNotAsked(t *testing.T) {
	for name, host := range map[string]string{
		"254 characters":   strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 50) + ".example.com",
		"a 64-octet label": strings.Repeat("a", 64) + ".example.com",
		"200 000 octets":   strings.Repeat("login.bank.example.", 10000) + "example.com",
	} {
		inst := grantsInstance(t, sandbox.NewPolicy().WithNetwork(sandbox.Network{Ask: []string{"*.example.com:443"}}))
		a := &recordingAsker{allow: map[string]bool{}}
		b, _ := json.Marshal(map[string]string{"url": "https://" + host + "/"})
		inst.Call(sandbox.WithAsker(context.Background(), a), "call", []byte(`{"params":{"name":"fetch","arguments":`+string(b)+`}}`), nil)
		if len(a.asked) != 0 {
			t.Errorf("%s: the person was asked for a target of %d characters, which no DNS name has", name, len(a.asked[0].Target))
		}
	}
}
