package host_test

import (
	"testing"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A double fault: Redis comes back empty while the replica that held a
// --client-header client's instances is killed too, so no copy of its
// state is left. The client's next call, at another replica, is told so
// (stateReset store-lost): that replica saw the store's earlier epoch,
// records the loss, and a client header the store has no record of, first
// seen within the session timeout of a loss, may be one whose state went
// with it. The old code started it afresh without a word: its count went
// from 3 back to 1.
func TestStoreBackEmptyHeaderClientToldReset(t *testing.T) {
	addr := proxytest.FreeAddr(t)
	redis := proxytest.StartRedisAt(t, addr)
	files := map[string]string{"counter.wasm": testplugins.Example(t, "counter")}
	serve := func(name string, store statestore.Store) *replica {
		return replicaWith(t, host.Options{Replica: name, Store: store, ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), files)
	}
	storeA := redisStore(t, addr)
	a, b := serve("a", storeA), serve("b", redisStore(t, addr))
	logsOnFailure(t, a, b)
	// b's heartbeat ran, with the store as it was (its first round
	// checks the state key).
	b.waitLog(t, "state key checked", 1)
	rt := &router{to: a}
	cs := connectHTTP(t, a.srv.URL, "2026-07-28", withHeader{rt: rt, name: "X-Client", value: "c1"})
	for i, want := range []string{"1", "2", "3"} {
		if res := call(t, cs, "count", nil); res.IsError || firstText(res) != want || res.Meta[host.MetaStateReset] != nil {
			t.Fatalf("count %d at a: %v %s", i+1, res.Meta, text(res))
		}
	}
	// a is killed (no drain, nothing written back: it reaches the store
	// no more), and Redis comes back empty.
	a.gone()
	storeA.Close()
	redis.Stop()
	proxytest.StartRedisAt(t, addr)
	rt.point(b)
	res := call(t, cs, "count", nil)
	reset, _ := res.Meta[host.MetaStateReset].(map[string]any)
	if res.IsError || firstText(res) != "1" || reset["reason"] != "store-lost" {
		t.Fatalf("the client's next call at b: meta %v, %s; want count 1 with stateReset store-lost", res.Meta, text(res))
	}
	// Said once: the call after it goes on from there.
	if res := call(t, cs, "count", nil); res.IsError || firstText(res) != "2" || res.Meta[host.MetaStateReset] != nil {
		t.Fatalf("the call after the reset: %v %s", res.Meta, text(res))
	}
}
