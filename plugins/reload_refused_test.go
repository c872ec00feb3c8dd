package plugins_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// a bad version is refused (status error, the old version serving);
// the operator then puts the served version's bytes back. The file on
// disk is the version served, but the status stays "error" with the bad
// version's message for good: loadIfChanged returns early on bytes
// already served without clearing the refusal.
func TestStatusAfterRevertToServedBytes(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	v1, _ := versions(t)
	path := filepath.Join(dir, "versioned.wasm")
	write(t, path, v1)
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
	defer r.Close(ctx)
	r.Load(ctx)
	deploy(t, path, []byte("not wasm"))
	r.Rescan(ctx)
	if s := status(r, "versioned"); s.State != plugins.StateError {
		t.Fatalf("after a bad version: %+v", s)
	}
	deploy(t, path, v1) // back to the version served
	r.Rescan(ctx)
	if s := status(r, "versioned"); s.State != plugins.StateLoaded || s.Error != "" {
		t.Errorf("the file is the served version again, status %q, error %q; want loaded", s.State, s.Error)
	}
}

// a new version refused for a name collision is not remembered as
// refused (lastBad is set only by refusals before apply): every later
// rescan, whatever file it was for, reads, compiles and lists it again,
// and reports the same error again; the docs say bytes already refused are
// skipped ("skips bytes it already serves (by sha256) or already
// refused"). Until stop 64 (a red team).
func TestCollisionRefusalIsRemembered(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	hash := testplugins.Bytes(t, testplugins.Example(t, "hash"))
	write(t, filepath.Join(dir, "a.wasm"), counter)
	write(t, filepath.Join(dir, "b.wasm"), hash)
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
	defer r.Close(ctx)
	if _, errs := r.Load(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	write(t, filepath.Join(dir, "a.wasm"), hash) // claims b's tool: refused
	if _, errs := r.Rescan(ctx); len(errs) != 1 {
		t.Fatalf("first rescan: %v", errs)
	}
	before := status(r, "a").LastReload
	_, errs := r.Rescan(ctx) // nothing changed on disk
	if len(errs) != 0 || status(r, "a").LastReload != before {
		t.Errorf("a rescan with nothing changed loaded the refused bytes again: errors %v, lastReload moved %v", errs, status(r, "a").LastReload != before)
	}
	// Once b goes, its tools' names are free: a's new version loads.
	if err := os.Remove(filepath.Join(dir, "b.wasm")); err != nil {
		t.Fatal(err)
	}
	if _, errs := r.Rescan(ctx); len(errs) != 0 {
		t.Fatalf("rescan after b went: %v", errs)
	}
	if s := status(r, "a"); s.State != plugins.StateLoaded || s.SHA256 != fmt.Sprintf("%x", sha256.Sum256(hash)) {
		t.Errorf("after b went, a is %+v; want its new version loaded", s)
	}
}

// the reloader is documented safe for concurrent use, but a rescan
// whose load finishes after Close applies its plugin to the closed
// reloader's nil catalogue (apply does not check r.cat, as Rescan's start
// does): a nil pointer panic, which ends the process when the rescan is
// the watcher's, a SIGHUP's or POST /reload's during shutdown.
func TestRescanAfterCloseDoesNotPanic(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	v1, _ := versions(t)
	write(t, filepath.Join(dir, "versioned.wasm"), v1)
	inCheck, release := make(chan struct{}), make(chan struct{})
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}, Check: func(string, []byte) error {
		close(inCheck)
		<-release // the load is under way, outside the reloader's lock
		return nil
	}})
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		r.Rescan(ctx)
	}()
	<-inCheck
	r.Close(ctx)
	close(release)
	if p := <-panicked; p != nil {
		t.Fatalf("a rescan finishing after Close panicked: %v", p)
	}
}
