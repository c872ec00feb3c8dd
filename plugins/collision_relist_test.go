package plugins_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
)

// A review of stop 64's 824c2c9: a version refused for a name collision is now
// remembered (lastBad/collided) "until a plugin goes or changes", cleared
// only by swapLocked for Removed/Replaced. A relist that drops the
// colliding tool (Reloader.relist sets r.cat itself) frees the name too,
// but the refused version is never tried again: before the fix, the next
// rescan loaded it.
func TestCollisionRetriedAfterRelistFreesName(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	relister := testplugins.Bytes(t, testplugins.Test(t, "relister"))
	hash := testplugins.Bytes(t, testplugins.Example(t, "hash"))
	counter := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	write(t, filepath.Join(dir, "r.wasm"), relister)
	write(t, filepath.Join(dir, "c.wasm"), hash)
	r := plugins.NewReloader(newRuntime(t), plugins.ReloaderOptions{Paths: []string{dir}})
	defer r.Close(ctx)
	if _, errs := r.Load(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	hashTool := status(r, "c").Tools[0]
	write(t, filepath.Join(dir, "c.wasm"), counter)
	if _, errs := r.Rescan(ctx); len(errs) > 0 {
		t.Fatal(errs)
	}
	served := func() *plugins.Plugin {
		for _, p := range r.Catalogue().Plugins() {
			if p.Name() == "r" {
				return p
			}
		}
		t.Fatal("relister not served")
		return nil
	}
	// relister's instance takes hash's tool name.
	inst, err := served().NewInstance(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add, _ := r.Catalogue().Tool("relister_add")
	args, _ := json.Marshal(map[string]any{"name": hashTool})
	if _, err := inst.CallTool(ctx, &plugins.Call{Tool: add, Arguments: args, Host: func(context.Context, string, []byte) ([]byte, error) { return []byte(`{}`), nil }}); err != nil {
		t.Fatal(err)
	}
	if err := r.Relist(ctx, inst); err != nil {
		t.Fatal(err)
	}
	inst.Close(ctx)
	write(t, filepath.Join(dir, "c.wasm"), hash) // collides with relister's tool: refused
	if _, errs := r.Rescan(ctx); len(errs) != 1 {
		t.Fatalf("rescan with the colliding version: %v", errs)
	}
	// A fresh instance's relist drops the tool: the name is free.
	if err := r.RelistFresh(ctx, served()); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Catalogue().Tool(hashTool); ok {
		t.Fatalf("%s still served after the fresh relist", hashTool)
	}
	if _, errs := r.Rescan(ctx); len(errs) != 0 {
		t.Fatalf("rescan after the name was freed: %v", errs)
	}
	if s := status(r, "c"); s.State != plugins.StateLoaded || s.SHA256 != fmt.Sprintf("%x", sha256.Sum256(hash)) {
		t.Errorf("after relister's relist freed %q, c is %s (%q), sha %s: the refused version is never tried again", hashTool, s.State, s.Error, s.SHA256)
	}
}
