package host

import (
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestVictimClosedDuringEvictionForgotten: a session ended to make room
// is taken out of entries and put back (refusing its requests until it is
// closed). A close of it running meanwhile (its own idle timeout, its
// client's DELETE) loads entries without the lock, finds nothing, and
// returns: the entry, and the go-sdk session it holds, then stay in the
// book for good. Racy by nature: many tries, most of which miss the window.
func TestVictimClosedDuringEvictionForgotten(t *testing.T) {
	leaks := 0
	for i := 0; i < 50000; i++ {
		b := newSessionBook(&Options{MaxSessions: 1})
		a, c := &mcp.ServerSession{}, &mcp.ServerSession{}
		if _, _, err := b.openSession(a, "", "", 0); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			b.closed(a)
		}()
		close(start)
		b.openSession(c, "", "", 0)
		wg.Wait()
		if _, ok := b.entries.Load(a); ok {
			leaks++
		}
	}
	if leaks > 0 {
		t.Errorf("%d of 50000: the victim stays in the book after its close", leaks)
	}
}
