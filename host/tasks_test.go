package host_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

var withTasks = map[string]any{"elicitation": map[string]any{}, "extensions": map[string]any{host.TasksExtension: map[string]any{}}}

// rpc sends one 2026-07-28 request over HTTP as the conformance suite
// does (the go-sdk client has no CreateTaskResult: it would decode a task
// handle as an empty tool result), and returns its result or error.
func rpc(t *testing.T, url, method, name string, params map[string]any, caps map[string]any) (result map[string]any, rpcErr map[string]any) {
	t.Helper()
	return rpcWith(t, url, nil, method, name, params, caps)
}

// rpcWith is rpc with headers (a bearer token, a client header).
func rpcWith(t *testing.T, url string, header http.Header, method, name string, params map[string]any, caps map[string]any) (result map[string]any, rpcErr map[string]any) {
	t.Helper()
	params["_meta"] = map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": caps}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, url+"/mcp", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name != "" {
		req.Header.Set("Mcp-Name", name)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if d, ok := strings.CutPrefix(line, "data: "); ok {
			raw = []byte(d)
		}
	}
	var msg struct {
		Result map[string]any `json:"result"`
		Error  map[string]any `json:"error"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil {
		t.Fatalf("%s: %s: %v", method, raw, err)
	}
	return msg.Result, msg.Error
}

// taskParams and taskResult are the tasks methods' shapes, for the go-sdk
// client's custom methods.
type taskParams struct {
	mcp.ParamsBase
	TaskID         string         `json:"taskId"`
	InputResponses map[string]any `json:"inputResponses,omitempty"`
}

type taskResult struct {
	mcp.ResultBase
	ResultType    string         `json:"resultType"`
	TaskID        string         `json:"taskId"`
	Status        string         `json:"status"`
	InputRequests map[string]any `json:"inputRequests"`
	Result        *struct {
		Content []map[string]any `json:"content"`
		IsError bool             `json:"isError"`
	} `json:"result"`
	Error *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// tasksClient connects the go-sdk client over HTTP in the 2026-07-28 era,
// declaring the extension, with the tasks methods registered.
func tasksClient(t *testing.T, url string, declare bool) *mcp.ClientSession {
	t.Helper()
	return tasksClientEra(t, url, "2026-07-28", declare)
}

// tasksClientEra is tasksClient negotiating protocol.
func tasksClientEra(t *testing.T, url, protocol string, declare bool) *mcp.ClientSession {
	t.Helper()
	caps := &mcp.ClientCapabilities{}
	if declare {
		caps.AddExtension(host.TasksExtension, nil)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{Capabilities: caps})
	for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
		if err := mcp.AddSendingCustomMethod[*taskParams, *taskResult](c, m); err != nil {
			t.Fatal(err)
		}
	}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, &mcp.ClientSessionOptions{ProtocolVersion: protocol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func taskCall(t *testing.T, cs *mcp.ClientSession, method string, p *taskParams) (*taskResult, error) {
	t.Helper()
	return mcp.CallCustomMethod[*taskParams, *taskResult](context.Background(), cs, method, p)
}

// startTask calls tool with the extension declared and returns its task.
func startTask(t *testing.T, url, tool string, args map[string]any) string {
	t.Helper()
	res, e := rpc(t, url, "tools/call", tool, map[string]any{"name": tool, "arguments": args}, withTasks)
	if e != nil || res["resultType"] != "task" || res["taskId"] == "" || res["status"] != "working" {
		t.Fatalf("%s: result %v error %v; want a working task", tool, res, e)
	}
	for _, k := range []string{"createdAt", "lastUpdatedAt", "ttlMs", "pollIntervalMs"} {
		if res[k] == nil {
			t.Errorf("%s: task handle without %s: %v", tool, k, res)
		}
	}
	return res["taskId"].(string)
}

// waitStatus gets the task's status until it is want, and returns it: it
// asks again at each line the host logs (a task's status changes are
// logged after they are made), for at most a minute, as a guest's call
// takes seconds on a loaded machine.
func waitStatus(t *testing.T, f *fixture, cs *mcp.ClientSession, id, want string) *taskResult {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		next := f.log.next()
		got, err := taskCall(t, cs, "tasks/get", &taskParams{TaskID: id})
		if err != nil {
			t.Fatalf("tasks/get: %v", err)
		}
		if got.Status == want {
			return got
		}
		select {
		case <-next:
		case <-timeout:
			t.Fatalf("task %s is %s after a minute; want %s", id, got.Status, want)
		}
	}
}

func rpcCode(err error) int64 {
	var je *jsonrpc.Error
	if asJSONRPC(err, &je) {
		return je.Code
	}
	return 0
}

func asJSONRPC(err error, je **jsonrpc.Error) bool { return errors.As(err, je) }

// A call of a task-supporting tool from a client that declared the
// extension is a task: tasks/get finds it at once, it completes with the
// call's result, waits in input_required for a guest's question until
// tasks/update answers it, and tasks/cancel stops its guest. A client
// without the extension gets plain calls, and the tasks methods and a
// tool that requires tasks refused with -32021. Over HTTP, 2026-07-28.
func TestTasks(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)

	t.Run("completes", func(t *testing.T) {
		id := startTask(t, url, "slow_compute", map[string]any{"seconds": 0.05, "label": "done"})
		if got, err := taskCall(t, cs, "tasks/get", &taskParams{TaskID: id}); err != nil || got.TaskID != id || got.ResultType != "complete" {
			t.Fatalf("tasks/get at once: %+v %v", got, err)
		}
		got := waitStatus(t, f, cs, id, "completed")
		if got.Result == nil || got.Result.IsError || len(got.Result.Content) == 0 || !strings.Contains(got.Result.Content[0]["text"].(string), `computed "done"`) {
			t.Errorf("completed task: %+v", got.Result)
		}
	})
	t.Run("tool error", func(t *testing.T) {
		got := waitStatus(t, f, cs, startTask(t, url, "failing_job", map[string]any{}), "completed")
		if got.Result == nil || !got.Result.IsError {
			t.Errorf("failing_job: %+v; want completed with an isError result", got.Result)
		}
	})
	t.Run("task after input", func(t *testing.T) {
		// The first round asks as a plain call; the retry that answers
		// becomes the task.
		args := map[string]any{"name": "test_tool_with_task", "arguments": map[string]any{}}
		res, e := rpc(t, url, "tools/call", "test_tool_with_task", args, withTasks)
		if e != nil || res["resultType"] != "input_required" || res["taskId"] != nil {
			t.Fatalf("first round: %v %v; want input_required, no task", res, e)
		}
		args["requestState"] = res["requestState"]
		args["inputResponses"] = map[string]any{"user_name": map[string]any{"action": "accept", "content": map[string]any{"name": "Ada"}}}
		res, e = rpc(t, url, "tools/call", "test_tool_with_task", args, withTasks)
		id, _ := res["taskId"].(string)
		if e != nil || res["resultType"] != "task" || id == "" {
			t.Fatalf("the answering retry: %v %v; want a task", res, e)
		}
		got := waitStatus(t, f, cs, id, "completed")
		if got.Result == nil || got.Result.Content[0]["text"] != "Hello, Ada, from a task!" {
			t.Errorf("test_tool_with_task: %+v", got.Result)
		}
	})
	t.Run("guest crash", func(t *testing.T) {
		// A guest that produced no result (here it panicked): the task
		// failed, with a JSON-RPC error and no result.
		got := waitStatus(t, f, cs, startTask(t, url, "protocol_error_job", map[string]any{}), "failed")
		if got.Error == nil || got.Error.Code != -32603 || got.Result != nil {
			t.Errorf("protocol_error_job: error %+v, result %+v; want failed with -32603 and no result", got.Error, got.Result)
		}
	})
	t.Run("two questions at once", func(t *testing.T) {
		// Answered one at a time: the task stays input_required until
		// both are.
		id := startTask(t, url, "multi_input", map[string]any{})
		got := waitStatus(t, f, cs, id, "input_required")
		if len(got.InputRequests) != 2 {
			t.Fatalf("multi_input: input requests %v, want first and second", got.InputRequests)
		}
		answer := map[string]any{"action": "accept", "content": map[string]any{"name": "one"}}
		if _, err := taskCall(t, cs, "tasks/update", &taskParams{TaskID: id, InputResponses: map[string]any{"first": answer}}); err != nil {
			t.Fatal(err)
		}
		got, _ = taskCall(t, cs, "tasks/get", &taskParams{TaskID: id})
		if got.Status != "input_required" || len(got.InputRequests) != 1 || got.InputRequests["second"] == nil {
			t.Fatalf("after one answer: %s %v; want input_required for second only", got.Status, got.InputRequests)
		}
		answer["content"] = map[string]any{"name": "two"}
		if _, err := taskCall(t, cs, "tasks/update", &taskParams{TaskID: id, InputResponses: map[string]any{"second": answer}}); err != nil {
			t.Fatal(err)
		}
		got = waitStatus(t, f, cs, id, "completed")
		if got.Result == nil || got.Result.Content[0]["text"] != "answers: first=one, second=two" {
			t.Errorf("multi_input: %+v", got.Result)
		}
	})
	t.Run("input required", func(t *testing.T) {
		id := startTask(t, url, "confirm_delete", map[string]any{"filename": "a.txt"})
		got := waitStatus(t, f, cs, id, "input_required")
		q, _ := got.InputRequests["confirm"].(map[string]any)
		if q["method"] != "elicitation/create" {
			t.Fatalf("inputRequests = %v; want confirm, an elicitation", got.InputRequests)
		}
		ack, err := taskCall(t, cs, "tasks/update", &taskParams{TaskID: id, InputResponses: map[string]any{
			"unasked": map[string]any{"ignored": true},
			"confirm": map[string]any{"action": "accept", "content": map[string]any{"confirm": true}},
		}})
		if err != nil || ack.ResultType != "complete" || ack.TaskID != "" {
			t.Fatalf("tasks/update: %+v %v; want an empty ack", ack, err)
		}
		got = waitStatus(t, f, cs, id, "completed")
		if got.Result == nil || got.Result.Content[0]["text"] != "deleted a.txt" {
			t.Errorf("after the answer: %+v", got.Result)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		live := f.h.LiveInstances()
		id := startTask(t, url, "slow_compute", map[string]any{"seconds": 600, "label": "long"})
		eventually(t, "the task's guest to run", func() bool { return f.h.LiveInstances() > live })
		ack, err := taskCall(t, cs, "tasks/cancel", &taskParams{TaskID: id})
		if err != nil || ack.ResultType != "complete" || ack.Status != "" {
			t.Fatalf("tasks/cancel: %+v %v", ack, err)
		}
		waitStatus(t, f, cs, id, "cancelled")
		// The guest was stopped and its instance reset, not left
		// spinning; or the cancel came before the guest ran, and nothing
		// ran (the instance, untouched, stays the session's).
		eventually(t, "the cancelled guest to stop", func() bool { return f.h.LiveInstances() == live || f.h.BusyInstances() == 0 })
		if ack, err := taskCall(t, cs, "tasks/cancel", &taskParams{TaskID: id}); err != nil || ack.ResultType != "complete" {
			t.Errorf("cancelling a cancelled task: %+v %v; want the same ack", ack, err)
		}
	})
	t.Run("cancel while waiting for input", func(t *testing.T) {
		id := startTask(t, url, "confirm_delete", map[string]any{"filename": "b.txt"})
		waitStatus(t, f, cs, id, "input_required")
		if _, err := taskCall(t, cs, "tasks/cancel", &taskParams{TaskID: id}); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, f, cs, id, "cancelled")
		// The parked call is taken out and its guest stopped (whether its
		// instance is reset then depends on whether the guest ran code
		// after its question was cancelled).
		eventually(t, "the parked call to stop", func() bool {
			return strings.Contains(f.log.String(), `msg="task's parked call stopped" task=`+taskLabel(id))
		})
	})
	t.Run("unknown task", func(t *testing.T) {
		_, err := taskCall(t, cs, "tasks/get", &taskParams{TaskID: "t1.nope"})
		if rpcCode(err) != jsonrpc.CodeInvalidParams {
			t.Errorf("unknown task: %v; want -32602", err)
		}
	})
	t.Run("without the extension", func(t *testing.T) {
		plain := tasksClient(t, url, false)
		res := call(t, plain, "slow_compute", map[string]any{"seconds": 0, "label": "sync"})
		if !strings.Contains(firstText(res), `computed "sync"`) {
			t.Errorf("slow_compute without the extension: %q; want a plain result", firstText(res))
		}
		_, err := plain.CallTool(context.Background(), &mcp.CallToolParams{Name: "failing_job", Arguments: map[string]any{}})
		var je *jsonrpc.Error
		if !asJSONRPC(err, &je) || je.Code != mcp.CodeMissingRequiredClientCapabilities || !strings.Contains(string(je.Data), host.TasksExtension) {
			t.Errorf("failing_job without the extension: %v; want -32021 naming the extension", err)
		}
		for _, m := range []string{"tasks/get", "tasks/update", "tasks/cancel"} {
			if _, err := taskCall(t, plain, m, &taskParams{TaskID: "x"}); rpcCode(err) != mcp.CodeMissingRequiredClientCapabilities {
				t.Errorf("%s without the extension: %v; want -32021", m, err)
			}
		}
	})
	t.Run("routing header", func(t *testing.T) {
		id := startTask(t, url, "slow_compute", map[string]any{"seconds": 0})
		if _, e := rpc(t, url, "tasks/get", "another-task", map[string]any{"taskId": id}, withTasks); e == nil || e["code"] != float64(mcp.CodeHeaderMismatch) {
			t.Errorf("tasks/get with a mismatched Mcp-Name: %v; want -32020", e)
		}
	})
}

// A 2025-11-25 session that declared the extension when it connected gets
// tasks too, its own: another client cannot see them. The task is created
// by hand (the go-sdk client has no task handle), on the session.
func TestTasksInASession(t *testing.T) {
	f := newFixture(t, nil, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClientEra(t, url, "2025-11-25", true)
	if cs.ID() == "" {
		t.Fatal("no session")
	}
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow_compute","arguments":{"seconds":0.05,"label":"session"}}}`
	var id string
	for _, e := range readEvents(t, postInSession(t, url, cs.ID(), body)) {
		var msg struct {
			Result struct {
				ResultType, TaskID string
			}
		}
		if json.Unmarshal([]byte(e.data), &msg) == nil && msg.Result.ResultType == "task" {
			id = msg.Result.TaskID
		}
	}
	if id == "" {
		t.Fatal("a session that declared the extension got no task")
	}
	got := waitStatus(t, f, cs, id, "completed")
	if got.Result == nil || !strings.Contains(got.Result.Content[0]["text"].(string), `computed "session"`) {
		t.Errorf("the session's task: %+v", got.Result)
	}
	other := tasksClientEra(t, url, "2025-11-25", true)
	if _, err := taskCall(t, other, "tasks/get", &taskParams{TaskID: id}); rpcCode(err) != jsonrpc.CodeInvalidParams {
		t.Errorf("another session's tasks/get: %v; want -32602, as for an unknown task", err)
	}
}

// Tasks are bounded per client in number (the oldest finished one is
// forgotten first) and in age, and one from before a restart is refused
// as such.
//
// The TTL must outlast the four requests before the expiry is awaited, on
// a loaded machine (CI's -race run).
func TestTaskBounds(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	f := newFixture(t, &host.Options{MaxTasksPerClient: 2, TaskTTL: 8 * time.Second, StateKey: key}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	a := startTask(t, url, "slow_compute", map[string]any{"seconds": 600})
	startTask(t, url, "slow_compute", map[string]any{"seconds": 600})
	if res, e := rpc(t, url, "tools/call", "slow_compute", map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 600}}, withTasks); e == nil || e["code"] != float64(host.CodeBusy) {
		t.Fatalf("a third task of a client with two running: %v %v; want CodeBusy", res, e)
	}
	if _, err := taskCall(t, cs, "tasks/cancel", &taskParams{TaskID: a}); err != nil {
		t.Fatal(err)
	}
	c := startTask(t, url, "slow_compute", map[string]any{"seconds": 600}) // a, finished, makes room
	if _, err := taskCall(t, cs, "tasks/get", &taskParams{TaskID: a}); rpcCode(err) != jsonrpc.CodeInvalidParams {
		t.Errorf("the finished task forgotten for room: %v", err)
	}
	// At their TTL the running tasks are cancelled, their guests stopped,
	// and forgotten.
	eventually(t, "the tasks to expire", func() bool {
		_, err := taskCall(t, cs, "tasks/get", &taskParams{TaskID: c})
		return err != nil
	})
	eventually(t, "the expired tasks' guests to stop", func() bool { return f.h.LiveInstances() == 0 })

	// Another process with the same state key: the ID is this server's,
	// from before its restart.
	g := newFixture(t, &host.Options{StateKey: key}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	restarted := tasksClient(t, serveHTTP(t, g), true)
	_, err := taskCall(t, restarted, "tasks/get", &taskParams{TaskID: c})
	if rpcCode(err) != jsonrpc.CodeInvalidParams || !strings.Contains(err.Error(), "restarted") {
		t.Errorf("a task from before a restart: %v; want -32602 saying so", err)
	}
}

// The arguments running tasks hold are bounded per client: five calls of
// 60 KiB each, parked for input, are more than its 256 KiB.
func TestTaskBytes(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTaskBytesPerClient: 256 << 10}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	big := strings.Repeat("x", 60<<10)
	var ids []string
	for range 4 {
		id := startTask(t, url, "confirm_delete", map[string]any{"filename": "f", "padding": big})
		waitStatus(t, f, cs, id, "input_required") // parked: no CPU while the test goes on
		ids = append(ids, id)
	}
	if res, e := rpc(t, url, "tools/call", "confirm_delete", map[string]any{"name": "confirm_delete", "arguments": map[string]any{"filename": "f", "padding": big}}, withTasks); e == nil || e["code"] != float64(host.CodeBusy) || !strings.Contains(e["message"].(string), "bytes") {
		t.Fatalf("a fifth 60 KiB task: %v %v; want CodeBusy naming bytes", res, e)
	}
	// A cancelled task holds nothing: room for another.
	if _, err := taskCall(t, cs, "tasks/cancel", &taskParams{TaskID: ids[0]}); err != nil {
		t.Fatal(err)
	}
	startTask(t, url, "confirm_delete", map[string]any{"filename": "f", "padding": big})
}

// TestSharedTaskOwnerRefusalTellsNoUse: 2026-07-28 clients with no
// subject, no session and no client header are one task owner (they
// cannot be told apart), so a refusal past that owner's bound must say
// the bound, not what the owner holds, which is the other such clients'
// tasks. Four such requests park 60 KiB tasks; a fifth, from another
// client, is refused past 256 KiB and must read no figure but the bound.
func TestSharedTaskOwnerRefusalTellsNoUse(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTaskBytesPerClient: 256 << 10}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	big := strings.Repeat("x", 60<<10)
	for range 4 {
		waitStatus(t, f, cs, startTask(t, url, "confirm_delete", map[string]any{"filename": "f", "padding": big}), "input_required")
	}
	_, e := rpc(t, url, "tools/call", "confirm_delete", map[string]any{"name": "confirm_delete", "arguments": map[string]any{"filename": "f", "padding": big}}, withTasks)
	if e == nil || e["code"] != float64(host.CodeBusy) {
		t.Fatalf("a fifth 60 KiB task: %v; want CodeBusy", e)
	}
	msg, _ := e["message"].(string)
	for _, n := range regexp.MustCompile(`[0-9]+`).FindAllString(msg, -1) {
		if n != strconv.Itoa(256<<10) {
			t.Errorf("a client sharing its task owner with others is told %q: %s is not the bound", msg, n)
		}
	}
}

// A finished task's result counts against the client's bytes as it
// finishes: past the bound, the client's oldest finished task is
// forgotten then, not only when the client starts another task. Each
// label of 10,000 quotes is about 20 KB of arguments and 40 KB of result
// (slow_compute quotes it with %q): the second task is let in, and its
// result then puts the client over its 64 KiB. Before stop 57 both
// results were held until the client's next task.
func TestTaskResultBytes(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTaskBytesPerClient: 64 << 10}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	label := strings.Repeat(`"`, 10000)
	first := startTask(t, url, "slow_compute", map[string]any{"seconds": 0, "label": label})
	waitStatus(t, f, cs, first, "completed")
	second := startTask(t, url, "slow_compute", map[string]any{"seconds": 0, "label": label})
	waitStatus(t, f, cs, second, "completed")
	if got, err := taskCall(t, cs, "tasks/get", &taskParams{TaskID: first}); err == nil {
		t.Errorf("the first task, with two results of 40 KB held against 64 KiB: %s; want it forgotten", got.Status)
	}
}

// taskLabel is how the log names task id: a digest, never the ID.
func taskLabel(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "task-" + hex.EncodeToString(sum[:8])
}

// TestTaskBytesCountMeta: a running task keeps its request, _meta and
// all (decoded: each value some 100 bytes of heap), so the bytes its
// client's tasks may hold count the _meta too, not only the arguments.
// (A red team: 16 tasks of one client, each with 1.6 MB of
// clientCapabilities in its _meta and 16 bytes of arguments, kept 194
// MiB of heap for their hour against the 16 MiB a client's tasks may
// hold.)
func TestTaskBytesCountMeta(t *testing.T) {
	f := newFixture(t, &host.Options{MaxTaskBytesPerClient: 64 << 10}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveHTTP(t, f)
	args := func() map[string]any {
		return map[string]any{"name": "slow_compute", "arguments": map[string]any{"seconds": 0}}
	}
	if res, e := rpc(t, url, "tools/call", "slow_compute", args(), withTasks); e != nil || res["resultType"] != "task" {
		t.Fatalf("a task of an ordinary request: %v %v", res, e)
	}
	experimental := map[string]any{}
	for i := range 200 { // 5 KB of JSON, some 150 KiB counted (within host.MaxMetaCost)
		experimental[fmt.Sprint("k", i)] = map[string]any{"a": []any{1, "x", true}}
	}
	caps := map[string]any{"experimental": experimental}
	maps.Copy(caps, withTasks)
	if res, e := rpc(t, url, "tools/call", "slow_compute", args(), caps); e == nil || e["code"] != float64(host.CodeBusy) {
		t.Errorf("a task whose _meta holds 200 capability objects, against 64 KiB a client's tasks may hold: %v %v; want refused with CodeBusy", res, e)
	}
}
