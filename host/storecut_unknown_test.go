package host_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/proxytest"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// A handle the store does not hold, refused as unknown by a replica that
// never had its session (b), while the replica that holds it (a) is cut
// off from the store alone, its link silent, and the store came back
// empty: b claimed the handle to read it, and must not leave that claim
// behind. a, back, then writes the session back from its memory, as
// when no replica asked for it meanwhile
// (TestCutOffStoreBackEmptyLosesNoSession): b never had a state of it.
// Left there, b's claim was a hand-over to a, which took the session
// over from it as from a holder that served the session, its state gone
// with the store's: a dropped what it held, and the client was told of a
// loss there was none of. b starts after the loss here, and no replica
// that reaches the store saw the earlier epoch (a alone did, cut off):
// nothing recorded the loss, and durable.Keeper.LostLately cannot tell b
// of it, as for a replica past LostLately's minute.
//
// With b's release of its claim lost (the store did not answer it), a
// still says what it cannot write back: its state lost, never an empty
// state unsaid.
func TestUnknownHandleElsewhereLeavesNoClaim(t *testing.T) {
	t.Run("released", func(t *testing.T) { unknownHandleElsewhere(t, false) })
	t.Run("release lost", func(t *testing.T) { unknownHandleElsewhere(t, true) })
}

func unknownHandleElsewhere(t *testing.T, releaseLost bool) {
	r := startCutRedis(t)
	a := r.serve(t, "a", redisStore(t, r.link.Addr()))
	a.waitLog(t, "state key checked", 1)
	ca := connectHTTP(t, a.srv.URL, "", nil)
	ca.ListTools(context.Background(), nil)
	first := call(t, ca, "note_add", map[string]any{"text": "one"})
	handle, _ := first.Meta[host.MetaSession].(string)
	if first.IsError || first.Meta[host.MetaNotSaved] != nil || handle == "" {
		t.Fatalf("a: %v %s", first.Meta, text(first))
	}
	args := map[string]any{host.SessionArgument: handle}
	// a's link goes silent; Redis comes back empty behind it.
	r.cutBackEmpty(t)
	var bs statestore.Store = redisStore(t, r.addr)
	if releaseLost {
		bs = noRelease{bs}
	}
	b := r.serve(t, "b", bs)
	logsOnFailure(t, a, b)
	b.waitLog(t, "state key checked", 1)
	// The client takes the handle to b, which finds nothing of it.
	cb := connectHTTP(t, b.srv.URL, "", nil)
	cb.ListTools(context.Background(), nil)
	if res := call(t, cb, "note_list", args); !res.IsError || !strings.Contains(text(res), "was refused") {
		t.Fatalf("b, the handle unknown to it and to the store: %v %s", res.Meta, text(res))
	}
	// a's link comes back, past its grace (two heartbeat rounds
	// unanswered); the client takes the handle to a again.
	a.waitLog(t, "state store heartbeat", 2)
	r.link.SetMode(proxytest.RelayPass)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.h.WaitStore(ctx); err != nil {
		t.Fatal(err)
	}
	retryOn(t, "the session at a once its link is back", a.logged("state store"), func() (bool, string) {
		res, err := ca.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list", Arguments: args})
		if err != nil || res.IsError {
			return false, outcome(res, err)
		}
		_, reset := res.Meta[host.MetaStateReset]
		switch {
		case !reset && !strings.Contains(text(res), "one"):
			t.Fatalf("the session at a once its link is back: %v %q: its state gone unsaid", res.Meta, text(res))
		case !releaseLost && !strings.Contains(text(res), "one"):
			t.Fatalf("the session at a once its link is back: %v %q; want one, written back from a's memory", res.Meta, text(res))
		}
		return true, ""
	})
}

// noRelease is a store whose releases are lost: the store never answers
// them.
type noRelease struct{ statestore.Store }

func (noRelease) Release(context.Context, string, uint64) error {
	return errors.New("the store did not answer the release")
}
