package durable

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// lossyStore loses answers on demand: a bump that is applied but whose
// reply is lost, a put that gets no answer, or a store that is down.
type lossyStore struct {
	statestore.Store
	loseBump atomic.Bool  // the next bump is applied, its reply lost
	losePut  atomic.Bool  // the next put is not applied, and gets no answer
	loseNth  atomic.Int32 // the nth put from now is not applied, and gets no answer
	loseGet  atomic.Bool  // the next get gets no answer
	down     atomic.Bool  // every exchange fails without an answer
	// detached counts the puts made under a context only its deadline
	// ends (statestore.DeadlineOnly), attached the others.
	detached, attached atomic.Int32
}

var errNoAnswer = errors.New("no answer (test)")

func (s *lossyStore) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	if s.down.Load() {
		return 0, errNoAnswer
	}
	f, err := s.Store.Renew(ctx, id, fence, ttl, bump)
	if bump && err == nil && s.loseBump.CompareAndSwap(true, false) {
		return 0, errNoAnswer
	}
	return f, err
}

func (s *lossyStore) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) error {
	if statestore.DeadlineOnly(ctx) {
		s.detached.Add(1)
	} else {
		s.attached.Add(1)
	}
	if s.down.Load() || s.losePut.CompareAndSwap(true, false) {
		return errNoAnswer
	}
	if s.loseNth.Load() > 0 && s.loseNth.Add(-1) == 0 {
		return errNoAnswer
	}
	return s.Store.Put(ctx, id, field, v, fence, ttl)
}

func (s *lossyStore) Claim(ctx context.Context, id string, o statestore.Owner, ttl time.Duration, steal bool) (statestore.Claim, error) {
	if s.down.Load() {
		return statestore.Claim{}, errNoAnswer
	}
	return s.Store.Claim(ctx, id, o, ttl, steal)
}

func (s *lossyStore) Get(ctx context.Context, id string) (map[string][]byte, error) {
	if s.down.Load() || s.loseGet.CompareAndSwap(true, false) {
		return nil, errNoAnswer
	}
	return s.Store.Get(ctx, id)
}

type lossyWorld struct {
	t    *testing.T
	ctx  context.Context
	ses  *sessions.Manager
	d    *Keeper
	st   *lossyStore
	key  sessions.Key
	p, q *plugins.Plugin
}

func newLossyWorld(t *testing.T) *lossyWorld { return newLossyWorldWith(t, nil) }

// newLossyWorldWith is newLossyWorld with its sessions' options set by
// opts too (if not nil), given the world: its Stored, set first, is the
// keeper's.
func newLossyWorldWith(t *testing.T, opts func(w *lossyWorld, o *sessions.Options)) *lossyWorld {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	path := testplugins.Example(t, "counter")
	wasm := testplugins.Bytes(t, path)
	load := func(name string) *plugins.Plugin {
		p, err := plugins.Load(ctx, rt, name+".wasm", wasm, plugins.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close(ctx) })
		return p
	}
	w := &lossyWorld{t: t, ctx: ctx, key: sessions.Client("alice"), p: load("p"), q: load("q")}
	o := sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		return w.d.Stored(ctx, key, p) // as the host wires it
	}}
	if opts != nil {
		opts(w, &o)
	}
	w.ses = sessions.New(&o)
	t.Cleanup(func() { w.ses.Close(ctx) })
	w.st = &lossyStore{Store: statestore.NewMemory()}
	w.d = New(Options{Store: w.st, Sessions: w.ses, Replica: "a"})
	return w
}

// count runs the counter's tool on l and returns its count.
func (w *lossyWorld) count(l *sessions.Lease) string {
	w.t.Helper()
	res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: l.Plugin().Tools()[0], Arguments: json.RawMessage(`{}`)})
	if err != nil {
		w.t.Fatal(err)
	}
	var c abi.TextContent
	if err := json.Unmarshal(res.Content[0], &c); err != nil {
		w.t.Fatal(err)
	}
	return c.Text
}

// ageClaim makes c's last verification older than memoryGrace: what a
// replica stopped for a while, or cut off from the store, holds.
func ageClaim(c *Claim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.verified = time.Now().Add(-3 * memoryGrace)
}

// claim is BeforeCall's claim of the world's session, which must succeed.
func (w *lossyWorld) claim() *Claim {
	w.t.Helper()
	c, err := w.d.BeforeCall(w.ctx, w.key)
	if err != nil || c == nil {
		w.t.Fatalf("claim: %v %v", c, err)
	}
	return c
}

// callSaved runs p's counter under c, and its checkpoint, which must
// succeed.
func (w *lossyWorld) callSaved(c *Claim, p *plugins.Plugin) {
	w.t.Helper()
	l := w.acquire(p)
	w.count(l)
	if _, err := w.d.AfterCall(w.ctx, w.key, c, l, nil); err != nil {
		w.t.Fatal(err)
	}
	l.Done(nil)
}

func (w *lossyWorld) acquire(p *plugins.Plugin) *sessions.Lease {
	w.t.Helper()
	l, err := w.ses.Acquire(w.ctx, w.key, p)
	if err != nil {
		w.t.Fatal(err)
	}
	return l
}

// A claim this replica forgot (its call could be neither saved nor
// verified) is not written through by a bump of its, sent again after
// the holder claimed the session anew: a bump whose reply was lost is
// honoured again only with no claim since, the holder's own included.
// With the shortcut kept past the holder's claim, the forgotten claim's
// checkpoint was accepted under the new claim's fence, after the new
// claim had read the record; had the new claim seeded the session from
// it, the call acknowledged would have been lost. Now it fails as moved.
func TestForgottenClaimCannotWriteThroughResentBump(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	cOld := w.claim()
	// q: count 1, saved.
	l := w.acquire(w.q)
	if got := w.count(l); got != "1" {
		t.Fatalf("q: %s", got)
	}
	if _, err := d.AfterCall(ctx, w.key, cOld, l, nil); err != nil {
		t.Fatal(err)
	}
	l.Done(nil)
	// A long call on q starts under cOld (count 2 when it ends).
	lq := w.acquire(w.q)
	// p: a checkpoint gets no answer (dirty) ...
	l = w.acquire(w.p)
	w.count(l)
	w.st.losePut.Store(true)
	if why, err := d.AfterCall(ctx, w.key, cOld, l, nil); err != nil || why != NotSavedUnavailable {
		t.Fatalf("lost put: %q %v", why, err)
	}
	l.Done(nil)
	d.downUntil.Store(0)
	// ... and the next one's bump is applied, its reply lost.
	l = w.acquire(w.p)
	w.count(l)
	w.st.loseBump.Store(true)
	if why, err := d.AfterCall(ctx, w.key, cOld, l, nil); err != nil || why != NotSavedUnavailable {
		t.Fatalf("lost bump: %q %v", why, err)
	}
	l.Done(nil)
	// The breaker is open; a call whose claim was verified more than
	// memoryGrace ago fails unverified, and the claim is forgotten.
	ageClaim(cOld)
	l = w.acquire(w.p)
	w.count(l)
	if _, err := d.AfterCall(ctx, w.key, cOld, l, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("want errUnverified, got %v", err)
	}
	l.Done(sessions.ErrMoved)
	// The store answers again; the next request claims anew (same
	// owner: the fence the lost bump made, and no one claimed since).
	d.downUntil.Store(0)
	cNew, err := d.BeforeCall(ctx, w.key)
	if err != nil || cNew == nil || cNew == cOld {
		t.Fatalf("new claim: %v %v", cNew, err)
	}
	// The long call on q ends, under the forgotten claim.
	if got := w.count(lq); got != "2" {
		t.Fatalf("q: %s", got)
	}
	why, err := d.AfterCall(ctx, w.key, cOld, lq, nil)
	lq.Done(nil)
	if err == nil {
		t.Fatalf("the forgotten claim's bump, sent again after the holder claimed the session anew, was honoured (%q)", why)
	}
	if !errors.Is(err, errMoved) {
		t.Fatalf("want errMoved, got %v", err)
	}
}

// A call served from memory keeps its at-most-once key even when its
// claim is forgotten before the store is back (another call of the
// session, in flight when the store went away, failed unverified): no
// one claimed the session meanwhile, so the next claim goes on from what
// this replica holds, the key with it, and the client's retry gets the
// first result. Before, the key went with the forgotten claim, and the
// retry ran the call a second time on the same instance.
func TestServedFromMemoryKeyOutlivesForgottenClaim(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p)
	// A call on q is in flight under c when the store goes away.
	lq := w.acquire(w.q)
	w.st.down.Store(true)
	// A keyed call on p is served from memory (the claim is fresh).
	m, err := d.BeforeCall(ctx, w.key)
	if !errors.Is(err, ErrServedFromMemory) || m != c {
		t.Fatalf("served from memory: %v %v", m, err)
	}
	l := w.acquire(w.p)
	if got := w.count(l); got != "2" {
		t.Fatalf("p: %s", got)
	}
	first := &Once{Key: "K", Result: json.RawMessage(`{"content":[{"type":"text","text":"2"}]}`)}
	d.ServedFromMemory(w.key, m, w.p.Name(), first)
	l.Done(nil)
	if d.Replay(m, "K") == nil {
		t.Fatal("the key is not kept at all")
	}
	// The call on q ends more than memoryGrace after the last verify:
	// unverified, and the claim is forgotten (as host/call.go does).
	ageClaim(c)
	w.count(lq)
	if _, err := d.AfterCall(ctx, w.key, c, lq, nil); !errors.Is(err, errUnverified) {
		t.Fatalf("want errUnverified, got %v", err)
	}
	lq.Done(sessions.ErrMoved)
	// The store is back; the client retries the keyed call.
	w.st.down.Store(false)
	d.downUntil.Store(0)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("claim after the outage: %v %v", c2, err)
	}
	if d.Replay(c2, "K") == nil {
		l = w.acquire(w.p)
		got := w.count(l)
		l.Done(nil)
		t.Fatalf("the retry of a call served from memory is not answered from its first run: it runs again (count %s)", got)
	}
}

// A bump whose reply is lost without a resend (the exchange's deadline
// fired) leaves the claim at the old fence; at the next request's claim
// the store says no one claimed the session since (Claim.Taken unchanged),
// so the new fence is its own: adopted, and what it holds goes on. Before,
// its own bump was taken for another holder's claim: the claim's unsaved
// notes were cleared and the client re-seeded from the store, and the
// next call ran on the older stored state with no stateReset.
func TestOwnLostBumpIsNotARollback(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	step := func(lose func()) {
		t.Helper()
		l := w.acquire(w.p)
		w.count(l)
		lose()
		if _, err := d.AfterCall(ctx, w.key, c, l, nil); err != nil {
			t.Fatal(err)
		}
		l.Done(nil)
		d.downUntil.Store(0)
	}
	step(func() {})                            // 1, saved
	step(func() { w.st.losePut.Store(true) })  // 2, notSaved
	step(func() { w.st.loseBump.Store(true) }) // 3, notSaved (the bump landed)
	if _, err := d.BeforeCall(ctx, w.key); err != nil {
		t.Fatal(err)
	}
	l := w.acquire(w.p)
	got, n := w.count(l), l.Notice()
	l.Done(nil)
	if got != "4" || n.Reset != nil {
		t.Fatalf("the next call counts %s (stateReset %v); want 4, the instance going on", got, n.Reset)
	}
}

// A forgotten claim is taken up again only if no one claimed the session
// since: another replica's claim between, seen by a take that then failed
// to read the record, ends it, though the store says at the next take that
// this replica holds the session (its own failed take claimed it). Resumed
// then, the instances of before the other replica's claim would be served
// as current.
func TestForgottenClaimNotResumedAfterAnotherClaim(t *testing.T) {
	w := newLossyWorld(t)
	d, ctx := w.d, w.ctx
	c := w.claim()
	w.callSaved(c, w.p)
	d.forget(w.key, c)
	other := statestore.Owner{Replica: "b", Boot: "b"}
	if _, err := w.st.Store.Claim(ctx, StoreID(w.key), other, time.Minute, true); err != nil {
		t.Fatal(err)
	}
	w.st.loseGet.Store(true)
	if _, err := d.BeforeCall(ctx, w.key); err == nil {
		t.Fatal("a take whose read got no answer succeeded")
	}
	d.downUntil.Store(0)
	c2, err := d.BeforeCall(ctx, w.key)
	if err != nil || c2 == nil {
		t.Fatalf("claim after: %v %v", c2, err)
	}
	if f := w.ses.Fence(w.key); f != c2.fence || f == c.seeded {
		t.Fatalf("the client is seeded under %d; want the new claim's %d, not the forgotten one's %d", f, c2.fence, c.seeded)
	}
}
