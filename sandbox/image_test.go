package sandbox_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// TestImages: instances after the first start from its image, with the
// state its initialisation built, and each goes its own way from there:
// what one writes, another never sees.
func TestImages(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	if ok, why := c.UsesImages(); !ok {
		t.Fatalf("servlet uses no images: %s", why)
	}
	first := instantiate(t, c) // initialised; its state becomes the image
	a, b := instantiate(t, c), instantiate(t, c)
	for _, step := range []struct {
		inst *sandbox.Instance
		text string
		want string
	}{
		{first, "f", "f"}, {a, "a1", "a1"}, {b, "b1", "b1"}, {a, "a2", "a1,a2"}, {b, "b2", "b1,b2"}, {first, "f2", "f,f2"},
	} {
		got, err := callServlet(t, step.inst, "remember", `{"text":"`+step.text+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		if got != step.want {
			t.Errorf("remember %s: got %q, want %q", step.text, got, step.want)
		}
	}
	for _, inst := range []*sandbox.Instance{a, b} {
		if got, err := callServlet(t, inst, "var_count", `{}`); err != nil || got != "1" {
			t.Errorf("var_count: %q, %v", got, err)
		}
	}
	// Once an instance started from the image, the image stays: a
	// later KeepImage changes nothing.
	if _, err := callServlet(t, first, "remember", `{"text":"late"}`); err != nil {
		t.Fatal(err)
	}
	first.KeepImage()
	if got, err := callServlet(t, instantiate(t, c), "remember", `{"text":"n"}`); err != nil || got != "n" {
		t.Errorf("after a late KeepImage: %q, %v; want the image as it was", got, err)
	}
	// An image instance snapshots and restores like any other.
	fresh, _ := restored(t, c, a)
	if got, err := callServlet(t, fresh, "remember", `{"text":"a3"}`); err != nil || got != "a1,a2,a3" {
		t.Errorf("restored: %q, %v", got, err)
	}
}

// TestImagesRandom: crypto/rand stays per call with images on: two
// instances from one image, which share the Go runtime's seeded state,
// still read different bytes. What they share is math/rand's state (the
// trade-off in docs/SECURITY.md): the same first number in each, unlike
// instances that run their own initialisation.
func TestImagesRandom(t *testing.T) {
	rt := newRuntime(t)
	wasm := testplugins.Test(t, "servlet")
	for _, tt := range []struct {
		images       sandbox.Images
		sameMathRand bool
	}{{sandbox.ImagesOn, true}, {sandbox.ImagesOff, false}} {
		c := compile(t, rt, wasm, sandbox.NewPolicy().WithImages(tt.images))
		instantiate(t, c)
		crypto, math := map[string]bool{}, map[string]bool{}
		for range 2 {
			inst := instantiate(t, c)
			got, err := callServlet(t, inst, "random", `{}`)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 32 || crypto[got] {
				t.Fatalf("images %v: crypto/rand %q, seen before: %v", tt.images, got, crypto[got])
			}
			crypto[got] = true
			if got, err = callServlet(t, inst, "mathrand", `{}`); err != nil {
				t.Fatal(err)
			}
			math[got] = true
		}
		if same := len(math) == 1; same != tt.sameMathRand {
			t.Errorf("images %v: math/rand the same in both instances: %v, want %v", tt.images, same, tt.sameMathRand)
		}
	}
}

func TestImagesOff(t *testing.T) {
	rt := newRuntime(t)
	wasm := testplugins.Bytes(t, testplugins.Example(t, "counter"))
	tests := []struct {
		name   string
		wasm   []byte
		policy sandbox.Policy
		want   string
	}{
		{"operator", wasm, sandbox.NewPolicy().WithImages(sandbox.ImagesOff), "operator turned images off"},
		{"section", withSection(wasm, sandbox.ImageSection, "off"), sandbox.NewPolicy(), "section says off"},
		{"not snapshottable", testplugins.Bytes(t, testplugins.Test(t, "hostilehost")), sandbox.NewPolicy().WithImages(sandbox.ImagesOn), "table.grow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := rt.Compile(context.Background(), tt.wasm, tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			if ok, why := c.UsesImages(); ok || !strings.Contains(why, tt.want) {
				t.Errorf("UsesImages: %v %q, want false saying %q", ok, why, tt.want)
			}
		})
	}
	c, err := rt.Compile(context.Background(), withSection(wasm, sandbox.ImageSection, "off"), sandbox.NewPolicy().WithImages(sandbox.ImagesOn))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if ok, why := c.UsesImages(); !ok {
		t.Errorf("the operator's on does not override the section: %s", why)
	}
}

// withSection appends a custom section to wasm.
func withSection(wasm []byte, name, content string) []byte {
	body := append(testplugins.ULEB(nil, uint64(len(name))), name...)
	return testplugins.Section(append([]byte(nil), wasm...), 0, append(body, content...))
}

// TestImagesHostile: a guest started from an image (hostileimage: 64
// pages written by its initialisation) that writes every page of it, or
// grows past it to its memory limit, changes no other instance's memory,
// and the limit holds.
func TestImagesHostile(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Test(t, "hostileimage"), sandbox.NewPolicy().WithMemoryLimit(8<<20))
	first := instantiate(t, c)
	if runtime.GOOS == "linux" && !c.ImageMapped() {
		t.Error("on Linux, the image is not a memfd mapped into instances")
	}
	a, b := instantiate(t, c), instantiate(t, c)
	for _, step := range []struct {
		inst       *sandbox.Instance
		tool, want string
	}{
		{a, "check", "pristine"},
		{a, "touch_all", "touched 63 pages"},
		{a, "check", "dirty"},
		{b, "check", "pristine"},
		{first, "check", "pristine"},
		{a, "grow", "grew to 128 pages"},
		{a, "touch_all", "touched 127 pages"},
		{b, "grow", "grew to 128 pages"},
		{b, "check", "pristine"},
		{instantiate(t, c), "check", "pristine"},
	} {
		got, err := callServlet(t, step.inst, step.tool, `{}`)
		if err != nil {
			t.Fatalf("%s: %v", step.tool, err)
		}
		if got != step.want {
			t.Errorf("%s: got %q, want %q", step.tool, got, step.want)
		}
	}
	if a.MemorySize() != 8<<20 {
		t.Errorf("memory: %d bytes, want the 8 MiB limit", a.MemorySize())
	}
	// A Go guest grows its heap past its image (3.4 MiB) and goes on.
	s := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, s)
	g := instantiate(t, s)
	if _, err := callServlet(t, g, "repeat", `{"text":"0123456789abcdef","count":200000}`); err != nil {
		t.Fatalf("a 3.2 MB string: %v", err)
	}
	if g.MemorySize() <= 4<<20 {
		t.Errorf("memory: %d bytes, want past the image", g.MemorySize())
	}
	if got, err := callServlet(t, g, "remember", `{"text":"g"}`); err != nil || got != "g" {
		t.Errorf("after growing: %q, %v", got, err)
	}
}

// TestKeepImage: before any instance started from it, KeepImage replaces
// the image with the instance's present state (what plugins.Load does
// after listing the tools).
func TestKeepImage(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	first := instantiate(t, c)
	if _, err := callServlet(t, first, "remember", `{"text":"kept"}`); err != nil {
		t.Fatal(err)
	}
	first.KeepImage()
	for range 2 {
		if got, err := callServlet(t, instantiate(t, c), "remember", `{"text":"n"}`); err != nil || got != "kept,n" {
			t.Errorf("from the kept image: %q, %v; want kept,n", got, err)
		}
	}
}
