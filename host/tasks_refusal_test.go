package host_test

import (
	"net/http"
	"testing"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A review of stop 64's cross-owner eviction (taskStore.add): a client
// refused for its OWN bound (MaxTasksPerClient), while the server also
// happens to be at MaxTasks, makes the server forget other clients'
// finished tasks, one per loop turn, until none is left, and is then
// refused anyway: evicting others cannot lift a per-client bound.
func TestPerClientRefusalDoesNotEvictOthers(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTasks: 3, MaxTasksPerClient: 1, ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	as := func(who string) http.Header { return http.Header{"X-Client": {who}} }
	quick := func() map[string]any {
		return map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 0, "label": "q"}}
	}
	ids := map[string]string{}
	for _, who := range []string{"bob", "carol"} {
		res, e := rpcWith(t, url, as(who), "tools/call", "slow_compute", quick(), withTasks)
		if e != nil || res["resultType"] != "task" {
			t.Fatalf("%s's task: %v %v", who, res, e)
		}
		ids[who], _ = res["taskId"].(string)
	}
	f.waitLog(t, "msg=\"task ended\"", 2)
	// alice: one long task (her per-client bound), the server now full.
	long := map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 30, "label": "l"}}
	if res, e := rpcWith(t, url, as("alice"), "tools/call", "slow_compute", long, withTasks); e != nil || res["resultType"] != "task" {
		t.Fatalf("alice's first task: %v %v", res, e)
	}
	// alice's second: refused for her own bound, rightly.
	if res, e := rpcWith(t, url, as("alice"), "tools/call", "slow_compute", quick(), withTasks); e == nil {
		t.Fatalf("alice's second task past MaxTasksPerClient 1: %v; want refused", res)
	}
	for who, id := range ids {
		if res, e := rpcWith(t, url, as(who), "tasks/get", "", map[string]any{"taskId": id}, withTasks); e != nil {
			t.Errorf("%s's finished task %s is gone after alice was refused for her own per-client bound: %v (result %v)", who, id, e, res)
		}
	}
}
