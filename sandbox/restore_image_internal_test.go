package sandbox

import (
	"bytes"
	"context"
	"os"
	"testing"
)

// TestRestoreOnImageBase: the pages the image changed from the module's
// initial memory, which a snapshot does not hold (its state has them as
// they were before the initialisation), are put back to the initial
// memory: a state of the image's size holding no page restores, onto the
// image, as the uninitialised memory grown to that size, not as the
// image. (No tool of a test plugin can build such a state, so the test
// builds it here.)
func TestRestoreOnImageBase(t *testing.T) {
	wasm, err := os.ReadFile("../internal/testplugins/dist/hostileimage.wasm")
	if err != nil {
		t.Fatalf("%v (make testplugins builds it)", err)
	}
	ctx := context.Background()
	rt, err := NewRuntime(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	c, err := rt.Compile(ctx, wasm, NewPolicy().WithMemoryLimit(8<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	first, err := c.Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first.Close(ctx)
	img := c.imageFor()
	if img == nil || img.state.pages < 2 {
		t.Fatal("no image of several pages")
	}
	bare, err := c.instantiate(ctx, false, nil) // the initial memory
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close(ctx)
	want := make([]byte, int(img.state.pages)*pageSize)
	copy(want, bare.MemoryCopy())
	s := &snapshotState{pages: img.state.pages, globals: img.state.globals, vars: map[string][]byte{}}
	inst, ok, err := c.restoreOnImage(ctx, img, s)
	if err != nil || !ok {
		t.Fatalf("restore onto the image: %v, %v", ok, err)
	}
	defer inst.Close(ctx)
	if got := inst.MemoryCopy(); !bytes.Equal(got, want) {
		t.Fatalf("%d of %d bytes differ from the initial memory", differingBytes(got, want), len(want))
	}
}

func differingBytes(a, b []byte) int {
	n := max(len(a), len(b)) - min(len(a), len(b))
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			n++
		}
	}
	return n
}
