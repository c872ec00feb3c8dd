package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// progressLog collects the progress notifications a client receives.
type progressLog struct {
	mu  sync.Mutex
	got []*mcp.ProgressNotificationParams
}

func (p *progressLog) handler(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, req.Params)
	activity.fire()
}

func (p *progressLog) all() []*mcp.ProgressNotificationParams {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*mcp.ProgressNotificationParams{}, p.got...)
}

// pdkhostFixture serves the pdkhost test plugin alone: each Go plugin a
// fixture loads costs seconds under the race detector (checked, validated,
// its host modules compiled), and most tests call pdkhost only.
func pdkhostFixture(t *testing.T, opts *host.Options) *fixture {
	return newFixture(t, opts, sandbox.NewPolicy(), map[string]string{
		"pdkhost.wasm": testplugins.Test(t, "pdkhost"),
	})
}

// confirmFixture serves pdkhost and the confirm example.
func confirmFixture(t *testing.T, opts *host.Options) *fixture {
	return newFixture(t, opts, sandbox.NewPolicy(), map[string]string{
		"pdkhost.wasm": testplugins.Test(t, "pdkhost"),
		"confirm.wasm": testplugins.Example(t, "confirm"),
	})
}

func TestProgress(t *testing.T) {
	f := pdkhostFixture(t, nil)
	for _, proto := range protocols {
		for _, token := range []any{"tok-1", 42} {
			t.Run(fmt.Sprintf("protocol=%s/token=%v", proto, token), func(t *testing.T) {
				var pl progressLog
				cs := f.connect(t, proto, &mcp.ClientOptions{ProgressNotificationHandler: pl.handler})
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 5}, Meta: mcp.Meta{"progressToken": token}})
				if err != nil || res.IsError {
					t.Fatalf("call: %v %v", err, res)
				}
				// Notifications are handled as they arrive, and may
				// still be in the client's hands when the result is.
				eventually(t, "5 progress notifications", func() bool { return len(pl.all()) >= 5 })
				got := pl.all()
				if len(got) != 5 {
					t.Fatalf("received %d progress notifications, want 5", len(got))
				}
				for i, p := range got {
					if p.Progress != float64(i+1) || p.Total != 5 || p.Message != fmt.Sprintf("step %d", i+1) {
						t.Errorf("notification %d = %+v", i, p)
					}
					if fmt.Sprint(p.ProgressToken) != fmt.Sprint(token) {
						t.Errorf("token %v, want %v", p.ProgressToken, token)
					}
				}
			})
		}
		t.Run("protocol="+proto+"/no token", func(t *testing.T) {
			var pl progressLog
			cs := f.connect(t, proto, &mcp.ClientOptions{ProgressNotificationHandler: pl.handler})
			call(t, cs, "progress", map[string]any{"steps": 3})
			// A later call with a token marks the end: notifications
			// arrive in order, so any of the first call's come before
			// its one.
			if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 1}, Meta: mcp.Meta{"progressToken": "marker"}}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the marker's progress notification", func() bool { return len(pl.all()) >= 1 })
			if got := pl.all(); len(got) != 1 || fmt.Sprint(got[0].ProgressToken) != "marker" {
				t.Errorf("notifications %+v: the call without a progress token sent some", got)
			}
		})
	}
}

func TestProgressFloodIsLimited(t *testing.T) {
	f := pdkhostFixture(t, nil)
	var pl progressLog
	cs := f.connect(t, "", &mcp.ClientOptions{ProgressNotificationHandler: pl.handler})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "progress", Arguments: map[string]any{"steps": 20000}, Meta: mcp.Meta{"progressToken": "flood"}})
	if err != nil || res.IsError {
		t.Fatalf("call: %v %v", err, res)
	}
	eventually(t, "the final update", func() bool {
		got := pl.all()
		return len(got) > 0 && got[len(got)-1].Progress == 20000
	})
	got := pl.all()
	if len(got) > 500 || len(got) < 2 {
		t.Errorf("a flood of 20000 updates sent %d notifications; want a rate-limited handful", len(got))
	}
	if last := got[len(got)-1]; last.Progress != 20000 {
		t.Errorf("last notification %+v; the final update must not be lost", last)
	}
	for i := 1; i < len(got); i++ {
		if got[i].Progress <= got[i-1].Progress {
			t.Fatalf("out of order: %v then %v", got[i-1].Progress, got[i].Progress)
		}
	}
}

func TestRecords(t *testing.T) {
	var audit syncBuffer
	f := pdkhostFixture(t, &host.Options{RecordLog: &audit})
	cs := f.connect(t, "", nil)
	res := call(t, cs, "record", map[string]any{"count": 2})
	if text(res) != "recorded" {
		t.Fatalf("record: %s", text(res))
	}
	want := []any{
		map[string]any{"namespace": "test.pdkhost", "data": map[string]any{"i": 0.0, "pad": ""}},
		map[string]any{"namespace": "test.pdkhost", "data": map[string]any{"i": 1.0, "pad": ""}},
	}
	if diff := cmp.Diff(want, res.Meta[host.MetaRecords]); diff != "" {
		t.Errorf("_meta records (-want +got):\n%s", diff)
	}
	if got := text(call(t, cs, "record", map[string]any{"count": 101})); !strings.Contains(got, "1 refused: record refused: a call may write at most 100 records") {
		t.Errorf("101 records: %s", got)
	}
	if got := text(call(t, cs, "record", map[string]any{"count": 1, "size": 70000})); !strings.Contains(got, "over the 65536-byte limit") {
		t.Errorf("a 70 KB record: %s", got)
	}
	lines := strings.Split(strings.TrimSpace(audit.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("audit log has %d lines, want 3:\n%s", len(lines), audit.String())
	}
	var entry struct {
		Session, Plugin, SHA256, Tool string
		DurationMS                    float64
		IsError                       bool
		Records                       []map[string]any
	}
	if err := json.Unmarshal([]byte(lines[0]), &entry); err != nil {
		t.Fatal(err)
	}
	if entry.Plugin != "pdkhost" || entry.Tool != "record" || len(entry.SHA256) != 64 || len(entry.Records) != 2 || entry.Session == "" {
		t.Errorf("audit entry = %+v", entry)
	}
}

// answerer is a client elicitation handler that answers from a script.
type answerer struct {
	mu      sync.Mutex
	answers []*mcp.ElicitResult
	asked   []string
}

func (a *answerer) handler(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, req.Params.Message)
	if len(a.answers) == 0 {
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	r := a.answers[0]
	a.answers = a.answers[1:]
	return r, nil
}

func accept(name string) *mcp.ElicitResult {
	return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": name}}
}

func TestElicitation(t *testing.T) {
	f := pdkhostFixture(t, nil)
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			tests := []struct {
				name    string
				rounds  int
				answers []*mcp.ElicitResult
				want    string
			}{
				{"accept", 1, []*mcp.ElicitResult{accept("alice")}, "accept:alice"},
				{"decline", 1, []*mcp.ElicitResult{{Action: "decline"}}, "decline"},
				{"cancel", 1, []*mcp.ElicitResult{{Action: "cancel"}}, "cancel"},
				{"two rounds", 2, []*mcp.ElicitResult{accept("alice"), accept("bob")}, "accept:alice,accept:bob"},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					a := &answerer{answers: tt.answers}
					cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: a.handler})
					if got := text(call(t, cs, "ask", map[string]any{"rounds": tt.rounds})); got != tt.want {
						t.Errorf("answers = %q, want %q", got, tt.want)
					}
					if len(a.asked) != tt.rounds {
						t.Errorf("client was asked %d questions, want %d", len(a.asked), tt.rounds)
					}
				})
			}
		})
	}
}

func TestElicitationRoundLimit(t *testing.T) {
	f := pdkhostFixture(t, nil)
	var answers []*mcp.ElicitResult
	for i := range 10 {
		answers = append(answers, accept(fmt.Sprint("n", i)))
	}
	cs := f.connect(t, "", &mcp.ClientOptions{ElicitationHandler: (&answerer{answers: answers}).handler})
	got := strings.Split(text(call(t, cs, "ask", map[string]any{"rounds": 10})), ",")
	if len(got) != 10 || got[8] != "accept:n8" || !strings.HasPrefix(got[9], "cancel(a call may ask a client at most 9 questions") {
		t.Errorf("answers = %q; want nine accepted and the tenth refused", got)
	}
}

func TestElicitationRefusals(t *testing.T) {
	f := pdkhostFixture(t, nil)
	for _, proto := range protocols {
		cs := f.connect(t, proto, nil) // offers no elicitation
		// Declined, as hyper-mcp answers.
		if got := text(call(t, cs, "ask", map[string]any{"rounds": 1})); !strings.Contains(got, "decline(the client does not offer elicitation)") {
			t.Errorf("%s: no elicitation capability: %q", proto, got)
		}
		cs = f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: (&answerer{}).handler})
		if got := text(call(t, cs, "ask", map[string]any{"rounds": 1, "mode": "url"})); !strings.Contains(got, `does not offer "url" elicitation`) {
			t.Errorf("%s: url mode to a form-only client: %q", proto, got)
		}
	}
}

// A call's questions that the client cannot be asked are refused by the
// goroutine serving the client, while the call's deadline is paused for
// the wait: past maxRefused (32) of them, the rest are refused at once, on
// the guest's time, so that a guest asking in a loop cannot spend its call
// in paused waits.
func TestRefusedQuestionsBounded(t *testing.T) {
	f := pdkhostFixture(t, nil)
	for _, proto := range protocols {
		cs := f.connect(t, proto, nil) // offers no elicitation
		got := strings.Split(text(call(t, cs, "ask", map[string]any{"rounds": 40})), ",")
		if len(got) != 40 || got[31] != "decline(the client does not offer elicitation)" ||
			!strings.HasPrefix(got[32], "cancel(this call's questions were refused 32 times") || got[39] != got[32] {
			t.Errorf("%s: answers = %q; want 32 declined, then refused at once", proto, got)
		}
	}
}

// rawRound calls ask with the client's automatic retries off, returning
// the input-required result.
func rawRound(t *testing.T, f *fixture, opts *host.Options) (*mcp.ClientSession, *mcp.CallToolResult) {
	t.Helper()
	cs := f.connect(t, "", &mcp.ClientOptions{
		ElicitationHandler: (&answerer{}).handler,
		MultiRoundTrip:     &mcp.MultiRoundTripOptions{Disabled: true},
	})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "ask", Arguments: map[string]any{"rounds": 2}})
	if err != nil {
		t.Fatal(err)
	}
	if res.RequestState == "" || len(res.InputRequests) != 1 {
		t.Fatalf("want an input-required result, got %+v", res)
	}
	return cs, res
}

func retry(cs *mcp.ClientSession, state string, answer *mcp.ElicitResult) (*mcp.CallToolResult, error) {
	return cs.CallTool(context.Background(), &mcp.CallToolParams{
		Name: "ask", Arguments: map[string]any{"rounds": 2},
		InputResponses: mcp.InputResponseMap{"q": answer}, RequestState: state,
	})
}

func TestRequestState(t *testing.T) {
	// Each retry must come within AbandonAfter of its park, on a loaded
	// machine too.
	f := pdkhostFixture(t, &host.Options{AbandonAfter: 8 * time.Second})
	cs, first := rawRound(t, f, nil)

	tampered := []byte(first.RequestState)
	tampered[3] ^= 1
	if _, err := retry(cs, string(tampered), accept("x")); err == nil || !strings.Contains(err.Error(), "invalid request state") {
		t.Errorf("tampered state: %v", err)
	}
	if _, err := retry(cs, "garbage", accept("x")); err == nil || !strings.Contains(err.Error(), "invalid request state") {
		t.Errorf("garbage state: %v", err)
	}
	// The real state still works: round two, then the result.
	second, err := retry(cs, first.RequestState, accept("ann"))
	if err != nil || second.RequestState == "" {
		t.Fatalf("second round: %v %+v", err, second)
	}
	if _, err := retry(cs, first.RequestState, accept("x")); err == nil {
		t.Error("a state answered already was accepted again")
	}
	// A form answer that does not match the schema reaches the guest as
	// a refusal, not as content.
	final, err := retry(cs, second.RequestState, &mcp.ElicitResult{Action: "accept", Content: map[string]any{"name": 7}})
	if err != nil {
		t.Fatal(err)
	}
	if got := text(final); !strings.HasPrefix(got, "accept:ann,cancel(the answer does not match the requested schema") {
		t.Errorf("final = %q", got)
	}

	// Abandonment: the client never comes back.
	_, parked := rawRound(t, f, nil)
	f.waitLog(t, "parked call abandoned", 1)
	if _, err := retry(cs, parked.RequestState, accept("late")); err == nil {
		t.Error("an abandoned call was resumed")
	}
}

func TestLogging(t *testing.T) {
	f := pdkhostFixture(t, nil)
	for _, proto := range protocols {
		t.Run("protocol="+proto, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			cs := f.connect(t, proto, &mcp.ClientOptions{LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
				mu.Lock()
				got = append(got, fmt.Sprint(req.Params.Level, ":", req.Params.Data))
				mu.Unlock()
				activity.fire()
			}})
			call(t, cs, "log", map[string]any{"level": "info", "message": "unasked-" + proto})
			// Before 2026-07-28 a client sets its level for the session;
			// from 2026-07-28 it names it in each request's _meta.
			var meta mcp.Meta
			if proto == "" {
				meta = mcp.Meta{"io.modelcontextprotocol/logLevel": "warning"}
			} else if err := cs.SetLoggingLevel(context.Background(), &mcp.SetLoggingLevelParams{Level: "warning"}); err != nil {
				t.Fatal(err)
			}
			for _, m := range []map[string]any{{"level": "info", "message": "below"}, {"level": "error", "message": "wanted"}} {
				if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "log", Arguments: m, Meta: meta}); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, "the log message", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) > 0
			})
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff([]string{"error:wanted"}, got); diff != "" {
				t.Errorf("client got (-want +got):\n%s", diff)
			}
			if !strings.Contains(f.log.String(), "unasked-"+proto) {
				t.Error("the host log lacks a message the client did not ask for")
			}
		})
	}
	cs := f.connect(t, "", nil)
	res := call(t, cs, "log", map[string]any{"level": "loud", "message": "x"})
	if !res.IsError || !strings.Contains(text(res), `unknown logging level "loud"`) {
		t.Errorf("bad level: %q", text(res))
	}
}

func TestToolListChanged(t *testing.T) {
	f := pdkhostFixture(t, nil)
	changed := make(chan struct{}, 4)
	cs := f.connect(t, "", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} }})
	call(t, cs, "record", map[string]any{"count": 0}) // start the instance
	if got := text(call(t, cs, "relist", nil)); got != "relisted" {
		t.Fatal(got)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no tools/list_changed")
	}
	res := call(t, cs, "extra", nil)
	if text(res) != "extra tool" || res.Meta[host.MetaStateReset] != nil {
		t.Errorf("extra: %q, meta %v; want it served by the same instance", text(res), res.Meta)
	}
}

func TestHostFunctionMisuse(t *testing.T) {
	f := pdkhostFixture(t, nil)
	cs := f.connect(t, "", nil)
	res := call(t, cs, "badjson", nil)
	if !res.IsError || !strings.Contains(text(res), "notify_progress: input is not the expected JSON") {
		t.Errorf("bad JSON to a host function: %q", text(res))
	}
}

func TestCancelParkableGuest(t *testing.T) {
	f := pdkhostFixture(t, nil)
	for _, proto := range protocols {
		cs := f.connect(t, proto, nil)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error)
		go func() {
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "spin", Arguments: map[string]any{}})
			errc <- err
		}()
		eventually(t, "the call to hold its instance", func() bool { return f.h.BusyInstances() == 1 })
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", proto, err)
		}
		// The spinning guest is stopped (its instance reset), or the
		// cancel came before it ran and nothing ran: no call holds an
		// instance.
		eventually(t, "the guest to stop", func() bool { return f.h.BusyInstances() == 0 })
	}
}

func TestExampleConfirm(t *testing.T) {
	f := confirmFixture(t, nil)
	for _, proto := range protocols {
		a := &answerer{answers: []*mcp.ElicitResult{{Action: "accept", Content: map[string]any{"confirm": true, "reason": "done"}}, {Action: "decline"}}}
		cs := f.connect(t, proto, &mcp.ClientOptions{ElicitationHandler: a.handler})
		call(t, cs, "add", map[string]any{"item": "a"})
		call(t, cs, "add", map[string]any{"item": "b"})
		res := call(t, cs, "delete", map[string]any{"item": "a"})
		recs, _ := json.Marshal(res.Meta[host.MetaRecords])
		if text(res) != `deleted "a"` || !strings.Contains(string(recs), `"deleted":"a","reason":"done"`) {
			t.Errorf("%s: delete a: %q %s", proto, text(res), recs)
		}
		if got := text(call(t, cs, "delete", map[string]any{"item": "b"})); got != "not deleted (decline)" {
			t.Errorf("%s: delete b: %q", proto, got)
		}
		if got := text(call(t, cs, "list", nil)); got != "b" {
			t.Errorf("%s: list = %q", proto, got)
		}
	}
}
