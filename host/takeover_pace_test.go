package host_test

import (
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// countedReads is a store that counts its reads of stateful sessions'
// records (a takeover's read).
type countedReads struct {
	statestore.Store
	reads atomic.Int64
}

func (c *countedReads) Get(ctx context.Context, id string) (map[string][]byte, error) {
	if strings.HasPrefix(id, "s.") {
		c.reads.Add(1)
	}
	return c.Store.Get(ctx, id)
}

// TestUnknownSessionIDsPaced: a request naming a stateful session ID that
// the replica does not hold makes it read the state store, to take the
// session over; a red team found those reads unpaced, so that one tenant
// sending made-up IDs in a loop made each of its requests a round trip
// to the store every replica and tenant shares. Bob's 1,000 made-up IDs
// at b (two replicas sharing a redis-server) make at most his bucket's
// reads (128, and 64 a second), the rest answered 503 (retry) rather than
// 404, which would end a real session of his at its client (his own, moved
// to b then, is not); alice's session moved from a to b is taken over all
// the same.
func TestUnknownSessionIDsPaced(t *testing.T) {
	rs, counted := redisReplicaSetAtB(t, func(s statestore.Store) *countedReads { return &countedReads{Store: s} })
	logsOnFailure(t, rs[0], rs[1])
	rt := &router{to: rs[0], token: aliceToken}
	alice := connectHTTP(t, rs[0].srv.URL, "2025-11-25", rt)
	countWith(t, alice, "")
	bob := connectHTTP(t, rs[0].srv.URL, "2025-11-25", &router{to: rs[0], token: bobToken})
	countWith(t, bob, "")

	post := func(id string) int { return countStatus(t, rs[1].srv.URL, id, bobToken) }
	// Sent from eight goroutines, so that the pace shows within the run
	// however loaded the machine: the reads are bounded by the bucket
	// and the time taken, whatever that is.
	const made = 1000
	var mu sync.Mutex
	codes := map[int]int{}
	begun := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range made / 8 {
				code := post("a." + rand.Text())
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	reads := counted.reads.Load()
	// The bucket's 128, 64 a second since, and one for a second begun.
	bound := 128 + 64*int64(time.Since(begun).Seconds()+1)
	t.Logf("bob's %d made-up session IDs at b: %d store reads (bound %d), answers %v", made, reads, bound, codes)
	if reads > bound {
		t.Errorf("bob's %d made-up session IDs made b read the store %d times; want at most %d", made, reads, bound)
	}
	if codes[http.StatusNotFound]+codes[http.StatusServiceUnavailable] != made || codes[http.StatusNotFound] > int(bound) {
		t.Errorf("bob's answers %v; want 404 for those read (at most %d), 503 for the rest", codes, bound)
	}
	// An operator sees the pace at work.
	if paced := codes[http.StatusServiceUnavailable]; paced > 0 {
		if n := seriesValue(t, scrape(rs[1]), `wasmtools_refusals_total{reason="takeovers_paced",tenant="subject"}`); n != float64(paced) {
			t.Errorf("wasmtools_refusals_total of paced takeovers at b: %v; want bob's %d 503s", n, paced)
		}
	}

	// A GET paced (a session's standing stream, reopened at a failover)
	// is not refused: the go-sdk client takes a 503 there for its
	// session's end. It gets an event stream that only asks it to come
	// back later, and its priming event (standing.go: the client's resume
	// point, here none), no message. Bob's made-up IDs
	// spend what his bucket refilled meanwhile (each read answered 404),
	// so this ends within his bucket's reads.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, rs[1].srv.URL+"/mcp", nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", "a."+rand.Text())
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
		req.Header.Set("Authorization", "Bearer "+bobToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("bob's GETs of made-up IDs at b were never paced: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusNotFound {
			continue
		}
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "text/event-stream" || !strings.Contains(string(b), "\nretry: ") || !strings.Contains(string(b), "\nid: ~") || strings.Contains(string(b), "data: {") {
			t.Errorf("a GET paced at b: %d %s %q; want 200, an event stream with only a retry: field and a priming event", res.StatusCode, res.Header.Get("Content-Type"), b)
		}
		break
	}

	// Bob's real session, moved to b now, is not ended by his made-up
	// IDs: refused for a retry while his bucket is empty (or taken over,
	// a token back already), never 404.
	if code := post(bob.ID()); code == http.StatusNotFound {
		t.Errorf("bob's real session at b after his made-up IDs: 404; want 503 (or taken over)")
	}

	rt.point(rs[1])
	before := counted.reads.Load()
	if res := countWith(t, alice, ""); text(res) != "2" {
		t.Fatalf("alice's session taken over at b after bob's made-up IDs: %v %s; want her count, 2", res.Meta, text(res))
	}
	if n := counted.reads.Load() - before; n < 1 {
		t.Errorf("alice's session taken over at b with %d reads of the store", n)
	}
}

// countStatus posts a call of count in stateful session id (2025-11-25)
// to the replica at base, as the holder of token, and returns the HTTP
// status.
func countStatus(t *testing.T, base, id, token string) int {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"count","arguments":{}}}`
	req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	res.Body.Close()
	return res.StatusCode
}
