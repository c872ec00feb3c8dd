package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// restored snapshots inst and restores the snapshot into a fresh instance
// of c, which the test closes.
func restored(t *testing.T, c *sandbox.Compiled, inst *sandbox.Instance) (*sandbox.Instance, []byte) {
	t.Helper()
	snap, err := inst.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	fresh, err := c.Restore(context.Background(), snap)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	t.Cleanup(func() { fresh.Close(context.Background()) })
	return fresh, snap
}

func TestSnapshotRestore(t *testing.T) {
	rt := newRuntime(t)
	tests := []struct {
		name   string
		path   string
		before []string // calls of tool before the snapshot, with these arguments
		tool   string
		args   string
		want   []string // what calls after the restore return, on both instances
	}{
		// The counter keeps its count in a non-exported WAT global.
		{name: "counter global", path: testplugins.Example(t, "counter"), tool: "count", args: `{}`,
			before: []string{"", "", ""}, want: []string{"4", "5"}},
		// The servlet, built with the Extism Go PDK, keeps a count in an
		// Extism var.
		{name: "servlet vars", path: testplugins.Test(t, "servlet"), tool: "var_count", args: `{}`,
			before: []string{"", ""}, want: []string{"3", "4"}},
		// ... and a slice on the Go heap.
		{name: "servlet Go heap", path: testplugins.Test(t, "servlet"), tool: "remember", args: `{"text":"c"}`,
			before: []string{"a", "b"}, want: []string{"a,b,c", "a,b,c,c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := compile(t, rt, tt.path, sandbox.NewPolicy())
			if err := c.CanSnapshot(); err != nil {
				t.Fatal(err)
			}
			inst := instantiate(t, c)
			for _, a := range tt.before {
				args := tt.args
				if a != "" {
					args = `{"text":"` + a + `"}`
				}
				if _, err := callServlet(t, inst, tt.tool, args); err != nil {
					t.Fatal(err)
				}
			}
			fresh, snap := restored(t, c, inst)
			t.Logf("snapshot: %d bytes", len(snap))
			for _, want := range tt.want {
				for _, i := range []*sandbox.Instance{inst, fresh} {
					got, err := callServlet(t, i, tt.tool, tt.args)
					if err != nil {
						t.Fatal(err)
					}
					if !strings.HasSuffix(got, want) {
						t.Errorf("after restore: got %q, want %q", got, want)
					}
				}
			}
			// A snapshot of the restored instance restores too.
			again, _ := restored(t, c, fresh)
			if _, err := callServlet(t, again, tt.tool, tt.args); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRestoreRefuses(t *testing.T) {
	rt := newRuntime(t)
	counter := compile(t, rt, testplugins.Example(t, "counter"), sandbox.NewPolicy())
	servlet := compile(t, rt, testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	snap, err := instantiate(t, counter).Snapshot(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := servlet.Restore(context.Background(), snap); !errors.Is(err, sandbox.ErrSnapshotMismatch) {
		t.Errorf("restore into other code: got %v, want ErrSnapshotMismatch", err)
	}
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": snap[:len(snap)-3],
		"garbage":   append(snap[:37:37], "not zstd at all"...),
	} {
		if _, err := counter.Restore(context.Background(), b); !errors.Is(err, sandbox.ErrBadSnapshot) {
			t.Errorf("%s: got %v, want ErrBadSnapshot", name, err)
		}
	}
}

// module returns a module of the given sections, in order.
func module(sections ...[]byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range sections {
		m = testplugins.Section(m, s[0], s[1:])
	}
	return m
}

// code is a code section of one function with no locals and body.
func code(body ...byte) []byte {
	fn := testplugins.ULEB(nil, uint64(len(body)+2))
	fn = append(append(append(fn, 0), body...), 0x0b)
	return append([]byte{10, 1}, fn...)
}

func TestSnapshotRefused(t *testing.T) {
	rt := newRuntime(t)
	var (
		typeI32  = []byte{1, 1, 0x60, 0, 1, 0x7f} // type 0: () -> (i32)
		oneFunc  = []byte{3, 1, 0}
		table    = []byte{4, 1, 0x70, 0, 1}
		callFunc = []byte{7, 1, 4, 'c', 'a', 'l', 'l', 0, 0}
	)
	tests := []struct {
		name   string
		wasm   []byte
		policy sandbox.Policy
		want   string
	}{
		{name: "table set", want: "table.set",
			wasm: module(typeI32, oneFunc, table, callFunc, code(0x41, 0, 0xd0, 0x70, 0x26, 0, 0x41, 0))},
		{name: "table grow", want: "table.grow",
			wasm: module(typeI32, oneFunc, table, callFunc, code(0xd0, 0x70, 0x41, 1, 0xfc, 15, 0))},
		{name: "externref global", want: "global 0 is a mutable externref",
			wasm: module(typeI32, oneFunc, []byte{6, 1, 0x6f, 1, 0xd0, 0x6f, 0x0b}, callFunc, code(0x41, 0))},
		{name: "reserved export name", want: `exports "wasmtools.global.0"`,
			wasm: module(typeI32, oneFunc, []byte{6, 1, 0x7f, 1, 0x41, 0, 0x0b},
				append([]byte{7, 1, 18}, append([]byte("wasmtools.global.0"), 0, 0)...), code(0x41, 0))},
		{name: "files kept open", want: "keep files open", wasm: testplugins.Bytes(t, testplugins.Test(t, "grants")),
			policy: sandbox.NewPolicy().WithMounts(sandbox.Mount{HostPath: t.TempDir(), GuestPath: "/data", ReadOnly: true})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := tt.policy
			if p.MemoryLimit() == 0 {
				p = sandbox.NewPolicy()
			}
			c, err := rt.Compile(context.Background(), tt.wasm, p)
			if err != nil {
				t.Fatalf("compile: %v", err)
			}
			defer c.Close(context.Background())
			err = c.CanSnapshot()
			var se *sandbox.SnapshotError
			if !errors.As(err, &se) || !errors.Is(err, sandbox.ErrSnapshotRefused) || !strings.Contains(se.Reason, tt.want) {
				t.Fatalf("CanSnapshot: got %v, want a SnapshotError saying %q", err, tt.want)
			}
			inst := instantiate(t, c)
			if _, err := inst.Snapshot(context.Background()); !errors.Is(err, sandbox.ErrSnapshotRefused) {
				t.Errorf("Snapshot: got %v, want ErrSnapshotRefused", err)
			}
			// The module runs as before: the refusal is only of snapshots.
			if _, err := inst.Call(context.Background(), "call", nil, nil); err != nil && !errors.Is(err, sandbox.ErrNoExport) {
				var ge *sandbox.GuestError
				if !errors.As(err, &ge) {
					t.Errorf("call: %v", err)
				}
			}
		})
	}
}

func TestSnapshotClosed(t *testing.T) {
	c := compile(t, newRuntime(t), testplugins.Example(t, "counter"), sandbox.NewPolicy())
	inst := instantiate(t, c)
	inst.Close(context.Background())
	if _, err := inst.Snapshot(context.Background()); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("got %v, want ErrClosed", err)
	}
}

// pokeModule is a module of three pages of memory, all zero at first, and
// three exports of type () -> i32 that write page 1 (set1), write it back
// to zero (clear1) and write page 2 (set2).
func pokeModule() []byte {
	store := func(addr []byte, v byte) []byte { // addr: a signed LEB128 i32
		fn := append(append([]byte{0, 0x41}, addr...), 0x41, v, 0x36, 2, 0, 0x41, 0, 0x0b)
		return append(testplugins.ULEB(nil, uint64(len(fn))), fn...)
	}
	page1, page2 := []byte{0xf0, 0xa2, 0x04}, []byte{0xe0, 0xc5, 0x08} // 70000, 140000
	var exports []byte
	for k, name := range []string{"set1", "clear1", "set2"} {
		exports = append(append(append(exports, byte(len(name))), name...), 0, byte(k))
	}
	codes := append([]byte{10, 3}, slices.Concat(store(page1, 1), store(page1, 0), store(page2, 1))...)
	return module(
		[]byte{1, 1, 0x60, 0, 1, 0x7f}, // type 0: () -> (i32)
		[]byte{3, 3, 0, 0, 0},
		[]byte{5, 1, 0, 3}, // a memory of 3 pages
		append([]byte{7, 3}, exports...),
		codes,
	)
}

func TestSnapshotIncremental(t *testing.T) {
	ctx := context.Background()
	c, err := newRuntime(t).Compile(ctx, pokeModule(), sandbox.NewPolicy())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	inst := instantiate(t, c)
	// Each step calls fn (unless ""), snapshots, and wants the snapshot to
	// hold pieces (4 KiB: 70000 is in piece 17, 140000 in 34), of which it
	// compressed only compressed.
	steps := []struct {
		fn         string
		pages      []uint32
		compressed int
	}{
		{"", nil, 0},
		{"set1", []uint32{17}, 1},
		{"", []uint32{17}, 0},         // nothing changed: the frame is reused
		{"set2", []uint32{17, 34}, 1}, // only the changed piece is compressed
		{"clear1", []uint32{34}, 0},   // piece 17 is its initial image again
		{"set1", []uint32{17, 34}, 1},
	}
	for k, st := range steps {
		if st.fn != "" {
			if _, err := inst.Call(ctx, st.fn, nil, nil); err != nil {
				t.Fatalf("step %d: %s: %v", k, st.fn, err)
			}
		}
		snap, err := inst.Snapshot(ctx)
		if err != nil {
			t.Fatalf("step %d: snapshot: %v", k, err)
		}
		pages, err := c.SnapshotPages(snap)
		if err != nil {
			t.Fatalf("step %d: %v", k, err)
		}
		if !slices.Equal(pages, st.pages) || inst.SnapshotCompressed() != st.compressed {
			t.Errorf("step %d (%s): pages %v, %d compressed; want %v, %d", k, st.fn, pages, inst.SnapshotCompressed(), st.pages, st.compressed)
		}
		// A restore from it snapshots the same bytes, compressing
		// nothing: its first snapshot reuses the frames it was restored
		// from.
		fresh, again := restored(t, c, inst)
		if more, err := fresh.Snapshot(ctx); err != nil || !bytes.Equal(more, snap) || !bytes.Equal(again, snap) {
			t.Errorf("step %d: the restored instance's snapshot differs (%v)", k, err)
		}
		if fresh.SnapshotCompressed() != 0 {
			t.Errorf("step %d: the restored instance's first snapshot compressed %d pages, want 0", k, fresh.SnapshotCompressed())
		}
	}
}

// TestSnapshotChain restores, calls and snapshots again, hop after hop,
// beside the instance that never moved: each hop's instance answers as
// it does, and a Go guest's second snapshot compresses fewer pages than
// its first.
func TestSnapshotChain(t *testing.T) {
	ctx := context.Background()
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	stay := instantiate(t, c)
	call := func(inst *sandbox.Instance, text string) string {
		t.Helper()
		got, err := callServlet(t, inst, "remember", `{"text":"`+text+`"}`)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	call(stay, "a")
	if _, err := stay.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	first := stay.SnapshotCompressed()
	call(stay, "b")
	if _, err := stay.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if again := stay.SnapshotCompressed(); again >= first {
		t.Errorf("the second snapshot compressed %d pages, the first %d: want fewer", again, first)
	} else {
		t.Logf("compressed %d pages, then %d", first, again)
	}
	moved, _ := restored(t, c, stay)
	for _, text := range []string{"c", "d", "e", "f"} {
		want := call(stay, text)
		if got := call(moved, text); got != want {
			t.Fatalf("after hops: got %q, want %q", got, want)
		}
		moved, _ = restored(t, c, moved)
	}
	if got, want := call(moved, "g"), call(stay, "g"); got != want {
		t.Fatalf("after the last hop: got %q, want %q", got, want)
	}
}

// TestSnapshotWrittenPieces checks the snapshots of instances on the
// image, whose pieces never written since the last snapshot are not read
// (pagemap, on Linux): after each call, the snapshot restores to the
// memory byte for byte, for an instance started from the image and for
// one restored onto it.
func TestSnapshotWrittenPieces(t *testing.T) {
	ctx := context.Background()
	c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
	instantiate(t, c) // its state becomes the image
	onImage := instantiate(t, c)
	if _, err := callServlet(t, onImage, "remember", `{"text":"before"}`); err != nil {
		t.Fatal(err)
	}
	fromSnap, _ := restored(t, c, onImage)
	for name, inst := range map[string]*sandbox.Instance{"from the image": onImage, "restored": fromSnap} {
		t.Run(name, func(t *testing.T) {
			for k := range 40 {
				if _, err := callServlet(t, inst, "remember", fmt.Sprintf(`{"text":"call %d %s"}`, k, strings.Repeat("x", 100*k))); err != nil {
					t.Fatal(err)
				}
				if k%4 != 3 {
					if _, err := inst.Snapshot(ctx); err != nil {
						t.Fatal(err)
					}
					continue
				}
				fresh, snap := restored(t, c, inst)
				if d := sandbox.DifferingBytes(fresh.MemoryCopy(), inst.MemoryCopy()); d != 0 {
					t.Fatalf("call %d: the restored memory differs in %d bytes", k, d)
				}
				if again, err := fresh.Snapshot(ctx); err != nil || !bytes.Equal(again, snap) {
					t.Fatalf("call %d: the restored instance snapshots other bytes (%v)", k, err)
				}
				fresh.Close(ctx)
			}
		})
	}
}
