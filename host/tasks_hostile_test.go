package host_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestTaskAnswersCounted: the answers tasks/update delivers to a task
// that waits for several inputs are held by the task until the last key
// is answered. They were not counted against the client's task bytes: a
// client answering one of multi_input's two questions with 1 MiB, in each
// of four tasks, held 4 MiB against a bound of 256 KiB (a red team, stop
// 64). Now an answer past the bound is refused (CodeBusy), and one within
// it counts.
func TestTaskAnswersCounted(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTaskBytesPerClient: 256 << 10}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	answer := func(id string, n int) error {
		_, err := taskCall(t, cs, "tasks/update", &taskParams{TaskID: id, InputResponses: map[string]any{
			"first": map[string]any{"action": "accept", "content": map[string]any{"name": strings.Repeat("x", n)}},
		}})
		return err
	}
	id := startTask(t, url, "multi_input", map[string]any{})
	waitStatus(t, f, cs, id, "input_required")
	if err := answer(id, 1<<20); err == nil || !strings.Contains(err.Error(), "too many tasks") {
		t.Fatalf("an answer of 1 MiB to a task of a client bound to 256 KiB: %v; want refused", err)
	}
	if got := waitStatus(t, f, cs, id, "input_required"); len(got.InputRequests) != 2 {
		t.Fatalf("after the refused answer: inputRequests %v, want both still asked", got.InputRequests)
	}
	// Answers within the bound are taken, and count: 200 KiB in one task
	// leaves no room for another's 100 KiB.
	if err := answer(id, 200<<10); err != nil {
		t.Fatal(err)
	}
	id2 := startTask(t, url, "multi_input", map[string]any{})
	waitStatus(t, f, cs, id2, "input_required")
	if err := answer(id2, 100<<10); err == nil {
		t.Error("answers of 300 KiB in all taken from a client bound to 256 KiB")
	}
}

// TestEndedSessionTasksFreed: a 2025-11-25 session's tasks are owned by
// the session ("session:<id>"), so once the session has ended (DELETE)
// no request can ever read, update or cancel them again. They still
// hold the server's task bound until their hour is up, and a finished
// task is forgotten only for a task of the same owner, which can never
// come: with MaxTasks 2, a session that ran two short tasks and ended
// left every other client refused (CodeBusy) for an hour (until stop 64:
// a red team).
func TestEndedSessionTasksFreed(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTasks: 2}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClientEra(t, url, "2025-11-25", true)
	for i := range 2 {
		body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"slow_compute","arguments":{"seconds":0,"label":"s"}}}`, 10+i)
		var id string
		for _, e := range readEvents(t, postInSession(t, url, cs.ID(), body)) {
			var msg struct {
				Result struct{ ResultType, TaskID string }
			}
			if json.Unmarshal([]byte(e.data), &msg) == nil && msg.Result.ResultType == "task" {
				id = msg.Result.TaskID
			}
		}
		if id == "" {
			t.Fatal("no task")
		}
		waitStatus(t, f, cs, id, "completed")
	}
	cs.Close() // DELETE: the session, and with it its tasks' owner, is gone
	f.waitLog(t, "session ended", 0)
	eventually(t, "the session to end", func() bool { return f.h.LiveInstances() == 0 })
	res, e := rpc(t, url, "tools/call", "slow_compute", map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 0}}, withTasks)
	if e != nil {
		t.Errorf("another client's task after the only tasks' session ended: refused %v; want a task (the ended session's finished tasks can never be read again)", e)
	} else if res["resultType"] != "task" {
		t.Errorf("result %v", res)
	}
}

// TestTaskIDInLogGivesNoHandle: SECURITY.md says handles "appear in logs
// and the record log only as a digest". An unauthenticated 2026-07-28
// client's task is guarded only by its ID, yet the host logs every task
// ID in full ("task created", "task ended", ...), and the completed task's
// result carries the client's session handle in _meta: whoever reads the
// log reads the result and takes over the client's instances of every
// plugin.
func TestTaskIDInLogGivesNoHandle(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	id := startTask(t, url, "slow_compute", map[string]any{"seconds": 0, "label": "secret"})
	waitStatus(t, f, cs, id, "completed")

	// A reader of the log, with nothing else, as another client.
	m := regexp.MustCompile(`msg="task created" task=(\S+)`).FindStringSubmatch(f.log.String())
	if m == nil {
		return // the ID is not logged
	}
	res, e := rpc(t, url, "tasks/get", m[1], map[string]any{"taskId": m[1]}, withTasks)
	if e != nil {
		return
	}
	r, _ := res["result"].(map[string]any)
	meta, _ := r["_meta"].(map[string]any)
	if h, _ := meta[host.MetaSession].(string); h != "" {
		t.Errorf("the log names task %s in full; tasks/get with it from another client returns the client's session handle %s (SECURITY.md: handles appear in logs only as a digest)", m[1], h)
	}
}

// TestServerTaskBoundFreesOthersFinished: past the server's task bound, a
// new client's task makes the client holding the most finished tasks give
// its oldest up; before (until stop 64), only the new client's own
// finished tasks could, and clients who left results unread held the
// server for their hour.
func TestServerTaskBoundFreesOthersFinished(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTasks: 2, ClientKeyHeader: "X-Client"}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	as := func(who string) http.Header { return http.Header{"X-Client": {who}} }
	args := map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 0, "label": "b"}}
	for range 2 {
		if res, e := rpcWith(t, url, as("bob"), "tools/call", "slow_compute", args, withTasks); e != nil || res["resultType"] != "task" {
			t.Fatalf("bob's task: %v %v", res, e)
		}
	}
	f.waitLog(t, "msg=\"task ended\"", 2)
	if res, e := rpcWith(t, url, as("alice"), "tools/call", "slow_compute", args, withTasks); e != nil || res["resultType"] != "task" {
		t.Errorf("alice's task while bob's two finished tasks held the server's bound: %v %v; want a task", res, e)
	}
}
