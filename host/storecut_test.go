package host_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/host"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// cutStore is a store that, once cut, answers nothing: every exchange
// waits out its deadline, as over a link to Redis blackholed (the fault
// suite's partition-store). With refuse set, a cut store refuses each
// exchange at once instead, as Redis down does (its port closed), and as
// the Redis client goes on doing for up to a second after Redis is back
// (it dials again once a second after a run of refused dials).
type cutStore struct {
	statestore.Store
	cut, refuse atomic.Bool

	mu       sync.Mutex
	answered int           // the replica's heartbeats (rounds and probes) the store answered
	beat     chan struct{} // closed by the next one, once asked for
}

func (s *cutStore) away(ctx context.Context) error {
	if s.refuse.Load() {
		return fmt.Errorf("statestore: redis: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	}
	<-ctx.Done()
	return ctx.Err()
}

func (s *cutStore) Heartbeat(ctx context.Context, o statestore.Owner, ttl time.Duration) error {
	if s.cut.Load() {
		return s.away(ctx)
	}
	err := s.Store.Heartbeat(ctx, o, ttl)
	if err == nil {
		s.mu.Lock()
		s.answered++
		if s.beat != nil {
			close(s.beat)
			s.beat = nil
		}
		s.mu.Unlock()
	}
	return err
}

// heartbeatAnswered is the event of the store answering a heartbeat of
// its replica's: the replica finds it back.
func (s *cutStore) heartbeatAnswered() event {
	return func() func(context.Context) error {
		s.mu.Lock()
		n := s.answered
		s.mu.Unlock()
		return func(ctx context.Context) error {
			for {
				s.mu.Lock()
				if s.answered > n {
					s.mu.Unlock()
					return nil
				}
				if s.beat == nil {
					s.beat = make(chan struct{})
				}
				beat := s.beat
				s.mu.Unlock()
				select {
				case <-beat:
				case <-ctx.Done():
					return fmt.Errorf("waiting for the store to answer a heartbeat: %w", ctx.Err())
				}
			}
		}
	}
}

func (s *cutStore) Leave(ctx context.Context, o statestore.Owner) error {
	if s.cut.Load() {
		return s.away(ctx)
	}
	return s.Store.Leave(ctx, o)
}

func (s *cutStore) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	if s.cut.Load() {
		return statestore.Claim{}, s.away(ctx)
	}
	return s.Store.Claim(ctx, id, o, ttl, steal)
}

func (s *cutStore) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	if s.cut.Load() {
		return s.away(ctx)
	}
	return s.Store.Put(ctx, id, field, value, fence, ttl)
}

func (s *cutStore) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	if s.cut.Load() {
		return 0, s.away(ctx)
	}
	return s.Store.Renew(ctx, id, fence, ttl, bump)
}

func (s *cutStore) Get(ctx context.Context, id string) (map[string][]byte, error) {
	if s.cut.Load() {
		return nil, s.away(ctx)
	}
	return s.Store.Get(ctx, id)
}

func (s *cutStore) Release(ctx context.Context, id string, fence uint64) error {
	if s.cut.Load() {
		return s.away(ctx)
	}
	return s.Store.Release(ctx, id, fence)
}

func (s *cutStore) Delete(ctx context.Context, id string, fence uint64) error {
	if s.cut.Load() {
		return s.away(ctx)
	}
	return s.Store.Delete(ctx, id, fence)
}

// failover is a proxy in a test that does what deploy/haproxy.cfg and
// deploy/nginx.conf do with a 503 (a request refused before it ran): it
// sends the request again to the session's fallback, once.
type failover struct {
	to, next *replica
	mu       sync.Mutex
	refused  int // 503s of to, sent again to next
}

func (f *failover) send(to *replica, req *http.Request, body []byte) (*http.Response, error) {
	u, _ := url.Parse(to.srv.URL)
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = u.Scheme, u.Host, u.Host
	req.Body = io.NopCloser(bytes.NewReader(body))
	req.ContentLength = int64(len(body))
	return http.DefaultTransport.RoundTrip(req)
}

func (f *failover) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	res, err := f.send(f.to, req, body)
	if err != nil || res.StatusCode != http.StatusServiceUnavailable {
		return res, err
	}
	res.Body.Close()
	f.mu.Lock()
	f.refused++
	f.mu.Unlock()
	return f.send(f.next, req, body)
}

func (f *failover) refusals() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// cutPair is replicas a and b of the notes example on one memory store,
// each seen through a cutStore of its own (atA, atB), a failover proxy
// from a to b, and a client through it, whose first note ("one") a saved
// (first); their logs are shown if the test fails.
type cutPair struct {
	shared   *statestore.Memory
	atA, atB *cutStore
	a, b     *replica
	proxy    *failover
	cs       *mcp.ClientSession
	first    *mcp.CallToolResult
}

// newCutPair makes a cutPair whose replicas run with opts (their name
// and store set), its client negotiating protocol.
func newCutPair(t *testing.T, protocol string, opts host.Options) *cutPair {
	t.Helper()
	p := &cutPair{shared: statestore.NewMemory()}
	p.atA, p.atB = &cutStore{Store: p.shared}, &cutStore{Store: p.shared}
	files := map[string]string{"notes.wasm": testplugins.Example(t, "notes")}
	serve := func(name string, store statestore.Store) *replica {
		o := opts
		o.Replica, o.Store = name, store
		return replicaWith(t, o, sandbox.NewPolicy(), files)
	}
	p.a, p.b = serve("a", p.atA), serve("b", p.atB)
	logsOnFailure(t, p.a, p.b)
	p.proxy = &failover{to: p.a, next: p.b}
	p.cs = connectHTTP(t, p.a.srv.URL, protocol, p.proxy)
	p.cs.ListTools(context.Background(), nil) // a 2026-07-28 client learns to mirror the handle into its header
	p.first = call(t, p.cs, "note_add", map[string]any{"text": "one"})
	if p.first.IsError || p.first.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("a: %v %s", p.first.Meta, text(p.first))
	}
	return p
}

// args are a tool call's arguments kv (name, value, ...), with the
// session's handle where the protocol has no session (2026-07-28).
func (p *cutPair) args(kv ...any) map[string]any {
	m := map[string]any{}
	if handle, _ := p.first.Meta[host.MetaSession].(string); handle != "" {
		m[host.SessionArgument] = handle
	}
	for i := 0; i < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	return m
}

// sessionLost reports whether err is the client's session ended: a
// replica that does not know it answered a 2025-11-25 session 404.
func sessionLost(err error) bool {
	return err != nil && (errors.Is(err, mcp.ErrSessionMissing) || strings.Contains(err.Error(), "session not found"))
}

// downPastGrace takes the store down for both replicas, as Redis down
// (each exchange refused at once), and waits for a's second heartbeat
// round refused, past its grace (2 s from the claim verified before the
// store went down; rounds are 2 s apart): the session's call fails now,
// and does not find the session ended. No call ran from memory within
// the grace, so a has nothing to save again meanwhile.
func (p *cutPair) downPastGrace(t *testing.T) {
	t.Helper()
	for _, s := range []*cutStore{p.atA, p.atB} {
		s.refuse.Store(true)
		s.cut.Store(true)
	}
	p.a.waitLog(t, "state store heartbeat", 2)
	res, err := p.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if sessionLost(err) || err == nil && !res.IsError {
		t.Fatalf("the session's call past a's grace, the store down: %s; want it failed", outcome(res, err))
	}
}

// sentElsewhere adds note text through the client, as a client told
// -32053 retries, at each of a's heartbeat rounds, until it is served
// and saved: a, cut off from the store past its grace, refused it to the
// proxy, and b took the session over (a call that reaches a before it
// has recorded that round is refused by a itself).
func (p *cutPair) sentElsewhere(t *testing.T, text string) {
	t.Helper()
	retryOn(t, "the session's calls still fail 30 s into a's partition", p.a.logged("state store heartbeat"), func() (bool, string) {
		res, err := p.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add", Arguments: p.args("text", text)})
		if err == nil && !res.IsError && res.Meta[host.MetaNotSaved] == nil {
			return true, ""
		}
		return false, fmt.Sprintf("(a refused %d to the proxy) %s", p.proxy.refusals(), outcome(res, err))
	})
	if p.proxy.refusals() == 0 {
		t.Error("a refused nothing to the proxy")
	}
	p.b.waitLog(t, "session taken over", 1)
}

// servedOnceBack lists the session's notes through the client, as a
// client told -32053 retries, until a finds the store back (what), and
// wants one among them, which a may have to write back from memory. An
// error other than the store's refusal fails the test (the session
// ended, say).
func (p *cutPair) servedOnceBack(t *testing.T, what string) {
	t.Helper()
	retryOn(t, what, storeBackAt(p.a, p.atA), func() (bool, string) {
		res, err := p.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
		if err == nil && !res.IsError {
			if got := text(res); !strings.Contains(got, "one") {
				t.Fatalf("%s: %q; want one", what, got)
			}
			return true, ""
		}
		if err != nil && !strings.Contains(err.Error(), "-32053") && !strings.Contains(err.Error(), "state store") {
			t.Fatalf("%s: %v", what, err)
		}
		return false, outcome(res, err)
	})
}

// An event is what a test waits for where it would otherwise sleep:
// calling it marks the moment, and the wait it returns returns once the
// event happened after that moment, or fails when ctx ends.
type event func() (wait func(ctx context.Context) error)

// logged is the event of r logging a line that holds msg.
func (r *replica) logged(msg string) event {
	return func() func(context.Context) error {
		n := strings.Count(r.log.String(), msg)
		return func(ctx context.Context) error {
			for {
				next := r.log.next()
				if strings.Count(r.log.String(), msg) > n {
					return nil
				}
				select {
				case <-next:
				case <-ctx.Done():
					return fmt.Errorf("waiting for %s to log %q: %w", r.name, msg, ctx.Err())
				}
			}
		}
	}
}

// storeBackAt is the event of r finding its store back: the store
// answers r's heartbeat through s, and r's breaker is closed (it asks
// the store again), so a call r refused for want of the store may now
// be served.
func storeBackAt(r *replica, s *cutStore) event {
	return func() func(context.Context) error {
		answered := s.heartbeatAnswered()()
		return func(ctx context.Context) error {
			if err := answered(ctx); err != nil {
				return err
			}
			return r.h.WaitStore(ctx)
		}
	}
}

// retryOn runs try, as a client told to try again does, until try reports
// it done. Between tries it waits for next to happen after the last try
// began, the event that may change the outcome, not for a fixed backoff;
// 30 s on, it fails the test with what, and what the last try said.
func retryOn(t *testing.T, what string, next event, try func() (done bool, said string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		wait := next()
		done, said := try()
		if done {
			return
		}
		if err := wait(ctx); err != nil {
			t.Fatalf("%s (%v): %s", what, err, said)
		}
	}
}

// outcome is what a call said: its error, or its result's text.
func outcome(res *mcp.CallToolResult, err error) string {
	if err != nil {
		return err.Error()
	}
	return text(res)
}

// A replica cut off from the state store alone (the proxy and the other
// replicas reach it and the store) stays ready: it cannot tell this from
// a store down for every replica, when failing readiness everywhere would
// leave the proxy no replica at all. Past its 2 s of grace from memory it
// refuses the calls of a session it holds with HTTP 503, before anything
// runs, so that the proxy sends each to another replica, which reaches
// the store and takes the session over. Until now it answered them
// -32053 in an HTTP 200, which no proxy retries: its clients failed for
// as long as the partition lasted (the fault suite's partition-store had
// to fail it over by refusing its port).
func TestCutOffReplicaSendsSessionsElsewhere(t *testing.T) {
	for _, protocol := range protocols {
		t.Run("protocol="+cmpOr(protocol, "default"), func(t *testing.T) { cutOffSendsElsewhere(t, protocol) })
	}
}

func cutOffSendsElsewhere(t *testing.T, protocol string) {
	p := newCutPair(t, protocol, host.Options{})
	a := p.a
	p.atA.cut.Store(true)
	a.waitLog(t, "state store heartbeat", 1)
	if code, _ := readyz(t, a); code != http.StatusOK {
		t.Errorf("a cut off from the store answers /readyz %d; want it ready (it cannot tell a store down for all)", code)
	}
	// a's first heartbeat round after the cut ends unanswered 2 s on,
	// past its grace: a refuses the call to the proxy, and b takes the
	// session over.
	p.sentElsewhere(t, "two")
	if got := text(call(t, p.cs, "note_list", p.args())); !strings.Contains(got, "one") || !strings.Contains(got, "two") {
		t.Errorf("after the takeover: %q; want one and two", got)
	}
}

// readyz returns r's /readyz status and body.
func readyz(t *testing.T, r *replica) (int, string) {
	t.Helper()
	res, err := http.Get(r.srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// The opposite case: the store away for every replica. A replica cannot
// tell it from being cut off alone, and stays ready; what it refuses to
// the proxy, the other refuses too, and the client retries: no session
// is ended (the other replica answered 404 to a session it could not
// read from the store, which ends it at the client), and what memory can
// still serve is served (a session begun during the outage).
func TestStoreAwayForAllEndsNoSession(t *testing.T) {
	p := newCutPair(t, "2025-11-25", host.Options{})
	a, b, cs, proxy, atA, atB := p.a, p.b, p.cs, p.proxy, p.atA, p.atB
	atA.cut.Store(true)
	atB.cut.Store(true)
	a.waitLog(t, "state store heartbeat", 1)
	b.waitLog(t, "state store heartbeat", 1)
	if code, _ := readyz(t, a); code != http.StatusOK {
		t.Errorf("a, the store away, answers /readyz %d; want it ready", code)
	}
	// Past a's grace (its heartbeat round ended unanswered 2 s after the
	// cut, after the call), a refuses the call to the proxy, and b refuses
	// it too; the client retries at each of a's heartbeat rounds until a
	// has refused one to the proxy.
	retryOn(t, "a refused nothing to the proxy 30 s into the outage", a.logged("state store heartbeat"), func() (bool, string) {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add", Arguments: map[string]any{"text": "two"}})
		if err == nil {
			t.Fatal("a call served with the store away for every replica, past the grace")
		}
		return proxy.refusals() > 0, err.Error()
	})
	// A session begun now goes on from a's memory.
	fresh := connectHTTP(t, a.srv.URL, "2025-11-25", nil)
	if res := call(t, fresh, "note_add", map[string]any{"text": "from memory"}); res.IsError || res.Meta[host.MetaNotSaved] == nil {
		t.Errorf("a session begun during the outage: %v %s; want it served, marked notSaved", res.Meta, text(res))
	}
	atA.cut.Store(false)
	atB.cut.Store(false)
	p.servedOnceBack(t, "the session after the outage")
}

// A store that comes back empty holds nothing of a session but what its
// replica holds: that replica, its last heartbeat round still failed,
// must not send the session's call elsewhere, where the session is
// unknown (a 2025-11-25 session answered 404), but find the store back
// and write the session back from memory. It asks the store before it
// refuses; trusting the last heartbeat round lost five sessions in the
// fault suite's redis-down-10s.
func TestStoreBackEmptyKeepsSessionHere(t *testing.T) {
	p := newCutPair(t, "2025-11-25", host.Options{})
	a, cs, proxy, atA, atB := p.a, p.cs, p.proxy, p.atA, p.atB
	atA.cut.Store(true)
	atB.cut.Store(true)
	a.waitLog(t, "state store heartbeat", 1)
	// Past a's grace, as in TestStoreAwayForAllEndsNoSession.
	retryOn(t, "a refused nothing to the proxy 30 s into the outage", a.logged("state store heartbeat"), func() (bool, string) {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
		return proxy.refusals() > 0, outcome(res, err)
	})
	// Back empty, before a's next heartbeat round (2 s apart).
	p.shared.Flush()
	atA.cut.Store(false)
	atB.cut.Store(false)
	p.servedOnceBack(t, "the session after the store came back empty")
}

// Redis down, then back empty: its replicas do not all reach it again at
// once (the Redis client of each dials again once a second after a run of
// refused dials). A replica still refused must not send the call of a
// session it holds elsewhere, where the store, back empty, holds nothing
// of it: the other replica answers a 2025-11-25 session 404, which ends
// it at the client (the fault suite's redis-down-10s: session-lost, a
// session of s3's refused with 503 by s3 0.8 s after Redis came back).
// It answers -32053 as before, and once it reaches the store writes the
// session back from memory. Nor is a session begun during the outage,
// which the store never held, sent elsewhere: it is served from memory.
func TestStoreDownBackEmptyKeepsSessionHere(t *testing.T) {
	p := newCutPair(t, "2025-11-25", host.Options{})
	a, b, cs, proxy, atA, atB := p.a, p.b, p.cs, p.proxy, p.atA, p.atB
	p.downPastGrace(t)
	fresh := connectHTTP(t, a.srv.URL, "2025-11-25", &failover{to: a, next: b})
	if res := call(t, fresh, "note_add", map[string]any{"text": "from memory"}); res.IsError || res.Meta[host.MetaNotSaved] == nil {
		t.Fatalf("a session begun during the outage: %v %s; want it served, marked notSaved", res.Meta, text(res))
	}
	// Back empty: b reaches it, a is refused a while longer.
	p.shared.Flush()
	atB.cut.Store(false)
	b.waitLog(t, "state store came back empty", 1)
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"}); sessionLost(err) {
		t.Fatalf("a session of a's, the store back empty and a still refused (a refused %d to the proxy): %v", proxy.refusals(), err)
	}
	if res, err := fresh.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"}); err != nil || res.IsError || !strings.Contains(text(res), "from memory") {
		t.Fatalf("a session begun during the outage, a still refused: %v %v", res, err)
	}
	atA.cut.Store(false)
	p.servedOnceBack(t, "the session once a reaches the store")
}

// Redis down, then silent for a: its connections to a Redis back meet
// nothing (a link blackholed, a store frozen), while b, which reaches it,
// finds it back empty. a's probe now times out, which alone would have it
// hand the session over; but the store refused a connection of a's since
// it last answered a's heartbeat, so it may have come back empty, as it
// has: b would not find the session (a 2025-11-25 session answered 404,
// which ends it at the client). a refuses the call itself (-32053) until
// it reaches the store, and writes the session back from memory. Once the
// store answered a heartbeat of a's, the refusals are past: a later
// silence hands the session over, as in
// TestCutOffReplicaSendsSessionsElsewhere.
func TestStoreRefusedThenSilentKeepsSessionHere(t *testing.T) {
	p := newCutPair(t, "2025-11-25", host.Options{})
	a, b, cs, proxy, atA := p.a, p.b, p.cs, p.proxy, p.atA
	p.downPastGrace(t)
	// Back empty: b reaches it; a's exchanges time out now, its heartbeat
	// round too, and none of its rounds was answered since the refusals.
	p.shared.Flush()
	p.atB.cut.Store(false)
	atA.refuse.Store(false)
	b.waitLog(t, "state store came back empty", 1)
	a.waitLog(t, "context deadline exceeded", 1)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_list"})
	if n := proxy.refusals(); n > 0 || err == nil || !strings.Contains(err.Error(), "state unavailable") {
		t.Fatalf("a session of a's, the store refused then silent for a (a refused %d to the proxy): %s; want a's own refusal, -32053", n, outcome(res, err))
	}
	atA.cut.Store(false)
	p.servedOnceBack(t, "the session once a reaches the store")
	if n := proxy.refusals(); n > 0 {
		t.Fatalf("a refused %d to the proxy, the store refused then silent for a", n)
	}
	// a's heartbeat round answered (it saw the new epoch), and the
	// session saved again: a silence now is only that.
	a.waitLog(t, "state store came back empty", 1)
	if res := call(t, cs, "note_add", p.args("text", "two")); res.IsError || res.Meta[host.MetaNotSaved] != nil {
		t.Fatalf("a, the store back: %v %s", res.Meta, text(res))
	}
	atA.cut.Store(true)
	p.sentElsewhere(t, "three")
	if got := text(call(t, cs, "note_list", nil)); !strings.Contains(got, "one") || !strings.Contains(got, "two") || !strings.Contains(got, "three") {
		t.Errorf("after the takeover: %q; want one, two and three", got)
	}
}

// With --checkpoint drain a call's state is written only at drain, and no
// result says notSaved: what a session did since its last drain is in
// this replica's memory alone. A replica cut off from the store must not
// hand such a session to another replica, which would take it over from
// the record and silently lose every call since (a refusal -32053 until
// the store answers again, as before, keeps them).
func TestCutOffDrainPolicyKeepsSessionHere(t *testing.T) {
	p := newCutPair(t, "2025-11-25", host.Options{Checkpoint: host.CheckpointOnDrain})
	a, cs, proxy, atA := p.a, p.cs, p.proxy, p.atA
	atA.cut.Store(true)
	a.waitLog(t, "state store heartbeat", 1)
	// Until a refuses a call itself past its grace (-32053), or hands
	// one to the proxy: the client calls again at each of a's heartbeat
	// rounds.
	retryOn(t, "30 s into a's partition, a neither refused a call nor handed one over", a.logged("state store heartbeat"), func() (bool, string) {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "note_add", Arguments: map[string]any{"text": "two"}})
		refused := err != nil && (strings.Contains(err.Error(), "-32053") || strings.Contains(err.Error(), "state unavailable"))
		return refused || proxy.refusals() > 0, outcome(res, err)
	})
	if proxy.refusals() > 0 {
		t.Fatalf("a handed over to b (503 to the proxy) a session whose calls since its last drain are in a's memory only")
	}
}
