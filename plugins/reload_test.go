package plugins_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// versions returns the bytes of the versioned test plugin, v1 and v2.
func versions(t testing.TB) ([]byte, []byte) {
	v1 := testplugins.Bytes(t, testplugins.Test(t, "versioned"))
	v2 := bytes.Replace(v1, []byte(`"v1"`), []byte(`"v2"`), 1)
	if bytes.Equal(v1, v2) {
		t.Fatal("could not make v2")
	}
	return v1, v2
}

// swaps records the swaps a reloader makes.
type swaps struct {
	mu  sync.Mutex
	all []plugins.Swap
}

func (s *swaps) on(ctx context.Context, sw plugins.Swap) {
	s.mu.Lock()
	s.all = append(s.all, sw)
	s.mu.Unlock()
	for old := range sw.Replaced {
		old.Close(ctx)
	}
	for _, old := range sw.Removed {
		old.Close(ctx)
	}
}

func (s *swaps) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.all)
}

func (s *swaps) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.all = nil
}

func write(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// deploy writes b to a temporary name and renames it to path: the safe way.
func deploy(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	write(t, tmp, b)
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func status(r *plugins.Reloader, name string) plugins.Status {
	for _, s := range r.Status() {
		if s.Name == name {
			return s
		}
	}
	return plugins.Status{}
}

func TestRescan(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	v1, v2 := versions(t)
	path := filepath.Join(dir, "versioned.wasm")
	write(t, path, v1)
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
	defer r.Close(ctx)
	var sw swaps
	r.OnSwap(sw.on)
	cat, errs := r.Load(ctx)
	if len(errs) > 0 || len(cat.Tools()) != 1 {
		t.Fatalf("load: %v, %d tools", errs, len(cat.Tools()))
	}
	first := cat.Plugins()[0]

	steps := []struct {
		name    string
		act     func()
		changed bool
		state   string // of versioned.wasm after the step
		serving []byte // the version served after, nil for none
		err     string
	}{
		{"unchanged", func() {}, false, plugins.StateLoaded, v1, ""},
		{"same bytes rewritten", func() { write(t, path, v1) }, false, plugins.StateLoaded, v1, ""},
		{"replaced", func() { deploy(t, path, v2) }, true, plugins.StateLoaded, v2, ""},
		{"not wasm", func() { write(t, path, []byte("oops")) }, false, plugins.StateError, v2, "not a WebAssembly module"},
		{"truncated", func() { write(t, path, v1[:len(v1)/2]) }, false, plugins.StateError, v2, "compile"},
		{"fixed", func() { write(t, path, v1) }, true, plugins.StateLoaded, v1, ""},
		{"deleted", func() { os.Remove(path) }, true, "", nil, ""},
		{"back", func() { deploy(t, path, v2) }, true, plugins.StateLoaded, v2, ""},
	}
	for _, st := range steps {
		st.act()
		changed, errs := r.Rescan(ctx)
		if changed != st.changed {
			t.Errorf("%s: changed = %v, want %v", st.name, changed, st.changed)
		}
		s := status(r, "versioned")
		if s.State != st.state || (st.err != "" && !strings.Contains(s.Error, st.err)) || (st.err != "" && len(errs) == 0) {
			t.Errorf("%s: status %+v, errors %v; want state %q, error %q", st.name, s, errs, st.state, st.err)
		}
		cat := r.Catalogue()
		switch {
		case st.serving == nil && len(cat.Plugins()) != 0:
			t.Errorf("%s: still serving %v", st.name, cat.Plugins())
		case st.serving != nil && (len(cat.Plugins()) != 1 || cat.Plugins()[0].SHA256() != sha(st.serving)):
			t.Errorf("%s: serving the wrong version", st.name)
		}
	}
	// The first load, then replaced, fixed, deleted and back.
	if n := sw.count(); n != 5 {
		t.Fatalf("%d swaps, want 5", n)
	}
	if sw.all[1].Replaced[first] == nil {
		t.Error("the second swap does not say v1 was replaced")
	}
	if len(sw.all[3].Removed) != 1 {
		t.Error("the deletion did not remove the plugin")
	}
}

func TestRescanRefusesCollisionAndPin(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	v1, _ := versions(t)
	write(t, filepath.Join(dir, "a.wasm"), v1)
	pinned := errors.New("sha256 does not match the pin")
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}, Check: func(path string, _ []byte) error {
		if filepath.Base(path) == "pinned.wasm" {
			return pinned
		}
		return nil
	}})
	defer r.Close(ctx)
	r.Load(ctx)
	write(t, filepath.Join(dir, "b.wasm"), v1) // the same tool name as a
	write(t, filepath.Join(dir, "pinned.wasm"), v1)
	r.Rescan(ctx)
	if s := status(r, "b"); s.State != plugins.StateError || !strings.Contains(s.Error, `tool name collision: "version" is served by plugin "a"`) {
		t.Errorf("b: %+v", s)
	}
	if s := status(r, "pinned"); s.State != plugins.StateError || !strings.Contains(s.Error, pinned.Error()) {
		t.Errorf("pinned: %+v", s)
	}
	if s := status(r, "a"); s.State != plugins.StateLoaded {
		t.Errorf("a: %+v", s)
	}
}

func sha(b []byte) string { return shaHex(b) }

// watchFixture runs a reloader's Watch, with options opts, on the empty
// folder dir (and opts.Paths after it). It returns once the watch is seen
// to work, with no swaps recorded.
func watchFixture(t *testing.T, dir string, opts plugins.ReloaderOptions) (*plugins.Reloader, *swaps) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	opts.Paths = append([]string{dir}, opts.Paths...)
	r := plugins.NewReloader(newRuntime(t), opts)
	var sw swaps
	r.OnSwap(sw.on)
	r.Load(ctx)
	done := make(chan struct{})
	go func() { r.Watch(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; r.Close(context.Background()) })
	// Watch gives no sign that it has started, and a file renamed in
	// before it has is never seen: deploy a probe until it is loaded,
	// deploying it again each second in case the watch missed it.
	probe := filepath.Join(dir, "probe.wasm")
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	deadline := time.Now().Add(waitTimeout)
	for len(r.Catalogue().Plugins()) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the watch never saw a plugin renamed into %s", dir)
		}
		deploy(t, probe, counter)
		poll(time.Second, func() bool { return len(r.Catalogue().Plugins()) > 0 })
	}
	os.Remove(probe)
	waitFor(t, "the probe to go", func() bool { return len(r.Catalogue().Plugins()) == 0 })
	sw.reset()
	return r, &sw
}

// waitTimeout bounds waiting for a reload: generous, for a loaded machine,
// since a passing test does not wait for it.
const waitTimeout = 30 * time.Second

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if !poll(waitTimeout, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// poll reports whether cond became true within d.
func poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

func TestWatchRenameInAndOut(t *testing.T) {
	dir := t.TempDir()
	r, sw := watchFixture(t, dir, plugins.ReloaderOptions{})
	v1, v2 := versions(t)
	path := filepath.Join(dir, "versioned.wasm")
	deploy(t, path, v1)
	waitFor(t, "the plugin to appear", func() bool { return len(r.Catalogue().Tools()) == 1 })
	deploy(t, path, v2)
	waitFor(t, "v2", func() bool { return r.Catalogue().Plugins()[0].SHA256() == shaHex(v2) })
	os.Rename(path, filepath.Join(dir, "versioned.wasm.off")) // renamed out
	waitFor(t, "the plugin to go", func() bool { return len(r.Catalogue().Tools()) == 0 })
	if n := sw.count(); n != 3 {
		t.Errorf("%d swaps, want 3", n)
	}
}

func TestWatchHalfWrittenFile(t *testing.T) {
	v1, _ := versions(t)
	// A copy tool writes in place, in pieces, pausing between them for
	// less than the settle time of files written in place. The pause is
	// 20ms; a piece's write and sync, measured here on a scratch file, can
	// be slow on a loaded machine, so the settle time is 20 times the
	// slowest pause and piece, and at least the default 250ms.
	const pause = 20 * time.Millisecond
	piece := func(f *os.File, i int) time.Duration {
		start := time.Now()
		f.Write(v1[i:min(i+100, len(v1))])
		f.Sync()
		time.Sleep(pause)
		return time.Since(start)
	}
	scratch, err := os.Create(filepath.Join(t.TempDir(), "scratch"))
	if err != nil {
		t.Fatal(err)
	}
	var slowest time.Duration
	for i := 0; i < min(len(v1), 1000); i += 100 {
		slowest = max(slowest, piece(scratch, i))
	}
	scratch.Close()
	settle := max(250*time.Millisecond, 20*slowest)

	dir := t.TempDir()
	r, sw := watchFixture(t, dir, plugins.ReloaderOptions{SettleWrite: settle})
	path := filepath.Join(dir, "versioned.wasm")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	var longest time.Duration
	for i := 0; i < len(v1); i += 100 {
		longest = max(longest, piece(f, i))
	}
	f.Close()
	if longest >= settle {
		// The watcher rightly read a file quiet for its settle time: what
		// follows would say nothing of the code.
		t.Skipf("a pause between pieces took %v, over the settle time %v: the machine stalled", longest, settle)
	}
	waitFor(t, "the plugin to appear", func() bool { return len(r.Catalogue().Tools()) == 1 })
	if s := status(r, "versioned"); s.State != plugins.StateLoaded {
		t.Errorf("status %+v", s)
	}
	// A late second swap would come one settle time after the last event.
	time.Sleep(settle + 50*time.Millisecond)
	if n := sw.count(); n != 1 {
		t.Errorf("%d swaps, want 1: a half-written file was loaded", n)
	}
	for _, s := range r.Status() {
		if s.Error != "" {
			t.Errorf("an error was recorded: %+v", s)
		}
	}
}

// A new version of a plugin that lists a tool another served plugin (one
// sorted after it) serves is refused, and both go on serving. This once
// refused the other plugin instead, and panicked the watch goroutine.
func TestRescanNewVersionClaimsAnotherPluginsTool(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	hash := testplugins.Bytes(t, testplugins.Example(t, "hash"))
	write(t, filepath.Join(dir, "a.wasm"), counter)
	write(t, filepath.Join(dir, "b.wasm"), hash)
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
	defer r.Close(ctx)
	var sw swaps
	r.OnSwap(sw.on)
	if _, errs := r.Load(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	write(t, filepath.Join(dir, "a.wasm"), hash) // a's new version lists b's tools
	_, errs := r.Rescan(ctx)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), `"hash" is served by plugin "b"`) {
		t.Errorf("errors = %v, want one naming b's tool", errs)
	}
	if s := status(r, "a"); s.State != plugins.StateError || s.SHA256 != sha(counter) {
		t.Errorf("a: %+v, want its old version serving and the error", s)
	}
	if s := status(r, "b"); s.State != plugins.StateLoaded || s.SHA256 != sha(hash) {
		t.Errorf("b: %+v, want it serving", s)
	}
	if tool, ok := r.Catalogue().Tool("hash"); !ok || tool.Plugin().Name() != "b" {
		t.Errorf("tool hash served by %v", tool)
	}
	if _, ok := r.Catalogue().Tool("count"); !ok {
		t.Error("a's old version stopped serving count")
	}
}

// Relists go through the reloader: one that changes nothing swaps
// nothing, and a guest relisting on every call is limited.
func TestRelistIsLimited(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write(t, filepath.Join(dir, "relister.wasm"), testplugins.Bytes(t, testplugins.Test(t, "relister")))
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
	defer r.Close(ctx)
	var sw swaps
	r.OnSwap(sw.on)
	cat, errs := r.Load(ctx)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	inst, err := cat.Plugins()[0].NewInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	swapsBefore := sw.count()
	limited := 0
	for range 50 {
		err := r.Relist(ctx, inst)
		switch {
		case errors.Is(err, plugins.ErrRelistLimited):
			limited++
		case err != nil:
			t.Fatal(err)
		}
	}
	if sw.count() != swapsBefore {
		t.Errorf("relists that changed nothing made %d swaps", sw.count()-swapsBefore)
	}
	if limited == 0 {
		t.Errorf("50 relists in a row: none limited (burst %d, then one per %s)", plugins.RelistBurst, plugins.RelistInterval)
	}
}
