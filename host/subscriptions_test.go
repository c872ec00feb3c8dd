package host_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
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

// TestSubscriptionsFairShares: the URIs 2025-11-25 sessions subscribe to
// with resources/subscribe count, in bytes, against the same bound as
// those of 2026-07-28 listen streams (64 MiB in all, with tenants a
// quarter each): past his share bob's subscriptions are refused with
// CodeBusy, and alice's are taken. A red team (stop 72) found only each
// session bounded (256 URIs of 2 KiB, 512 KiB), so that a tenant held
// that many times its share of sessions (1,024 at the defaults): 512 MiB
// of URIs kept twice (the host's book and the go-sdk's), where its listen
// streams were held to 16 MiB.
func TestSubscriptionsFairShares(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, &host.Options{Tenants: true}, sandbox.NewPolicy(), map[string]string{"everything.wasm": testplugins.Example(t, "everything")})
	url := serveGuarded(t, f, host.GuardOptions{Tokens: map[string]string{"alice": aliceToken, "bob": bobToken}})
	pad := strings.Repeat("x", 2000)
	uri := func(who string, s, i int) string {
		return fmt.Sprintf("test://template/%s%d-%d-%s/data", who, s, i, pad)
	}

	// 36 sessions of 256 URIs of 2 KiB: 18 MiB, past bob's 16 MiB.
	const sessions = 36
	var refused, taken atomic.Int64
	var wg sync.WaitGroup
	work := make(chan int)
	for range 6 {
		wg.Go(func() {
			for s := range work {
				cs := connectHTTP(t, url, "2025-11-25", tenantTransport{token: bobToken})
				for i := range 256 {
					err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri("bob", s, i)})
					var werr *jsonrpc.Error
					switch {
					case err == nil:
						taken.Add(1)
					case errors.As(err, &werr) && werr.Code == host.CodeBusy:
						refused.Add(1)
					default:
						t.Errorf("bob's subscription %d of session %d: %v", i, s, err)
						return
					}
				}
			}
		})
	}
	for s := range sessions {
		work <- s
	}
	close(work)
	wg.Wait()
	if refused.Load() == 0 || taken.Load()*2000 > 16<<20 {
		t.Errorf("bob's %d subscriptions of 2 KiB: %d taken, %d refused; want those past his 16 MiB refused with CodeBusy", sessions*256, taken.Load(), refused.Load())
	}
	cs := connectHTTP(t, url, "2025-11-25", tenantTransport{token: aliceToken})
	for i := range 256 {
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri("alice", 0, i)}); err != nil {
			t.Fatalf("alice's subscription %d while bob holds his share: %v", i, err)
		}
	}
}
