package host

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestLateEndKeepsReturningClientsGrants: a client whose key comes back
// while its old client's end still runs (the end waits for the old
// client's call) keeps the grant answers it gives meanwhile, and does not
// inherit the old client's (a review, stop 67: the old client's late end
// forgot every answer kept under the key, the new client's too, and its
// person was asked again).
func TestLateEndKeepsReturningClientsGrants(t *testing.T) {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	cat, errs := plugins.LoadAll(ctx, rt, []string{testplugins.Example(t, "counter")}, nil)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	h := New(plugins.NewStatic(cat), nil)
	t.Cleanup(func() { h.Close(ctx) })
	tool, _ := cat.Tool("count")
	p := tool.Plugin()
	key := sessions.Client("returning")
	answer := func(target string, allowed bool) {
		h.grants.mu.Lock()
		defer h.grants.mu.Unlock()
		h.grants.session(key, "").answers[grantKey{plugin: p.Name(), sha256: p.SHA256(), kind: sandbox.GrantNetwork, target: target}] = allowed
	}

	old, err := h.ses.Acquire(ctx, key, p) // the old client's call, running
	if err != nil {
		t.Fatal(err)
	}
	answer("old.example:443", false)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		h.ses.End(ctx, key) // waits for the old client's call
	}()
	for deadline := time.Now().Add(10 * time.Second); h.ses.Has(key); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the old client was not ended")
		}
	}
	// The key comes back: a new client, which is asked and answers.
	l, err := h.ses.Acquire(ctx, key, p)
	if err != nil {
		t.Fatal(err)
	}
	answer("new.example:443", true)
	l.Done(nil)
	old.Done(nil) // the old client's end goes on, and tells the host
	<-ended

	got := string(h.grants.export(key))
	if !strings.Contains(got, "new.example:443") {
		t.Errorf("the new client's answers after the old client's late end: %q; want its allow of new.example:443 kept", got)
	}
	if strings.Contains(got, "old.example:443") {
		t.Errorf("the new client's answers: %q; want none of the old client's", got)
	}
}
