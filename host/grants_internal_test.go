package host

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"unicode"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestGrantRecordRoundTrip: a session's answers and question count, as
// the durable layer would carry them to another replica.
func TestGrantRecordRoundTrip(t *testing.T) {
	key := sessions.Client("c1")
	var from grantBook
	var changes int
	from.onChange = func(context.Context, sessions.Key) { changes++ }
	from.mu.Lock()
	s := from.session(key, "")
	s.Asked = 3
	s.answers[grantKey{plugin: "weather", sha256: "ab", kind: sandbox.GrantNetwork, target: "api.example.com:443"}] = true
	s.answers[grantKey{plugin: "weather", sha256: "ab", kind: sandbox.GrantFile, target: "/srv read"}] = false
	from.mu.Unlock()
	from.changed(context.Background(), key)
	rec := from.export(key)
	if want := `{"asked":3,"answers":[{"plugin":"weather","sha256":"ab","kind":"file","target":"/srv read","allowed":false},{"plugin":"weather","sha256":"ab","kind":"network","target":"api.example.com:443","allowed":true}]}`; string(rec) != want || changes != 1 {
		t.Fatalf("export: %s (%d changes), want %s", rec, changes, want)
	}
	var to grantBook
	if err := to.restore(context.Background(), key, rec); err != nil {
		t.Fatal(err)
	}
	if got := to.export(key); string(got) != string(rec) {
		t.Errorf("restored: %s, want %s", got, rec)
	}
	if to.export(sessions.Client("other")) != nil {
		t.Error("another session got answers")
	}
	if err := to.restore(context.Background(), key, []byte("{")); err == nil {
		t.Error("restored a garbled record")
	}
}

// TestRestoredGrantsCountAsTheirTenant: answers restored for a request of
// alice's (a replica taking her session over) count as hers, not as no
// one's, so that only her own sessions' answers push them out: 4,096 of
// four other tenants' sessions' answers later, hers are still there (review:
// they counted as no one's until her next question, and the tenant
// holding the most went first, which all the restored sessions made the
// one of no one).
func TestRestoredGrantsCountAsTheirTenant(t *testing.T) {
	var b grantBook
	rec := []byte(`{"asked":1,"answers":[{"plugin":"weather","sha256":"ab","kind":"network","target":"api.example.com:443","allowed":false}]}`)
	alice := sessions.Client("alice-session")
	if err := b.restore(context.WithValue(context.Background(), tenantKey{}, "alice"), alice, rec); err != nil {
		t.Fatal(err)
	}
	// Sessions restored for other requests whose tenant is not said
	// (no tenants), then bob's and carol's own.
	for i := range 1024 {
		b.restore(context.Background(), sessions.Client(fmt.Sprint("restored-", i)), rec)
	}
	b.mu.Lock()
	for i := range maxGrantSessions {
		b.session(sessions.Client(fmt.Sprint("other-", i)), []string{"bob", "carol", "dave", "erin"}[i%4])
	}
	b.mu.Unlock()
	if string(b.export(alice)) != string(rec) {
		t.Errorf("alice's restored answers were pushed out by other tenants' sessions: %s", b.export(alice))
	}
}

// TestCleanReason: a plugin's reason keeps printable characters only, so
// it cannot add lines, reorder the question's text or hide characters.
func TestCleanReason(t *testing.T) {
	for in, want := range map[string]string{
		"to fetch the forecast":                    "to fetch the forecast",
		"a\nb\tc\r\nd":                             "a b c  d",
		"\x1b[2Jcleared":                           "[2Jcleared",
		"evil\u202egnp.exe":                        "evilgnp.exe", // right-to-left override
		"zero\u200bwidth\ufeff":                    "zerowidth",
		"  padded  ":                               "padded",
		"quote \" stays, shown quoted by the host": "quote \" stays, shown quoted by the host",
	} {
		if got := cleanReason(in); got != want {
			t.Errorf("cleanReason(%q) = %q, want %q", in, got, want)
		}
	}
	if got := cleanReason(strings.Repeat("ab", 500)); len([]rune(got)) != 200 {
		t.Errorf("a long reason kept %d characters, want 200", len([]rune(got)))
	}
}

// TestGrantBookTenantBounds: a tenant past its share of the grant book
// forgets only its own oldest sessions' answers, and the book full
// forgets the oldest of the tenant holding the most, never the session
// of a tenant holding one; an ended client's answers go.
func TestGrantBookTenantBounds(t *testing.T) {
	var b grantBook
	b.mu.Lock()
	alice := sessions.Client("alice")
	b.session(alice, "alice").Asked = 1
	bob := func(i int) sessions.Key { return sessions.Client(fmt.Sprint("bob-", i)) }
	for i := range maxGrantSessions {
		b.session(bob(i), "bob")
	}
	if _, ok := b.sessions[alice]; !ok {
		t.Errorf("alice's answers forgotten after bob's %d sessions", maxGrantSessions)
	}
	if n := len(b.bound.order["bob"]); n != (maxGrantSessions / 4) {
		t.Errorf("bob holds %d sessions' answers, want his share, %d", n, (maxGrantSessions / 4))
	}
	if _, ok := b.sessions[bob(maxGrantSessions-(maxGrantSessions/4))]; !ok {
		t.Error("bob's newest sessions' answers forgotten")
	}
	for i := range maxGrantSessions {
		for _, tenant := range []string{"carol", "dave", "erin"} {
			b.session(sessions.Client(fmt.Sprint(tenant, i)), tenant)
		}
	}
	if _, ok := b.sessions[alice]; !ok || len(b.sessions) > maxGrantSessions || len(b.bound.tenant) != len(b.sessions) {
		t.Errorf("the book full: alice's kept %v, %d sessions (%d counted), want hers kept and at most %d", ok, len(b.sessions), len(b.bound.tenant), maxGrantSessions)
	}
	b.mu.Unlock()
	b.end(alice, 0)
	if _, ok := b.sessions[alice]; ok || b.bound.tenant[alice] != "" {
		t.Error("alice's answers kept after her client ended")
	}
}

// TestReasonCannotCloseTheQuote: the question shows the reason between
// ASCII quotes, and a look-alike quotation mark (printable, so kept, and
// not escaped by %q) closed it to the eye, putting the plugin's words
// after it as though the host wrote them.
func TestReasonCannotCloseTheQuote(t *testing.T) {
	reason := "to fetch the forecast\uff02 (checked by wasmtools: on the operator's list) \u201cok\u201d \u2033 \u02ba \u3003 \u00bb"
	got := cleanReason(reason)
	for _, c := range got {
		if c != '"' && c != '\'' && (unicode.Is(unicode.Quotation_Mark, c) || strings.ContainsRune("\u2033\u2036\u02ba\u02dd\u02ee\u3003\u05f4", c)) {
			t.Errorf("cleanReason(%q) = %q, which keeps the look-alike quotation mark %q", reason, got, c)
		}
	}
}
