package host_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
)

// TestUnansweredQuestionAbandoned: a question to a client before
// 2026-07-28 that no one answers is withdrawn after the abandonment time,
// as a 2026-07-28 client's parked call is (docs/ABI.md: the wait "is
// bounded by the abandonment time"); until stop 66 it held the call, its
// instance and its goroutine for as long as the client kept the request
// open, a plugin's grant question included.
func TestUnansweredQuestionAbandoned(t *testing.T) {
	f, srv, _ := grantFixture(t, &host.Options{AbandonAfter: 2 * time.Second})
	withdrawn := make(chan struct{}, 1)
	cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		<-ctx.Done() // the person never answers
		withdrawn <- struct{}{}
		return nil, ctx.Err()
	}})
	// Should the call hang, the client gives up on it before the
	// fixture's cleanups, which wait for it.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan string, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fetch", Arguments: map[string]any{"url": srv.URL}})
		if err != nil {
			done <- "error: " + err.Error()
			return
		}
		done <- text(res)
	}()
	select {
	case got := <-done:
		if !strings.Contains(got, "not granted") {
			t.Errorf("the abandoned question's call: %q, want the grant refused", got)
		}
	case <-time.After(60 * time.Second): // the abandonment time is 2 s
		t.Fatal("a question no one answered held its call 60 s, with an abandonment time of 2 s")
	}
	select {
	case <-withdrawn:
	case <-time.After(30 * time.Second):
		t.Error("the question was not withdrawn from the client")
	}
}

// TestCapCountsQuestionsAnsweredWithAnError: the cap on grant questions
// gives back only what was never put to the person. A question the client
// showed and then answered with an error (a dismissal some clients report
// so, or an answer the schema refuses) was asked: given back, a plugin
// could ask a person whose client answers so without end.
func TestCapCountsQuestionsAnsweredWithAnError(t *testing.T) {
	f, srv, _ := grantFixture(t, &host.Options{MaxGrantQuestions: 2})
	for name, answer := range map[string]func() (*mcp.ElicitResult, error){
		"error": func() (*mcp.ElicitResult, error) { return nil, errors.New("the dialog was closed") },
		"off the schema": func() (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"decision": "Allow"}}, nil
		},
	} {
		var mu sync.Mutex
		shown := 0
		cs := f.connect(t, "2025-11-25", &mcp.ClientOptions{ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mu.Lock()
			shown++
			mu.Unlock()
			return answer()
		}})
		for range 5 {
			call(t, cs, "fetch", map[string]any{"url": srv.URL})
		}
		mu.Lock()
		if shown != 2 {
			t.Errorf("%s: the person was shown %d grant questions in a session whose cap is 2", name, shown)
		}
		mu.Unlock()
	}
}
