package host_test

import (
	"bufio"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestStandingStreamAfterPurgeNothingTwice: a session's standing stream
// whose first events the replay store purged (its bound) and that is
// opened afresh (no Last-Event-ID: the client's first, or after a
// resumption that could not be replayed, which the priming event sends
// there) replays what was kept under IDs that resume from it: resuming
// from the last one, and then from the priming events' IDs, replays
// nothing again.
func TestStandingStreamAfterPurgeNothingTwice(t *testing.T) {
	// A bound of a byte: every event appended drops the ones before.
	f := newReloadFixtureWith(t, &host.Options{StreamKeepAlive: time.Second, MaxStreamReplayBytes: 1}, map[string][]byte{"counter.wasm": testplugins.Bytes(t, testplugins.Example(t, "counter"))})
	srv := newEndsStreamsServer(t, f)
	session := rawSession(t, srv)

	// Three deploys' notifications, live on the open stream: the store
	// keeps the last alone.
	resp, end, err := openStanding(srv, session, "")
	if err != nil {
		t.Fatal(err)
	}
	ended := false
	defer func() {
		if !ended {
			end()
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	for _, name := range []string{"hash", "notes", "confirm"} {
		f.deploy(t, name+".wasm", testplugins.Bytes(t, testplugins.Example(t, name)))
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: {") {
		}
		if err := sc.Err(); err != nil {
			t.Fatalf("the notification of %s: %v", name, err)
		}
	}
	ended = true
	end()

	_, fresh, last, prime := standingRead(t, srv, session, "")
	if len(fresh) == 0 || last == "" {
		t.Fatalf("opened afresh: %d events (last ID %q), want those kept", len(fresh), last)
	}
	eid := last
	for i := range 3 {
		_, events, _, next := standingRead(t, srv, session, eid)
		if len(events) != 0 {
			t.Fatalf("resumed from %q (step %d after the fresh stream, primed %q): %d events again, want none", eid, i, prime, len(events))
		}
		if next == "" {
			t.Fatalf("resumed from %q: no priming event", eid)
		}
		eid = next
	}
}

// newEndsStreamsServer serves f's HTTP handler (endsStreams) and returns
// its URL.
func newEndsStreamsServer(t *testing.T, f *reloadFixture) string {
	t.Helper()
	srv := httptest.NewServer(endsStreams(f.h.HTTPHandler()))
	t.Cleanup(srv.Close)
	return srv.URL
}
