package plugins

import "testing"

// A template matches its URIs, and one that does not parse matches
// nothing (host: resource updates and subscriptions rely on both).
func TestResourceTemplateMatches(t *testing.T) {
	p := &Plugin{}
	p.templates = []*ResourceTemplate{{URITemplate: "notes://item/{id}", plugin: p}, {URITemplate: "bad://{", plugin: p}}
	for uri, want := range map[string]bool{
		"notes://item/7":      true,
		"notes://item/7/more": false,
		"notes://other/7":     false,
		"bad://{":             false,
		"bad://x":             false,
	} {
		if got := p.MatchesTemplate(uri); got != want {
			t.Errorf("MatchesTemplate(%q) = %v, want %v", uri, got, want)
		}
	}
}
