package host_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestSubscriptionsBoundedAndGoneWithSession: a session subscribes only
// to URIs a plugin serves, of at most 2 KiB, at most 256 at once; and
// what it still holds when it ends is undone. A red team found
// resources/subscribe taking any URI of any length, without bound (the
// host's SubscribeHandler accepted everything, and without access rules
// nothing checked), and the go-sdk's session end (Server.disconnect,
// v1.8.0) leaving each URI's emptied entry in its server-wide map: 2,000
// made-up URIs of 32 KiB kept 78 MiB after the session ended, for good.
func TestSubscriptionsBoundedAndGoneWithSession(t *testing.T) {
	ctx := context.Background()
	f := quietNotes(t)
	t.Cleanup(func() { f.h.Close(ctx) })
	// A URI of the notes' template notes://note/{n}, of about 2 KiB.
	pad := strings.Repeat("x", 2000)
	note := func(s string, i int) string { return fmt.Sprintf("notes://note/%s%d%s", s, i, pad) }

	t.Run("refused", func(t *testing.T) {
		cs := f.connect(t, "2025-11-25", nil)
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "nosuch://item/1"}); err == nil {
			t.Error("a subscription to a URI no plugin serves was taken")
		}
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "notes://note/" + strings.Repeat("x", 3000)}); err == nil || !strings.Contains(err.Error(), "limit") {
			t.Errorf("a subscription to a URI of 3 KiB: %v; want it refused, naming the limit", err)
		}
		for i := range 256 {
			if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: note("r", i)}); err != nil {
				t.Fatalf("subscription %d: %v", i, err)
			}
		}
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: note("r", 256)}); err == nil || !strings.Contains(err.Error(), "at most 256") {
			t.Errorf("a 257th subscription: %v; want it refused", err)
		}
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: note("r", 0)}); err != nil {
			t.Errorf("a subscription held already, again: %v", err)
		}
		if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: note("r", 0)}); err != nil {
			t.Fatal(err)
		}
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: note("r", 256)}); err != nil {
			t.Errorf("a subscription after one was undone: %v", err)
		}
	})

	t.Run("listen", func(t *testing.T) {
		// A 2026-07-28 client's subscription is a subscriptions/listen
		// stream, which the server ends at once when it acknowledges
		// nothing: a URI no plugin serves is left out.
		cs := f.connect(t, "2026-07-28", nil)
		done := make(chan error, 1)
		go func() { done <- cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "nosuch://item/1"}) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("a listen stream for a URI no plugin serves was kept open: its subscription was taken")
		}
	})

	t.Run("gone with the session", func(t *testing.T) {
		heap := func() int64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return int64(ms.HeapAlloc)
		}
		// run opens sessions sessions that each subscribe to 256 URIs of
		// 2 KiB and end, having undone them if unsub.
		const n = 8
		run := func(tag string, sessions int, unsub bool) {
			for s := range sessions {
				cs := f.connect(t, "2025-11-25", nil)
				for i := range 256 {
					uri := note(fmt.Sprintf("%s%d-", tag, s), i)
					if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
						t.Fatalf("subscription %d: %v", i, err)
					}
					if unsub {
						if err := cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: uri}); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := cs.Close(); err != nil {
					t.Fatal(err)
				}
			}
		}
		run("warm", 2, true) // the server's maps and pools grown
		before := heap()
		run("undone", n, true) // the same requests, each subscription undone
		baseline := heap() - before
		run("ended", n, false)
		// The session's end undoes its subscriptions once the server
		// session is done, which may come after the client's Close.
		var kept int64
		undone := func() bool { kept = heap() - before - baseline; return kept <= 2<<20 }
		if !undone() {
			eventually(t, "the ended sessions' subscriptions to be undone", undone)
		}
		t.Logf("heap kept after %d sessions of 256 subscriptions of 2 KiB: %d KiB over the sessions that undid theirs", n, kept>>10)
	})
}

// quietNotes serves the notes example from a host of its own that logs
// nowhere (the go-sdk logs each subscription's URI, which a fixture's log
// would keep), which the caller closes.
func quietNotes(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	cat, errs := plugins.LoadAll(ctx, rt, []string{testplugins.Folder(t, map[string]string{"notes.wasm": testplugins.Example(t, "notes")})}, func(string) plugins.Options { return plugins.Options{} })
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	t.Cleanup(func() { cat.Close(ctx) })
	return &fixture{h: host.New(plugins.NewStatic(cat), &host.Options{Logger: slog.New(slog.DiscardHandler)})}
}
