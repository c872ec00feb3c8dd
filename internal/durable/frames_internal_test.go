package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// notesWorld is a session of the notes example (a Go plugin, whose state
// is large enough to be split) at replica a, over a store that loses
// answers on demand, and a replica b that takes it over.
type notesWorld struct {
	t      *testing.T
	ctx    context.Context
	st     *lossyStore
	key    sessions.Key
	p      *plugins.Plugin
	aSes   *sessions.Manager
	a      *Keeper
	notes  int // notes acknowledged as saved
	lastID string
}

func newNotesWorld(t *testing.T) *notesWorld {
	ctx := context.Background()
	rt, err := sandbox.NewRuntime(sandbox.Options{CacheDir: testplugins.CacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	path := testplugins.Example(t, "notes")
	p, err := plugins.Load(ctx, rt, "notes.wasm", testplugins.Bytes(t, path), plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(ctx) })
	w := &notesWorld{t: t, ctx: ctx, key: sessions.Client("alice"), p: p, st: &lossyStore{Store: statestore.NewMemory()}}
	w.aSes, w.a = w.replica("a")
	return w
}

// replica is a new replica over the world's store.
func (w *notesWorld) replica(name string) (*sessions.Manager, *Keeper) {
	return w.replicaWith(Options{Replica: name})
}

// replicaWith is a new replica with o, over the world's store unless o
// names another.
func (w *notesWorld) replicaWith(o Options) (*sessions.Manager, *Keeper) {
	var d *Keeper
	ses := sessions.New(&sessions.Options{Stored: func(ctx context.Context, key sessions.Key, p *plugins.Plugin) (*plugins.State, string, uint64, bool) {
		return d.Stored(ctx, key, p)
	}})
	w.t.Cleanup(func() { ses.Close(w.ctx) })
	o.Sessions = ses
	if o.Store == nil {
		o.Store = w.st
	}
	d = New(o)
	return ses, d
}

// budgeted makes the world's replica a anew, under a byte budget of limit
// for the session's record.
func (w *notesWorld) budgeted(limit int) *recordBudget {
	b := &recordBudget{limit: limit, fields: map[string]int{}}
	w.aSes, w.a = w.replicaWith(Options{Replica: "a", Reserve: b.reserve, Count: b.count})
	return b
}

// call runs one tool call of the notes plugin at replica d and its
// checkpoint, and returns the text and why its state was not saved.
func (w *notesWorld) call(ses *sessions.Manager, d *Keeper, tool, args string) (string, NotSaved) {
	w.t.Helper()
	c, err := d.BeforeCall(w.ctx, w.key)
	if err != nil || c == nil {
		w.t.Fatalf("claim: %v %v", c, err)
	}
	l, err := ses.Acquire(w.ctx, w.key, w.p)
	if err != nil {
		w.t.Fatal(err)
	}
	var t *plugins.Tool
	for _, x := range w.p.Tools() {
		if x.Name == tool {
			t = x
		}
	}
	res, err := l.Instance().CallTool(l.Context(), &plugins.Call{Tool: t, Arguments: json.RawMessage(args)})
	if err != nil {
		w.t.Fatal(err)
	}
	var text abi.TextContent
	if err := json.Unmarshal(res.Content[0], &text); err != nil {
		w.t.Fatal(err)
	}
	why, err := d.AfterCall(w.ctx, w.key, c, l, nil)
	l.Done(nil)
	if err != nil {
		w.t.Fatalf("checkpoint: %v", err)
	}
	return text.Text, why
}

// add adds a note at a, which must be saved.
func (w *notesWorld) add() {
	w.t.Helper()
	w.notes++
	// Long notes, so that the Go heap grows and the state spreads.
	text := fmt.Sprintf("note %d %s", w.notes, strings.Repeat("x", 200+w.notes*37%900))
	got, why := w.call(w.aSes, w.a, "note_add", fmt.Sprintf(`{"text":%q}`, text))
	if want := fmt.Sprintf("note %d saved", w.notes); got != want || why != "" {
		w.t.Fatalf("add: %q (not saved: %q), want %q", got, why, want)
	}
}

// budgetWorld is a notes session of 30 notes at replica a, under a byte
// budget for its record that holds anything until the test lowers it.
func budgetWorld(t *testing.T) (*notesWorld, *recordBudget, *Keeper, *sessions.Manager) {
	w := newNotesWorld(t)
	budget := w.budgeted(1 << 30)
	for range 30 {
		w.add()
	}
	return w, budget, w.a, w.aSes
}

// wholeNext makes a's next checkpoint write the state whole (its claim
// forgets the base, as after a write that got no answer), under a budget
// that holds the state and half the old base, not both. It returns the
// old base's size.
func (w *notesWorld) wholeNext(budget *recordBudget) (base int) {
	w.t.Helper()
	rec := w.record()
	pr, err := readPlugin(rec, "notes")
	if err != nil {
		w.t.Fatal(err)
	}
	base = len(rec["b/notes"])
	if base < 16<<10 {
		w.t.Fatalf("a base of %d bytes", base)
	}
	c := w.a.claims[w.key]
	c.mu.Lock()
	delete(c.bases, "notes")
	c.mu.Unlock()
	budget.mu.Lock()
	budget.limit = len(pr.Data) + 8<<10 + base/2
	budget.mu.Unlock()
	return base
}

// addLong adds a long note at a, as add does, and returns why its state
// was not saved ("" when it was), with the breaker shut again.
func (w *notesWorld) addLong() NotSaved {
	w.t.Helper()
	w.notes++
	text := fmt.Sprintf("note %d %s", w.notes, strings.Repeat("x", 200+w.notes*37%900))
	_, why := w.call(w.aSes, w.a, "note_add", fmt.Sprintf(`{"text":%q}`, text))
	w.a.downUntil.Store(0)
	return why
}

// wholeBytes is what the state of a's instance takes written whole now.
func (w *notesWorld) wholeBytes() int {
	w.t.Helper()
	l, err := w.aSes.Acquire(w.ctx, w.key, w.p)
	if err != nil {
		w.t.Fatal(err)
	}
	st, err := l.Instance().SaveState(w.ctx)
	l.Done(nil)
	if err != nil {
		w.t.Fatal(err)
	}
	b, err := marshalRecord(nil, pluginRecord{Host: st.Host, SHA256: st.SHA256, Data: st.Bytes()})
	if err != nil {
		w.t.Fatal(err)
	}
	return len(b)
}

// otherFields is what rec's fields but the notes plugin's take.
func otherFields(rec map[string][]byte) int {
	n := 0
	for f, v := range rec {
		if f != "p/notes" && f != "b/notes" {
			n += len(v)
		}
	}
	return n
}

// record is the session's record as the store holds it.
func (w *notesWorld) record() map[string][]byte {
	w.t.Helper()
	rec, err := w.st.Store.Get(w.ctx, StoreID(w.key))
	if err != nil {
		w.t.Fatal(err)
	}
	return rec
}

// checkTakeover has a new replica take the session over and list its
// notes: every note acknowledged is there, in order.
func (w *notesWorld) checkTakeover(name string) {
	w.t.Helper()
	ses, d := w.replica(name) // a has no heartbeat: b takes the session over
	got, why := w.call(ses, d, "note_list", `{}`)
	if why != "" {
		w.t.Fatalf("%s: not saved: %q", name, why)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != w.notes {
		w.t.Fatalf("%s: %d notes after the takeover, want %d: %.200q", name, len(lines), w.notes, got)
	}
	for i, l := range lines {
		if !strings.HasPrefix(l, fmt.Sprintf("%d. note %d ", i+1, i+1)) {
			w.t.Fatalf("%s: line %d is %.80q", name, i+1, l)
		}
	}
}

// A Go plugin's checkpoints write its state whole once, its frames as a
// base beside it, and then only the frames each call changed (with the
// state written whole again, and a new base, when the frames of its own
// grow large); a replica that takes the session over restores every note
// acknowledged.
func TestSplitStateWritesWhatChanged(t *testing.T) {
	w := newNotesWorld(t)
	w.add()
	rec := w.record()
	if _, ok := rec["b/notes"]; !ok {
		t.Fatal("no base written with the first checkpoint")
	}
	if !bytes.HasPrefix(rec["p/notes"], []byte{'w', 't', 'p', 'r', recordVersion}) {
		t.Fatalf("first checkpoint not whole: %q", rec["p/notes"][:5])
	}
	const calls = 60
	split, splitBytes, wholeBytes, bases := 0, 0, 0, 0
	base := rec["b/notes"]
	for range calls {
		w.add()
		rec = w.record()
		p := rec["p/notes"]
		if bytes.HasPrefix(p, []byte{'w', 't', 'p', 'r', splitVersion}) {
			split++
			splitBytes += len(p)
		} else {
			pr, err := readPlugin(rec, "notes")
			if err != nil {
				t.Fatal(err)
			}
			wholeBytes = len(pr.Data)
		}
		if !bytes.Equal(rec["b/notes"], base) {
			bases++
			base = rec["b/notes"]
		}
	}
	t.Logf("%d of %d checkpoints split, %d bytes on average; %d new bases; the state whole: %d bytes", split, calls, splitBytes/max(split, 1), bases, wholeBytes)
	if split < calls*3/4 {
		t.Errorf("%d of %d checkpoints split", split, calls)
	}
	if avg := splitBytes / max(split, 1); wholeBytes > 0 && avg > wholeBytes/2 {
		t.Errorf("a split checkpoint wrote %d bytes on average, the state whole %d", avg, wholeBytes)
	}
	w.checkTakeover("b")
}

// A checkpoint whose write of the plugin's field gets no answer, or of
// the base after it, leaves every stored field readable, and the notes
// acknowledged since are all restored by a replica taking over: the base
// is rewritten only after the state was written whole and answered.
func TestSplitStateLostWrites(t *testing.T) {
	for _, lose := range []string{"state", "base"} {
		t.Run(lose, func(t *testing.T) {
			w := newNotesWorld(t)
			for range 5 {
				w.add()
			}
			// Another note, whose write is lost ...
			w.notes++
			w.st.losePut.Store(true)
			if lose == "base" {
				// ... after a write of the state whole, which a claim
				// that knows no base makes, with the base after it.
				c := w.a.claims[w.key]
				c.mu.Lock()
				delete(c.bases, "notes")
				c.mu.Unlock()
				w.st.losePut.Store(false)
				w.st.loseNth.Store(2)
			}
			got, why := w.call(w.aSes, w.a, "note_add", fmt.Sprintf(`{"text":"note %d x"}`, w.notes))
			if lose == "state" && why != NotSavedUnavailable {
				t.Fatalf("lost write: %q %q", got, why)
			}
			if lose == "base" && why != "" {
				t.Fatalf("lost base: the state written whole was saved, got %q", why)
			}
			w.a.downUntil.Store(0)
			for range 30 {
				w.add()
			}
			w.checkTakeover("b")
		})
	}
}

// A state whose own frames (those not in the base) pass an eighth of a
// large base is written whole, with a new base after it, once the split
// states written against the base have carried twice its bytes; before
// that, only past half of it (a state that changes much of itself every
// call is not written whole at every call). At an eighth or less it is
// written split. (At half the base only, a long session's checkpoints
// wrote twice the bytes: compactShare.)
func TestSplitStateRebasesPastAnEighth(t *testing.T) {
	frame := func(seed, n int) []byte {
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(seed*131 + k*7 + k>>8)
		}
		return b
	}
	const nFrames, size = 40, 8 << 10 // a base of 320 KiB: an eighth is over compactMin
	base := make([][]byte, nFrames)
	for k := range base {
		base[k] = frame(k, size)
	}
	baseBytes := nFrames * size
	for _, tc := range []struct {
		changed   int
		carried   int // bytes carried beside the base before the call
		wantSplit bool
	}{
		{0, 0, true},
		{nFrames / compactShare, 2 * baseBytes, true},     // an eighth exactly
		{nFrames/compactShare + 1, 2 * baseBytes, false},  // past it, a rewrite paid for
		{nFrames/compactShare + 1, 2*baseBytes - 1, true}, // past it, not yet paid for
		{nFrames/2 - 1, 0, true},                          // under half: as before
		{nFrames/2 + 1, 0, false},                         // past half: always
	} {
		c := &Claim{bases: map[string]*storedBase{"p": newStoredBase(marshalBase(base), base, nil)}}
		c.bases["p"].carried = tc.carried
		data := []byte("head")
		var lens []sandbox.Frame
		for k := range nFrames {
			f := base[k]
			if k < tc.changed {
				f = frame(1000+k, size)
			}
			lens = append(lens, sandbox.Frame{Bytes: f, Sum: sandbox.FrameSum(f)})
		}
		st := &plugins.State{Host: true, Data: data, Frames: lens}
		_, newBase, split, err := c.encodePlugin("p", pluginRecord{Host: true}, st, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if split != tc.wantSplit || (newBase != nil) == tc.wantSplit {
			t.Errorf("%d of %d frames changed, %d bytes carried: split %v, a new base %v; want split %v",
				tc.changed, nFrames, tc.carried, split, newBase != nil, tc.wantSplit)
		}
		if want := tc.carried + tc.changed*size; split && c.bases["p"].carried != want {
			t.Errorf("%d frames changed: %d bytes carried after a split write, want %d", tc.changed, c.bases["p"].carried, want)
		}
	}
}
