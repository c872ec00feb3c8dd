package host_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A replica cut off from Redis alone, its link silent (nothing refused,
// nothing dropped), while Redis, reachable by the other replica, comes
// back empty: the cut-off replica cannot see the loss, and past its grace
// it hands the session's call over, as in
// TestCutOffReplicaSendsSessionsElsewhere; the other replica finds
// nothing of it in the store. The session's state is only in the cut-off
// replica's memory, which gets it back once its link does: the session
// must not be ended at the client (a 2025-11-25 session answered 404, a
// handle refused as unknown) while that can still happen, nor go on from
// an empty state unsaid.
func TestCutOffStoreBackEmptyLosesNoSession(t *testing.T) {
	for _, protocol := range protocols {
		t.Run("protocol="+cmpOr(protocol, "default"), func(t *testing.T) { cutOffStoreBackEmpty(t, protocol) })
	}
}

func cutOffStoreBackEmpty(t *testing.T, protocol string) {
	r := startCutRedis(t)
	a, b := r.serve(t, "a", redisStore(t, r.link.Addr())), r.serve(t, "b", redisStore(t, r.addr))
	logsOnFailure(t, a, b)
	// Both saw the store's epoch (the first round checks the state key).
	a.waitLog(t, "state key checked", 1)
	b.waitLog(t, "state key checked", 1)
	proxy := &failover{to: a, next: b}
	cs := connectHTTP(t, a.srv.URL, protocol, proxy)
	cs.ListTools(context.Background(), nil)
	first := call(t, cs, "note_add", map[string]any{"text": "one"})
	if first.IsError || first.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("a: %v %s", first.Meta, text(first))
	}
	args := map[string]any{}
	if handle, _ := first.Meta[host.MetaSession].(string); handle != "" {
		args[host.SessionArgument] = handle
	}
	r.cutBackEmpty(t)
	b.waitLog(t, "state store came back empty", 1)
	// a's first heartbeat round after the cut ends unanswered 2 s on,
	// past its grace (2 s from the claim verified before the first call),
	// as in TestCutOffReplicaSendsSessionsElsewhere: before it, a may
	// serve a contained call from memory (notSaved), as it should.
	a.waitLog(t, "state store heartbeat", 1)
	// Past a's grace, a refuses the call to the proxy, which sends it to
	// b. The client retries what it is told to retry.
	lost := func(res *mcp.CallToolResult, err error) bool {
		return sessionLost(err) || err == nil && res.IsError && strings.Contains(text(res), "was refused")
	}
	retryOn(t, "a refused nothing to the proxy 30 s into its cut", a.logged("state store heartbeat"), func() (bool, string) {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list", Arguments: args})
		if lost(res, err) {
			t.Fatalf("the session, a cut off and the store back empty (a refused %d to the proxy): ended at the client: %s", proxy.refusals(), outcome(res, err))
		}
		if err == nil && !res.IsError {
			t.Fatalf("the session served with a cut off past its grace and the store empty: %v %s", res.Meta, text(res))
		}
		return proxy.refusals() > 0, outcome(res, err)
	})
	// a's link comes back: a finds the new epoch, and the session goes
	// on from a's memory, or says its state was lost.
	r.link.SetMode(proxytest.RelayPass)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.h.WaitStore(ctx); err != nil {
		t.Fatal(err)
	}
	retryOn(t, "the session once a's link is back", a.logged("state store came back empty"), func() (bool, string) {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list", Arguments: args})
		if lost(res, err) {
			t.Fatalf("the session once a's link is back: ended at the client: %s", outcome(res, err))
		}
		if err != nil || res.IsError {
			return false, outcome(res, err)
		}
		if _, reset := res.Meta[host.MetaStateReset]; !reset && !strings.Contains(text(res), "one") {
			t.Fatalf("the session once a's link is back: %v %q; want one, or its loss said", res.Meta, text(res))
		}
		return true, ""
	})
}

// cutRedis is a Redis server at addr, and link, a relay to it through
// which a replica's link to it can go silent.
type cutRedis struct {
	addr string
	link *proxytest.Relay
}

func startCutRedis(t *testing.T) *cutRedis {
	t.Helper()
	addr := proxytest.FreeAddr(t)
	proxytest.StartRedisAt(t, addr)
	return &cutRedis{addr: addr, link: proxytest.StartRelay(t, addr)}
}

// serve starts a replica of the notes example named name on store.
func (r *cutRedis) serve(t *testing.T, name string, store statestore.Store) *replica {
	t.Helper()
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes")}
	return replicaWith(t, host.Options{Replica: name, Store: store}, sandbox.NewPolicy(), files)
}

// cutBackEmpty makes the link silent, and Redis come back empty behind
// it. FLUSHALL plays the restart: its data and epoch gone, and nothing
// reaches the connections through the link (a blackholed link would
// carry no close either).
func (r *cutRedis) cutBackEmpty(t *testing.T) {
	t.Helper()
	r.link.SetMode(proxytest.RelaySilent)
	rc := redis.NewClient(&redis.Options{Addr: r.addr})
	defer rc.Close()
	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

// redisStore is a Redis store at addr (host:port), database 0, under the
// replicas' state key, closed when the test ends.
func redisStore(t *testing.T, addr string) statestore.Store {
	t.Helper()
	s, err := statestore.Open("redis://"+addr+"/0", replicaKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Within a minute of the store coming back empty, a replica answers every
// stateful session the store does not hold "not now" (503), whoever names
// it: a session lost with the store, another user's session (its record
// found), an ID made up, so that the answer tells nothing of another's
// session. Before the loss each is unknown (404) alike. The replica reads
// the store's epoch itself on finding no session: its heartbeat, 2 s
// apart, may not have seen the loss yet.
func TestStoreLostLatelyAnswersAlike(t *testing.T) {
	rs, raw := redisReplicaSetWith(t, 0, nil)
	a, b := rs[0], rs[1]
	logsOnFailure(t, a, b)
	b.waitLog(t, "state key checked", 1)
	type named struct{ what, id, token string }
	check := func(when string, want int, cases ...named) {
		t.Helper()
		for _, c := range cases {
			if got := countStatus(t, b.srv.URL, c.id, c.token); got != want {
				t.Errorf("%s, %s at b: HTTP %d; want %d", when, c.what, got, want)
			}
		}
	}
	alice := connectHTTP(t, a.srv.URL, "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, alice, "")
	check("before the loss", http.StatusNotFound,
		named{"another user's session", alice.ID(), bobToken},
		named{"an ID made up", "a." + rand.Text(), bobToken})
	if err := raw.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	again := connectHTTP(t, a.srv.URL, "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, again, "")
	check("the store back empty", http.StatusServiceUnavailable,
		named{"a session lost with the store", alice.ID(), aliceToken},
		named{"another user's session", again.ID(), bobToken},
		named{"an ID made up", "a." + rand.Text(), bobToken})
}

// A replica started after the store came back empty never saw the
// earlier epoch, but a replica that did recorded the loss in the store:
// within a minute of that loss the late one answers what the store does
// not hold "not now" too (a 2025-11-25 session 503, whoever names it,
// and a handle -32053), so that a session whose replica is cut off from
// the store alone, and would write it back once its link returns
// (TestCutOffStoreBackEmptyLosesNoSession), is not ended at the client
// when the proxy's fallback is a replica restarted or added since. The
// minute is the store's record's: a replica started once it is past
// answers them unknown (404; the handle refused), as before.
func TestStoreLostBeforeReplicaStartedAnswersAlike(t *testing.T) {
	addr := proxytest.StartRedis(t)
	raw := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { raw.Close() })
	c := guardedReplica(t, "c", redisStore(t, addr), 0)
	c.waitLog(t, "state key checked", 1)
	alice := connectHTTP(t, c.srv.URL, "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, alice, "")
	handle, _ := countWith(t, connectHTTP(t, c.srv.URL, "", tenantTransport{token: aliceToken}), "").Meta[host.MetaSession].(string)
	if handle == "" {
		t.Fatal("no handle")
	}
	if err := raw.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	c.waitLog(t, "state store came back empty", 1) // c records the loss
	again := connectHTTP(t, c.srv.URL, "2025-11-25", tenantTransport{token: aliceToken})
	countWith(t, again, "")
	type named struct{ what, id, token string }
	cases := []named{
		{"a session lost with the store", alice.ID(), aliceToken},
		{"another user's session", again.ID(), bobToken},
		{"an ID made up", "a." + rand.Text(), bobToken},
	}
	check := func(r *replica, when string, held bool) {
		t.Helper()
		want := http.StatusNotFound
		if held {
			want = http.StatusServiceUnavailable
		}
		for _, c := range cases {
			if got := countStatus(t, r.srv.URL, c.id, c.token); got != want {
				t.Errorf("%s, %s at %s: HTTP %d; want %d", when, c.what, r.name, got, want)
			}
		}
		cs := connectHTTP(t, r.srv.URL, "", tenantTransport{token: aliceToken})
		cs.ListTools(context.Background(), nil) // the handle's header, from the tool's schema
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "count", Arguments: map[string]any{host.SessionArgument: handle}})
		var je *jsonrpc.Error
		switch {
		case held && (!errors.As(err, &je) || je.Code != host.CodeStateUnavailable):
			t.Errorf("%s, the handle lost with the store at %s: %s; want refused for now (%d)", when, r.name, outcome(res, err), host.CodeStateUnavailable)
		case !held && (err != nil || !strings.Contains(text(res), "was refused")):
			t.Errorf("%s, the handle lost with the store at %s: %s; want refused as unknown", when, r.name, outcome(res, err))
		}
	}
	b := guardedReplica(t, "b", redisStore(t, addr), 0)
	logsOnFailure(t, c, b)
	b.waitLog(t, "state key checked", 1)
	check(b, "started after the loss", true)
	// The loss recorded over a minute ago, by the store's clock: what is
	// left of its record's window (the session timeout) shortened.
	ttl, err := raw.PTTL(context.Background(), "wt:lost").Result()
	if err != nil || ttl < 3*time.Minute {
		t.Fatalf("the store's record of its loss: TTL %v, %v", ttl, err)
	}
	if err := raw.PExpire(context.Background(), "wt:lost", ttl-time.Minute-10*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	d := guardedReplica(t, "d", redisStore(t, addr), 0)
	logsOnFailure(t, d)
	d.waitLog(t, "state key checked", 1)
	check(d, "started a minute after the loss", false)
}
