package host_test

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// hookedStore is a store whose replicas' heartbeats are reported, and
// whose writes can be made to fail, or to wait until let go.
type hookedStore struct {
	statestore.Store
	beats  chan string // the replica of each heartbeat, once written
	claims chan string // the ID of each claim, once made

	mu      sync.Mutex
	fail    bool          // writes fail, as unanswered
	hold    chan struct{} // non-nil: writes wait until it is closed
	waiting chan struct{} // a write is waiting on hold
}

func newHookedStore(s statestore.Store) *hookedStore {
	return &hookedStore{Store: s, beats: make(chan string, 64), claims: make(chan string, 64), waiting: make(chan struct{}, 16)}
}

func (s *hookedStore) Heartbeat(ctx context.Context, o statestore.Owner, ttl time.Duration) error {
	err := s.Store.Heartbeat(ctx, o, ttl)
	select {
	case s.beats <- o.Replica:
	default:
	}
	return err
}

func (s *hookedStore) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	c, err := s.Store.Claim(ctx, id, o, ttl, steal)
	select {
	case s.claims <- id:
	default:
	}
	return c, err
}

func (s *hookedStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	s.mu.Lock()
	fail, hold := s.fail, s.hold
	s.mu.Unlock()
	if fail {
		return errNoAnswer
	}
	if hold != nil {
		s.waiting <- struct{}{}
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
}

// heartbeats returns once replica wrote n heartbeats after the call.
func (s *hookedStore) heartbeats(t *testing.T, replica string, n int) {
	t.Helper()
	for len(s.beats) > 0 {
		<-s.beats
	}
	for n > 0 {
		select {
		case r := <-s.beats:
			if r == replica {
				n--
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no heartbeat")
		}
	}
}

func fileStore(t *testing.T) statestore.Store {
	t.Helper()
	s, err := statestore.Open("file:"+filepath.Join(t.TempDir(), "sessions.db"), replicaKey)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Finding 11: a client's DELETE of a session whose claim the heartbeat
// swept deletes the session's record. The claim is swept when the
// session-layer client has ended but the session's end has not reached
// the store yet: here the end waits for the session's instance, which the
// heartbeat holds while it saves again a state whose checkpoint failed
// (its write held by the test). The old code deleted nothing then, and
// another replica took the session over again from its record.
func TestDeleteOfSweptSessionDeletesItsRecord(t *testing.T) {
	store := newHookedStore(fileStore(t))
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes")}
	opts := host.Options{Store: store, StoreTimeout: time.Minute}
	opts.Replica = "a"
	a := replicaWith(t, opts, sandbox.NewPolicy(), files)
	opts.Replica = "b"
	b := replicaWith(t, opts, sandbox.NewPolicy(), files)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	id := cs.ID()
	if res := call(t, cs, "note_add", map[string]any{"text": "one"}); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("first call: %v %s", res.Meta, text(res))
	}
	// A checkpoint fails: the heartbeat saves the state again, holding
	// the session's instance meanwhile; the test holds that write.
	store.mu.Lock()
	store.fail = true
	store.mu.Unlock()
	if res := call(t, cs, "note_add", map[string]any{"text": "two"}); res.Meta[host.MetaNotSaved] == nil {
		t.Fatalf("a call whose checkpoint failed: %v %s", res.Meta, text(res))
	}
	hold := make(chan struct{})
	t.Cleanup(func() {
		select {
		case <-hold:
		default:
			close(hold)
		}
	})
	store.mu.Lock()
	store.fail, store.hold = false, hold
	store.mu.Unlock()
	select {
	case <-store.waiting:
	case <-time.After(30 * time.Second):
		t.Fatal("the heartbeat did not save the state again")
	}
	// The client ends its session. Its end waits for the instance; the
	// heartbeat sweeps the claim of the ended client meanwhile (a sweep
	// follows each heartbeat: the third after the DELETE comes after a
	// sweep that ran once the client ended).
	req, _ := http.NewRequest(http.MethodDelete, a.srv.URL+"/mcp", nil)
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent && res.StatusCode != http.StatusOK {
		t.Fatalf("DELETE: %d", res.StatusCode)
	}
	store.heartbeats(t, "a", 3)
	close(hold)
	eventually(t, "the ended session's record deleted", func() bool {
		_, err := store.Get(context.Background(), "s."+id)
		return errors.Is(err, statestore.ErrNotFound)
	})
	if code, body := postSession(t, b.srv.URL, id, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`); code != http.StatusNotFound {
		t.Fatalf("the deleted session at another replica: %d %s\na's log:\n%s", code, body, a.log.String())
	}
}

// Finding 8: Drain waits for a call queued on an instance behind another
// call of its session, saves both calls' effects, and only then releases
// the session's claim. Here the first call waits for a person (its lease
// paused: WaitIdle does not wait for people), and the drain withdraws its
// question: it then ends, and the queued call runs. The old code's
// WaitIdle counted neither the queued call nor the one about to resume,
// and its checkpoints skipped the busy instance and released the claim
// anyway: the queued call's effect was not in the store, and the replica
// that took the session over had lost it.
func TestDrainWaitsForQueuedCall(t *testing.T) {
	store := newHookedStore(fileStore(t))
	files := map[string]string{"confirm.wasm": testplugins.Example(t, "confirm")}
	opts := host.Options{Store: store}
	opts.Replica = "a"
	a := replicaWith(t, opts, sandbox.NewPolicy(), files)
	opts.Replica = "b"
	b := replicaWith(t, opts, sandbox.NewPolicy(), files)
	asked := make(chan struct{}, 1)
	answer := func(ctx context.Context, _ *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		asked <- struct{}{}
		<-ctx.Done() // withdrawn by the drain
		return nil, ctx.Err()
	}
	// The client opens no standalone SSE stream: the drain closes it, and
	// the go-sdk client takes the 503 of its reconnection for the end of
	// the session, failing the calls it waits for (a proxy would send it
	// to another replica).
	rt := &router{to: a}
	tr := &mcp.StreamableClientTransport{Endpoint: a.srv.URL + "/mcp", HTTPClient: &http.Client{Transport: rt}, DisableStandaloneSSE: true}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{ElicitationHandler: answer}).Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	if res := call(t, cs, "add", map[string]any{"item": "milk"}); res.IsError {
		t.Fatal(text(res))
	}
	// The first call asks, and waits; the second is queued on the same
	// instance behind it (it is in the host, past the drain's refusal of
	// new requests). Not a claim of the session: a running call renews
	// its own, which is no sign of the second.
	first := callAsync(cs, "delete", map[string]any{"item": "milk"})
	select {
	case <-asked:
	case res := <-first:
		t.Fatalf("delete did not ask: %s", text(res))
	}
	second := callAsync(cs, "add", map[string]any{"item": "eggs"})
	for deadline := time.Now().Add(30 * time.Second); a.h.QueuedCalls() != 1; {
		select {
		case res := <-second:
			t.Fatalf("the second call did not wait for the first: %s", text(res))
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("the second call did not reach the host")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := a.h.Drain(ctx, host.DrainOptions{}); err != nil {
		t.Fatalf("drain: %v\n%s", err, a.log.String())
	}
	// Both calls ended before the drain did, saved.
	for _, c := range []struct {
		done <-chan *mcp.CallToolResult
		want string
	}{{first, "not deleted"}, {second, `added "eggs"`}} {
		select {
		case res := <-c.done:
			if !strings.HasPrefix(text(res), c.want) || res.Meta[host.MetaNotSaved] != nil {
				t.Errorf("a call during the drain: %v %q; want %q, saved", res.Meta, text(res), c.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("a call still running after the drain, which was to wait for it (want %q)", c.want)
		}
	}
	// Both effects are in the store, and the claim was released: b takes
	// the session over from no one, with the queued call's item.
	rt.point(b)
	res := call(t, cs, "list", nil)
	if res.IsError || text(res) != "milk\neggs" || res.Meta[host.MetaStateReset] != nil {
		t.Fatalf("the session at b after a's drain: %v %q; want milk and eggs\na's log:\n%s", res.Meta, text(res), a.log.String())
	}
	if strings.Contains(b.log.String(), "holderAlive=true") {
		t.Fatalf("b took the session from a live holder: a kept its claim\n%s", b.log.String())
	}
}

func callAsync(cs *mcp.ClientSession, tool string, args map[string]any) <-chan *mcp.CallToolResult {
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			res = &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "error: " + err.Error()}}}
		}
		done <- res
	}()
	return done
}
