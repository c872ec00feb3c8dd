package host_test

import (
	"context"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestStandingStreamOutlivesStoreAway: a 2025-11-25 session whose
// replica is gone, while the state store does not answer the replica it
// moves to. The go-sdk client reopens its standing GET stream there at
// once; b cannot take the session over for the moment, and answered the
// GET 503, which the client (v1.8.0) takes for the session's end, unlike
// a POST's: it failed the whole connection, and the session was lost at
// the client although the store held it. An empty event stream that
// only says when to come back (retry:) keeps the client reconnecting:
// b refuses its stream twice (the client outlived the first), and once
// the store answers b again the client's next call is served with the
// session's state.
func TestStandingStreamOutlivesStoreAway(t *testing.T) {
	rs, atB := redisReplicaSetAtB(t, func(s statestore.Store) *cutStore { return &cutStore{Store: s} })
	a, b := rs[0], rs[1]
	logsOnFailure(t, a, b)
	rt := &router{to: a, token: aliceToken}
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	if got := text(countWith(t, cs, "")); got != "1" {
		t.Fatalf("count at a: %s", got)
	}
	ended := make(chan error, 1)
	go func() { ended <- cs.Wait() }()

	// Redis refuses b (down, as far as b can tell); a is gone, and the
	// proxy sends the session to b.
	atB.refuse.Store(true)
	atB.cut.Store(true)
	a.gone()
	rt.point(b)

	const refused = `session not taken over: the state store does not answer" method=GET`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.logged(refused)()(ctx); err != nil {
		t.Fatalf("the client's standing stream was not reopened at b: %v", err)
	}
	// The next refusal is a stream reopened after the first: the client
	// is still there.
	again := b.logged(refused)()
	got := make(chan error, 1)
	go func() { got <- again(ctx) }()
	select {
	case err := <-ended:
		t.Fatalf("the client's session ended at b's refusal of its standing stream, the store away: %v", err)
	case err := <-got:
		if err != nil {
			select {
			case err := <-ended:
				t.Fatalf("the client's session ended at b's refusal of its standing stream, the store away: %v", err)
			default:
			}
			t.Fatalf("the client did not reopen its standing stream after b's first refusal: %v", err)
		}
	}

	back := storeBackAt(b, atB)()
	atB.cut.Store(false)
	atB.refuse.Store(false)
	if err := back(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "count", Arguments: map[string]any{}})
	if err != nil || res.IsError || text(res) != "2" {
		t.Fatalf("the session's call at b once the store answers: %s; want its count, 2", outcome(res, err))
	}
	select {
	case err := <-ended:
		t.Fatalf("the client's session ended: %v", err)
	default:
	}
}
