package host_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// hookHandler is a fixture's log handler that runs hook, once, on the
// goroutine that logs the first record whose message is match, before
// the record is written (and outside the text handler's lock).
type hookHandler struct {
	slog.Handler
	match string
	once  *sync.Once
	hook  func()
}

func (h *hookHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.match {
		h.once.Do(h.hook)
	}
	return h.Handler.Handle(ctx, r)
}

func (h *hookHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &hookHandler{h.Handler.WithAttrs(as), h.match, h.once, h.hook}
}

func (h *hookHandler) WithGroup(g string) slog.Handler {
	return &hookHandler{h.Handler.WithGroup(g), h.match, h.once, h.hook}
}

// hookedFixture is newFixture with a log that runs hook at the first line
// containing match.
func hookedFixture(t *testing.T, opts *host.Options, files map[string]string, match string, hook func()) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{log: &syncBuffer{}}
	logger := slog.New(&hookHandler{newTestLogger(f.log).Handler(), match, new(sync.Once), hook})
	var err error
	if f.rt, err = sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.rt.Close(ctx) })
	dir := testplugins.Folder(t, files)
	cat, errs := plugins.LoadAll(ctx, f.rt, []string{dir}, func(string) plugins.Options {
		pol := sandbox.NewPolicy().WithLogger(logger)
		return plugins.Options{Policy: &pol}
	})
	if len(errs) > 0 {
		t.Fatalf("load: %v", errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	o := *opts
	o.Logger = logger
	f.h = host.New(plugins.NewStatic(cat), &o)
	t.Cleanup(func() { f.h.Close(ctx) })
	return f
}

var parkedGauge = regexp.MustCompile(`(?m)^wasmtools_parked_calls (\d+)`)

func parkedCalls(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	m := parkedGauge.FindSubmatch(b)
	if m == nil {
		t.Fatalf("no wasmtools_parked_calls in /metrics")
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// TestTaskCancelledAsItParks: a task cancelled (tasks/cancel) after its
// guest's question has parked the call in the session layer but before
// the task's driver has recorded input_required. The driver sees the
// task cancelled and returns, without taking the parked call out
// (abandonParked reads t.retry and t.state, which were never set): the
// guest stays parked, holding the client's instance and a parked slot,
// until --abandon-after (30 min by default). README: "tasks/cancel stops
// the guest". The hook sends the client's tasks/cancel at the moment the
// host logs the parking, making the interleaving deterministic; in
// production it is a race (a cancel arriving within that window; or a
// task's TTL firing then, which expire does not mark at all).
func TestTaskCancelledAsItParks(t *testing.T) {
	ids := make(chan string, 1)
	var url string
	var f *fixture
	cancelled := make(chan error, 1)
	f = hookedFixture(t, &host.Options{}, map[string]string{"everything.wasm": testplugins.Example(t, "everything")}, "call parked for an answer", func() {
		select {
		case id := <-ids:
			cs := tasksClient(t, url, true)
			_, err := taskCall(t, cs, "tasks/cancel", &taskParams{TaskID: id})
			cancelled <- err
		case <-time.After(30 * time.Second):
			cancelled <- context.DeadlineExceeded
		}
	})
	url = serveHTTP(t, f)
	cs := tasksClient(t, url, true)
	id := startTask(t, url, "confirm_delete", map[string]any{"filename": "a.txt"})
	ids <- id
	if err := <-cancelled; err != nil {
		t.Fatalf("tasks/cancel: %v", err)
	}
	waitStatus(t, f, cs, id, "cancelled")
	// The host logs this once the parked guest has stopped (abandonParked):
	// without the fix it never does, and waitLog fails after a minute.
	f.waitLog(t, "task's parked call stopped", 1)
	if n := parkedCalls(t, url); n != 0 {
		t.Fatalf("after the cancelled task's call was stopped, %d calls are still parked (busy instances %d): its guest was not stopped", n, f.h.BusyInstances())
	}
}
