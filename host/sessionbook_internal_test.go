package host

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestEndedSessionRefusedUntilClosed: a session ended to make room is
// closed apart (the go-sdk's Close runs in a goroutine of its own), and a
// request of it arriving before that close must be refused, not served as
// an unbooked session's. CI saw it served (TestMaxSessions, under -race).
func TestEndedSessionRefusedUntilClosed(t *testing.T) {
	b := newSessionBook(&Options{MaxSessions: 1})
	a, c := &mcp.ServerSession{}, &mcp.ServerSession{}
	if _, _, err := b.openSession(a, "", "", 0); err != nil {
		t.Fatal(err)
	}
	victims, _, err := b.openSession(c, "", "", 0)
	if err != nil || len(victims) != 1 || victims[0] != a {
		t.Fatalf("second session: victims %p, err %v; want a (%p) ended", victims, err, a)
	}
	if _, _, ok := b.enter(context.Background(), a); ok {
		t.Errorf("a request of the ended session entered before its close")
	}
	if n := b.count(); n != 1 {
		t.Errorf("count = %d, want 1", n)
	}
	b.closed(a) // the go-sdk's close of it, done
	if n := b.count(); n != 1 {
		t.Errorf("count after the victim's close = %d, want 1 (counted once)", n)
	}
	if _, ok := b.entries.Load(a); ok {
		t.Errorf("the closed victim is still in the book")
	}
	b.closed(c)
	if n := b.count(); n != 0 {
		t.Errorf("count after both closed = %d, want 0", n)
	}
}
