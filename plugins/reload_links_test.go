package plugins_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// swapLink points link at target the way deploy tools do, atomically: a
// new link under a temporary name renamed over the old one.
func swapLink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + "_tmp"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// k8sWrite updates dir the way Kubernetes' atomic writer updates a
// ConfigMap, Secret or projected volume: the files go into a new hidden
// folder, "..data" is swapped to it, each file is a link to "..data/NAME"
// (made the first time), and the old folder is removed.
func k8sWrite(t *testing.T, dir, version string, files map[string][]byte) {
	t.Helper()
	ts := "..2026_12_06_" + version
	if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range files {
		write(t, filepath.Join(dir, ts, name), b)
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	swapLink(t, ts, filepath.Join(dir, "..data"))
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); os.IsNotExist(err) {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		os.RemoveAll(filepath.Join(dir, old))
	}
}

// TestWatchKubernetesVolumeUpdate: a plugin served from a ConfigMap (or
// any volume Kubernetes' atomic writer updates) is reloaded when the
// ConfigMap changes, though no event names the plugin's file: only the
// "..data" link is replaced.
func TestWatchKubernetesVolumeUpdate(t *testing.T) {
	dir := t.TempDir()
	r, _ := watchFixture(t, dir, plugins.ReloaderOptions{})
	v1, v2 := versions(t)
	k8sWrite(t, dir, "1", map[string][]byte{"versioned.wasm": v1})
	waitFor(t, "v1 from the volume", func() bool {
		p := r.Catalogue().Plugins()
		return len(p) == 1 && p[0].SHA256() == shaHex(v1)
	})
	k8sWrite(t, dir, "2", map[string][]byte{"versioned.wasm": v2})
	waitFor(t, "v2 after the volume's update", func() bool {
		p := r.Catalogue().Plugins()
		return len(p) == 1 && p[0].SHA256() == shaHex(v2)
	})
}

// TestWatchLinkedFolderSwap: a plugin folder served through a link
// ("current" pointing at a release folder, or git-sync's --link) follows
// the link when it is moved to another release, and then watches the new
// release, not the old.
func TestWatchLinkedFolderSwap(t *testing.T) {
	// "current/" too, as a shell's completion gives it: lstat of
	// "current/" follows the link, so the path was not taken for one.
	for _, suffix := range []string{"", string(filepath.Separator)} {
		t.Run("path=current"+suffix, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range []string{"r1", "r2"} {
				if err := os.Mkdir(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			current := filepath.Join(root, "current")
			if err := os.Symlink("r1", current); err != nil {
				t.Fatal(err)
			}
			r, _ := watchFixture(t, current+suffix, plugins.ReloaderOptions{})
			v1, v2 := versions(t)
			deploy(t, filepath.Join(current, "versioned.wasm"), v1)
			sha := func(want []byte) func() bool {
				return func() bool {
					p := r.Catalogue().Plugins()
					return len(p) == 1 && p[0].SHA256() == shaHex(want)
				}
			}
			waitFor(t, "v1 in r1", sha(v1))
			write(t, filepath.Join(root, "r2", "versioned.wasm"), v2)
			swapLink(t, "r2", current)
			waitFor(t, "v2 once current points at r2", sha(v2))
			// The watch moved with the link: a change in r2 is seen, and the
			// removal of r1 stops nothing.
			deploy(t, filepath.Join(root, "r2", "versioned.wasm"), v1)
			waitFor(t, "v1 deployed into r2", sha(v1))
			if err := os.RemoveAll(filepath.Join(root, "r1")); err != nil {
				t.Fatal(err)
			}
			deploy(t, filepath.Join(current, "versioned.wasm"), v2)
			waitFor(t, "v2 deployed through the link", sha(v2))
		})
	}
}

// TestWatchBesideMissingPath: a path served that is missing (a typo, a
// volume not mounted yet) is said and skipped; the other folders are
// still followed (it turned hot reload off for all of them).
func TestWatchBesideMissingPath(t *testing.T) {
	dir := t.TempDir()
	r, _ := watchFixture(t, dir, plugins.ReloaderOptions{Paths: []string{filepath.Join(t.TempDir(), "missing")}})
	v1, _ := versions(t)
	deploy(t, filepath.Join(dir, "versioned.wasm"), v1)
	waitFor(t, "the plugin dropped beside the missing path", func() bool { return len(r.Catalogue().Plugins()) == 1 })
}

// TestCollisionDecidedByOrder: two new files claiming one name in one
// rescan: the first in the paths' order is served, whichever loads first,
// so that which code answers does not change between starts (it was the
// first to load; a user saw it change over four restarts). Here the later
// file is made to load first.
func TestCollisionDecidedByOrder(t *testing.T) {
	v1, v2 := versions(t)
	dir := t.TempDir()
	first, second := filepath.Join(dir, "a.wasm"), filepath.Join(dir, "b.wasm")
	write(t, first, v1)
	write(t, second, v2) // the same names: tool "version"
	secondServed := make(chan struct{})
	var once sync.Once
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}, Check: func(path string, _ []byte) error {
		if path == first {
			select {
			case <-secondServed:
			case <-time.After(waitTimeout):
				t.Error("b was never served first")
			}
		}
		return nil
	}})
	ctx := context.Background()
	defer r.Close(ctx)
	r.OnSwap(func(ctx context.Context, s plugins.Swap) {
		if slices.ContainsFunc(s.Next.Plugins(), func(p *plugins.Plugin) bool { return p.Path() == second }) {
			once.Do(func() { close(secondServed) })
		}
		for _, p := range s.Removed {
			p.Close(ctx)
		}
	})
	r.Load(ctx)
	ps := r.Catalogue().Plugins()
	if len(ps) != 1 || ps[0].Path() != first {
		t.Fatalf("served %v, want a.wasm alone", ps)
	}
	if s := status(r, "b"); s.State != plugins.StateError || !strings.Contains(s.Error, "comes first in the served paths' order") {
		t.Errorf("b: %+v", s)
	}
	// Not compiled again at the next rescan: refused until a plugin goes
	// or changes.
	if changed, errs := r.Rescan(ctx); changed || len(errs) != 0 {
		t.Errorf("rescan with nothing changed: changed %v, errors %v", changed, errs)
	}
}

// TestCollisionChainDecidedByOrder: three new files of one rescan, a
// (grants: fetch, ...), b (grantask: fetch, secret) and c (hyperhost:
// secret, ...): in the paths' order a takes "fetch", b is refused, and c,
// which collides only with b, is served. Served in the order a, b, c
// (or a, c, b) that is what a start gives; in the order c, b, a, b
// displaces c and a then displaces b, and c, refused for a name no plugin
// served holds any more, stays unserved until some later rescan: which
// plugins a start serves still depends on which loads first.
func TestCollisionChainDecidedByOrder(t *testing.T) {
	dir := t.TempDir()
	a, b, c := filepath.Join(dir, "a.wasm"), filepath.Join(dir, "b.wasm"), filepath.Join(dir, "c.wasm")
	write(t, a, testplugins.Bytes(t, testplugins.Test(t, "grants")))
	write(t, b, testplugins.Bytes(t, testplugins.Test(t, "grantask")))
	write(t, c, testplugins.Bytes(t, testplugins.Test(t, "hyperhost")))
	served := map[string]chan struct{}{a: make(chan struct{}), b: make(chan struct{}), c: make(chan struct{})}
	var mu sync.Mutex
	closed := map[string]bool{}
	after := map[string]string{a: b, b: c} // a loads once b is served, b once c is
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}, Check: func(path string, _ []byte) error {
		if wait, ok := after[path]; ok {
			select {
			case <-served[wait]:
			case <-time.After(waitTimeout):
				t.Errorf("%s was never served", wait)
			}
		}
		return nil
	}})
	ctx := context.Background()
	defer r.Close(ctx)
	r.OnSwap(func(ctx context.Context, s plugins.Swap) {
		mu.Lock()
		for _, p := range s.Next.Plugins() {
			if ch := served[p.Path()]; ch != nil && !closed[p.Path()] {
				closed[p.Path()] = true
				close(ch)
			}
		}
		mu.Unlock()
		for _, p := range s.Removed {
			p.Close(ctx)
		}
	})
	r.Load(ctx)
	var got []string
	for _, p := range r.Catalogue().Plugins() {
		got = append(got, filepath.Base(p.Path()))
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"a.wasm", "c.wasm"}) {
		t.Errorf("served %v, want [a.wasm c.wasm] (what the paths' order gives); c: %+v", got, status(r, "c"))
	}
}

// TestWatchLinkedFolderDanglingAtStart: the folder served is a link whose
// target is not there yet when the server starts (a release link, or
// git-sync's, made before the release is in place). Its parent is watched
// for the link's moves, but the path, not watchable itself, was skipped:
// as the only path it turned hot reload off altogether ("none can be
// watched"), and beside others its target, once there, was watched
// without being taken for a served folder (changes in it ignored).
func TestWatchLinkedFolderDanglingAtStart(t *testing.T) {
	root := t.TempDir()
	current := filepath.Join(root, "current")
	if err := os.Symlink("r1", current); err != nil { // r1 comes later
		t.Fatal(err)
	}
	other := t.TempDir() // a second path, so that the watch starts at all
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{current, other}})
	var sw swaps
	r.OnSwap(sw.on)
	ctx, cancel := context.WithCancel(context.Background())
	r.Load(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx) }()
	t.Cleanup(func() { cancel(); <-done; r.Close(context.Background()) })
	v1, v2 := versions(t)
	if err := os.Mkdir(filepath.Join(root, "r1"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(root, "r1", "versioned.wasm"), v1)
	sha := func(want []byte) func() bool {
		return func() bool {
			p := r.Catalogue().Plugins()
			return len(p) == 1 && p[0].SHA256() == shaHex(want)
		}
	}
	// The watch gives no sign that it started: move the link until seen.
	deadline := time.Now().Add(waitTimeout)
	for !sha(v1)() {
		if time.Now().After(deadline) {
			t.Fatal("the link made to point at r1 was never followed")
		}
		swapLink(t, "r1", current)
		poll(time.Second, sha(v1))
	}
	deploy(t, filepath.Join(current, "versioned.wasm"), v2)
	if !poll(5*time.Second, sha(v2)) {
		t.Fatalf("v2 deployed into the linked folder not seen")
	}
}
