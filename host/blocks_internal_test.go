package host

import (
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestCapResultBlocks: a result of more content blocks than
// MaxResultBlocks (1,924 empty ones passed the 50,000-character cap) keeps
// MaxResultBlocks of them and a note, with or without a character limit.
func TestCapResultBlocks(t *testing.T) {
	for _, limit := range []int{DefaultMaxResultRunes, -1} {
		res := &mcp.CallToolResult{}
		for range 1924 {
			res.Content = append(res.Content, &mcp.TextContent{})
		}
		capResult(res, limit)
		if n := len(res.Content); n != MaxResultBlocks+1 {
			t.Fatalf("limit %d: %d blocks, want %d and a note", limit, n, MaxResultBlocks)
		}
		note := res.Content[MaxResultBlocks].(*mcp.TextContent).Text
		if !strings.Contains(note, "more than 1000 content blocks: 924 dropped") {
			t.Errorf("limit %d: note %q", limit, note)
		}
	}
	small := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}, &mcp.TextContent{Text: "b"}}}
	capResult(small, DefaultMaxResultRunes)
	if len(small.Content) != 2 {
		t.Errorf("a small result was changed: %v", small.Content)
	}
}
