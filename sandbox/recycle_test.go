package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// needRecycling skips where freed reservations are not reused: off Linux,
// or where /proc/self/pagemap cannot be read (the reset needs it).
func needRecycling(t *testing.T) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("reservations are recycled on Linux only")
	}
	f, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skip("no /proc/self/pagemap:", err)
	}
	f.Close()
}

// TestRecycledMemoryIsTheImage: the memory an instance freed goes to the
// next instance of the image holding the image's bytes exactly, whatever
// the first did to it: a few pages written (kept as its own, copied
// back), every page written (mapped afresh), memory grown past the image
// (given back, the size the image's again).
func TestRecycledMemoryIsTheImage(t *testing.T) {
	needRecycling(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name   string
		plugin string
		dirty  func(t *testing.T, inst *sandbox.Instance)
	}{
		{"servlet, a call", "servlet", func(t *testing.T, inst *sandbox.Instance) {
			if _, err := callServlet(t, inst, "remember", `{"text":"secret of the first client"}`); err != nil {
				t.Fatal(err)
			}
		}},
		{"servlet, grown", "servlet", func(t *testing.T, inst *sandbox.Instance) {
			if _, err := callServlet(t, inst, "repeat", `{"text":"0123456789abcdef","count":200000}`); err != nil {
				t.Fatal(err)
			}
			if inst.MemorySize() <= uint64(4<<20) {
				t.Fatalf("memory %d bytes: the guest did not grow past its image", inst.MemorySize())
			}
		}},
		{"servlet, a call, then a panic", "servlet", func(t *testing.T, inst *sandbox.Instance) {
			if _, err := callServlet(t, inst, "remember", `{"text":"secret of the first client"}`); err != nil {
				t.Fatal(err)
			}
			if _, err := callServlet(t, inst, "panic", `{}`); err == nil {
				t.Fatal("the panic tool did not trap")
			}
		}},
		{"every page written, then grown and written", "hostileimage", func(t *testing.T, inst *sandbox.Instance) {
			for _, tool := range []string{"touch_all", "grow", "touch_all"} {
				if _, err := callServlet(t, inst, tool, `{}`); err != nil {
					t.Fatalf("%s: %v", tool, err)
				}
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := compile(t, newRuntime(t), testplugins.Test(t, tt.plugin), sandbox.NewPolicy().WithMemoryLimit(64<<20))
			instantiate(t, c).Close(ctx) // initialised: the image
			img := c.ImageBytes()
			if img == nil {
				t.Fatal("no image")
			}
			a := instantiate(t, c)
			tt.dirty(t, a)
			if a.Err() == nil && bytes.Equal(a.MemoryCopy()[:len(img)], img) {
				t.Fatal("the first instance's memory is still the image: the test proves nothing")
			}
			if err := a.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if c.Pooled() != 1 {
				t.Fatalf("%d reservations pooled after a close, want 1", c.Pooled())
			}
			b := instantiate(t, c)
			if !b.Reused() {
				t.Fatal("the next instance did not reuse the freed reservation")
			}
			if got := b.MemoryCopy(); !bytes.Equal(got, img) {
				t.Errorf("reused memory: %d bytes, %d differ from the image's %d", len(got), sandbox.DifferingBytes(got, img), len(img))
			}
			if a.MemoryCopy() != nil {
				t.Error("the closed instance still reads memory")
			}
		})
	}
}

// TestRecycledSessionsIsolated: clients that start, call and end at once,
// on shared reservations, each see only their own state, with -race. The
// module's Close, racing them, ends the pool.
func TestRecycledSessionsIsolated(t *testing.T) {
	needRecycling(t)
	ctx := context.Background()
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, c).Close(ctx)
	var wg sync.WaitGroup
	var reused sync.Map
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				inst, err := c.Instantiate(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if inst.Reused() {
					reused.Store(g, true)
				}
				text := fmt.Sprintf("client-%d-%d", g, i)
				for k := 1; k <= 2; k++ {
					got, err := callServlet(t, inst, "remember", `{"text":"`+text+`"}`)
					want := strings.TrimSuffix(strings.Repeat(text+",", k), ",")
					if err != nil || got != want {
						t.Errorf("%s call %d: %q, %v; want %q", text, k, got, err, want)
					}
				}
				if got, err := callServlet(t, inst, "var_count", `{}`); err != nil || got != "1" {
					t.Errorf("%s: var_count %q, %v; want 1", text, got, err)
				}
				inst.Close(ctx)
			}
		}()
	}
	wg.Wait()
	n := 0
	reused.Range(func(any, any) bool { n++; return true })
	if n == 0 {
		t.Error("no instance reused a reservation")
	}
	if p := c.Pooled(); p < 1 || p > 8 {
		t.Errorf("%d reservations pooled, want 1 to 8", p)
	}
	// Instances closing while the module closes.
	var live []*sandbox.Instance
	for range 4 {
		live = append(live, instantiate(t, c))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, inst := range live {
			inst.Close(ctx)
		}
	}()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	if c.Pooled() != 0 {
		t.Errorf("%d reservations pooled after the module closed", c.Pooled())
	}
	if _, err := c.Instantiate(ctx); err == nil {
		t.Error("an instance of a closed module")
	}
}

// TestPreInitialize: Wizer's pre-initialisation export runs once before
// the image is kept, so every instance starts from its state; without
// images, every instance runs it. One that never returns fails the
// instance at its deadline, naming the export.
func TestPreInitialize(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	for _, images := range []sandbox.Images{sandbox.ImagesOn, sandbox.ImagesOff} {
		c := compile(t, rt, testplugins.Test(t, "preinit"), sandbox.NewPolicy().WithImages(images))
		for i := range 3 {
			inst := instantiate(t, c)
			out, err := inst.Call(ctx, "call", []byte(`{}`), nil)
			if err != nil || !strings.Contains(string(out), `"101"`) {
				t.Errorf("images %v, instance %d: %s, %v; want 101", images, i, out, err)
			}
			inst.Close(ctx)
		}
	}
	c := compile(t, rt, testplugins.Test(t, "hostilepreinit"), sandbox.NewPolicy().WithCallTimeout(200*time.Millisecond))
	_, err := c.Instantiate(ctx)
	var trap *sandbox.TrapError
	if !errors.As(err, &trap) || trap.Export != "wizer.initialize" || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a pre-initialisation that never returns: %v; want a TrapError of wizer.initialize at its deadline", err)
	}
}
