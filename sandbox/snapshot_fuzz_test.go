package sandbox

import (
	"context"
	"encoding/binary"
	"maps"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
)

// FuzzRewrite feeds the rewrites Compile applies (mergeData, then
// exportGlobals for a module the host can snapshot, then capTables, then
// instrument) the
// modules the checker accepts and wazero compiles. They must never panic,
// and their output must check, compile, export the same functions, and
// export every mutable global under the name snapGlobals gives it. (That
// merged segments leave the same memory is TestMergeDataSameMemory.)
func FuzzRewrite(f *testing.F) {
	addSmallPlugins(f, filepath.Join("..", "examples", "plugins", "dist"), filepath.Join("..", "internal", "testplugins", "dist"))
	// Data segments with gaps, and one out of order.
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x05\x03\x01\x00\x01\x0b\x16\x03\x00\x41\x10\x0b\x02ab\x00\x41\x00\x0b\x02cd\x00\x41\x20\x0b\x02ef"))
	// A mutable global and no export section; one with an export.
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x06\x06\x01\x7f\x01\x41\x07\x0b"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x06\x0b\x02\x7f\x01\x41\x07\x0b\x7e\x01\x42\x01\x0b\x07\x05\x01\x01g\x03\x01"))
	ctx := context.Background()
	// The interpreter: it validates as the compiler does, faster.
	rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigInterpreter())
	f.Cleanup(func() { rt.Close(ctx) })
	limits := ModuleLimits{MaxNesting: 64, MaxBlocks: 256, MaxLoops: 64, MaxBrTableTargets: 256, MaxFunctionSize: 16 << 10, MaxTableSize: 1 << 10}
	f.Fuzz(func(t *testing.T, wasm []byte) {
		c, err := checkModule(wasm, limits)
		if err != nil {
			return
		}
		mod, err := rt.CompileModule(ctx, wasm)
		if err != nil {
			return
		}
		funcs := slices.Sorted(maps.Keys(mod.ExportedFunctions()))
		mod.Close(ctx)
		snap := c.snapModule()
		out := c.mergeData(wasm)
		if snap.refusal == "" {
			out = c.exportGlobals(out)
		}
		out = c.capTables(out)
		c2, err := checkModule(out, limits)
		if err != nil {
			t.Fatalf("the rewritten module does not check: %v", err)
		}
		mod, err = rt.CompileModule(ctx, out)
		if err != nil {
			t.Fatalf("the rewritten module does not compile: %v", err)
		}
		defer mod.Close(ctx)
		if got := slices.Sorted(maps.Keys(mod.ExportedFunctions())); !slices.Equal(got, funcs) {
			t.Fatalf("exported functions changed: %v, was %v", got, funcs)
		}
		// Then the instrumentation for interruption (interrupt.go): it
		// must take every module that got here, and keep it valid.
		if _, clash := mod.ExportedFunctions()[startExport]; clash {
			return
		}
		ins, err := instrument(out)
		if err != nil {
			t.Fatalf("instrument: %v", err)
		}
		imod, err := rt.CompileModule(ctx, ins)
		if err != nil {
			t.Fatalf("the instrumented module does not compile: %v", err)
		}
		defer imod.Close(ctx)
		got := slices.Sorted(maps.Keys(imod.ExportedFunctions()))
		got = slices.DeleteFunc(got, func(n string) bool { return n == startExport })
		if !slices.Equal(got, funcs) {
			t.Fatalf("instrumented: exported functions changed: %v, was %v", got, funcs)
		}
		c3, err := checkModule(ins, unlimited)
		if err != nil {
			t.Fatalf("the instrumented module does not check: %v", err)
		}
		for i, name := range []string{interruptExport, budgetExport} {
			idx := uint32(len(c3.snap.globals) - 2 + i)
			if g := c3.snap.globals[idx]; g.valType != 0x7f || !g.mutable || g.imported || c3.snap.exported[idx] != name {
				t.Fatalf("instrumented: global %d is %+v, exported as %q; want a mutable i32 exported as %s", idx, g, c3.snap.exported[idx], name)
			}
		}
		if snap.refusal != "" {
			return
		}
		k := 0
		for i, g := range c2.snap.globals {
			if !g.mutable {
				continue
			}
			if name := c2.snap.exported[uint32(i)]; name != snap.globals[k] {
				t.Fatalf("mutable global %d is exported as %q, want %q", i, name, snap.globals[k])
			}
			k++
		}
		if k != len(snap.globals) {
			t.Fatalf("%d mutable globals, %d names", k, len(snap.globals))
		}
	})
}

// FuzzSnapshotBody feeds the snapshot parsers arbitrary bytes, as a
// version 4, 3 or 2 snapshot after its header and as a version 1 body:
// they must never panic, and what they accept stays within the limits
// they are given, each piece saved once. The frames of what the version
// 4, 3 and 2 parsers accept are decoded too: each fills its pieces (or
// its 64 KiB page) exactly, or fails.
func FuzzSnapshotBody(f *testing.F) {
	head := binary.AppendUvarint(nil, 1)
	head = binary.LittleEndian.AppendUint64(head, 42)
	head = binary.LittleEndian.AppendUint64(head, 7)
	head = binary.LittleEndian.AppendUint64(head, 8)
	head = binary.AppendUvarint(head, 1)
	head = appendBytes(appendBytes(head, []byte("k")), []byte("v"))
	head = binary.AppendUvarint(head, 2)
	head = binary.AppendUvarint(head, 1)
	v1 := binary.AppendUvarint(slices.Clone(head), 1)
	f.Add(append(v1, make([]byte, pageSize)...))
	f.Add(head)
	for _, unit := range []int{pageSize, pieceSize} {
		page := make([]byte, unit)
		copy(page[100:], "a page")
		frame := encoder().EncodeAll(page, nil)
		meta := binary.AppendUvarint(binary.AppendUvarint(slices.Clone(head), 1), uint64(len(frame)))
		f.Add(append(appendBytes(nil, encoder().EncodeAll(meta, nil)), frame...))
	}
	{ // version 4: a frame of pieces 1 and 3
		pieces := make([]byte, 2*pieceSize)
		copy(pieces[100:], "a piece")
		copy(pieces[pieceSize+100:], "another")
		frame := encoder().EncodeAll(pieces, nil)
		meta := binary.AppendUvarint(slices.Clone(head), 2)
		meta = binary.AppendUvarint(binary.AppendUvarint(meta, 1), 2)
		meta = binary.AppendUvarint(meta, uint64(len(frame)))
		f.Add(append(appendBytes(nil, encoder().EncodeAll(meta, nil)), frame...))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		const maxPages = 4
		check := func(s *snapshotState) {
			if s.pages > maxPages || len(s.data) > int(s.pages)*pageSize/int(s.unit) || len(s.vars) > maxVars || s.varBytes > maxVarBytes {
				t.Fatalf("accepted past the limits: %d pages, %d saved, %d vars of %d bytes", s.pages, len(s.data), len(s.vars), s.varBytes)
			}
			seen := map[uint32]bool{}
			for _, f := range s.frames {
				if len(f.pieces) == 0 || len(f.pieces) > framePieces || len(f.frame) == 0 || len(f.frame) > len(f.pieces)*pieceSize+maxFrameOver {
					t.Fatalf("a frame of %d pieces in %d bytes", len(f.pieces), len(f.frame))
				}
				for k, p := range f.pieces {
					if p >= s.pages*piecesPerPage || seen[p] || k > 0 && p <= f.pieces[k-1] {
						t.Fatalf("piece %d twice, out of order or past %d pages", p, s.pages)
					}
					seen[p] = true
				}
			}
		}
		if s, err := parseSnapshotBody(b, snapshotVersion1, 0, nil, 1, maxPages); err == nil {
			check(s)
			for _, p := range s.data {
				if p.index >= s.pages || len(p.data) != pageSize {
					t.Fatalf("page %d of %d bytes in %d pages", p.index, len(p.data), s.pages)
				}
			}
		}
		for _, v := range []byte{snapshotVersion2, snapshotVersion3, snapshotVersion4, snapshotVersion} {
			unit := uint32(pieceSize)
			if v == snapshotVersion2 {
				unit = pageSize
			}
			s, err := parseSnapshot(b, v, unit, 1, maxPages)
			if err != nil {
				continue
			}
			check(s)
			buf := make([]byte, unit)
			for _, p := range s.data {
				if p.index >= s.pages*pageSize/unit || len(p.frame) == 0 || len(p.frame) > int(unit)+maxFrameOver {
					t.Fatalf("unit %d of a %d-byte frame in %d pages", p.index, len(p.frame), s.pages)
				}
				_ = decodePage(p.frame, buf)
			}
			_, _ = s.eachFrame(func(p uint32, piece []byte) []byte {
				if len(piece) != pieceSize {
					t.Fatalf("piece %d of %d bytes", p, len(piece))
				}
				return piece
			})
		}
	})
}
