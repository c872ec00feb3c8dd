package sandbox_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestRestoreOnImage: a snapshot restored onto the module's image (images
// on) gives the same memory, byte for byte, and the same behaviour as one
// restored into a fresh instance (images off), for state that grew past
// the image, state that rewrote all of it, and state a few calls changed.
// A snapshot smaller than the image restores the plain way.
func TestRestoreOnImage(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	for _, tt := range []struct {
		name, plugin string
		policy       sandbox.Policy
		calls        [][2]string // tool, arguments
		after        [2]string   // a call after the restore, on both
	}{
		{"servlet, a few calls", "servlet", sandbox.NewPolicy(),
			[][2]string{{"remember", `{"text":"a"}`}, {"var_count", `{}`}, {"remember", `{"text":"b"}`}},
			[2]string{"remember", `{"text":"c"}`}},
		{"servlet, grown past its image", "servlet", sandbox.NewPolicy().WithMemoryLimit(64 << 20),
			[][2]string{{"repeat", `{"text":"0123456789abcdef","count":200000}`}, {"remember", `{"text":"a"}`}},
			[2]string{"remember", `{"text":"c"}`}},
		{"every page rewritten and grown", "hostileimage", sandbox.NewPolicy().WithMemoryLimit(8 << 20),
			[][2]string{{"touch_all", `{}`}, {"grow", `{}`}, {"touch_all", `{}`}},
			[2]string{"check", `{}`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := testplugins.Test(t, tt.plugin)
			on := compile(t, rt, path, tt.policy.WithImages(sandbox.ImagesOn))
			off := compile(t, rt, path, tt.policy.WithImages(sandbox.ImagesOff))
			instantiate(t, on).Close(ctx) // its image
			src := instantiate(t, on)
			for _, c := range tt.calls {
				if _, err := callServlet(t, src, c[0], c[1]); err != nil {
					t.Fatalf("%s: %v", c[0], err)
				}
			}
			snap, err := src.Snapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			a, err := on.Restore(ctx, snap)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(ctx)
			b, err := off.Restore(ctx, snap)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close(ctx)
			ma, mb := a.MemoryCopy(), b.MemoryCopy()
			if !bytes.Equal(ma, mb) {
				t.Fatalf("restored onto the image: %d bytes, %d differ from the plain restore's %d", len(ma), sandbox.DifferingBytes(ma, mb), len(mb))
			}
			if !bytes.Equal(ma, src.MemoryCopy()) {
				t.Fatal("the restored memory is not the snapshotted instance's")
			}
			ga, erra := callServlet(t, a, tt.after[0], tt.after[1])
			gb, errb := callServlet(t, b, tt.after[0], tt.after[1])
			gs, errs := callServlet(t, src, tt.after[0], tt.after[1])
			if erra != nil || errb != nil || errs != nil || ga != gb || ga != gs {
				t.Errorf("after: on the image %q, %v; plain %q, %v; the original %q, %v", ga, erra, gb, errb, gs, errs)
			}
		})
	}
}
