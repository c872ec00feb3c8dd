package sandbox

import (
	"fmt"
	"strconv"
	"strings"
)

// This file is the module-bytes side of host-side snapshots: what the
// checker learns about a module's state while it reads it, and the one
// rewrite that makes every mutable global reachable (wazero's API reads
// and writes globals only through exports).

// globalExportPrefix names the exports added for mutable globals the
// module does not export itself: globalExportPrefix + the global's index.
// A guest that exports a name with this prefix itself is not snapshotted
// by the host (see snapInfo.export).
const globalExportPrefix = "wasmtools.global."

// globalType is one global of the module, imported or defined, in index
// order.
type globalType struct {
	valType  byte
	mutable  bool
	imported bool
}

// sectionPos locates a section: its id byte, and its content.
type sectionPos struct {
	id, start, end int
	found          bool
}

// snapInfo is what the checker records for snapshots.
type snapInfo struct {
	globals []globalType
	// exported maps the index of each global the module exports to
	// one of its export names.
	exported map[uint32]string
	// exportSection is where the module's export section is; insertAt
	// where a new one goes when it has none (after the sections that
	// precede exports in the binary format's order).
	exportSection sectionPos
	insertAt      int
	// refusal is the first reason found why the host cannot capture the
	// module's state faithfully; "" when it can.
	refusal string
	// hasStart is set when the module has a start function, which runs
	// guest code during instantiation.
	hasStart bool
}

func (s *snapInfo) refuse(reason string) {
	if s.refusal == "" {
		s.refusal = reason
	}
}

func (s *snapInfo) export(name string, kind byte, idx uint32) {
	if strings.HasPrefix(name, globalExportPrefix) {
		s.refuse(fmt.Sprintf("it exports %q, a name the host keeps for its own use", name))
	}
	if kind != 0x03 {
		return
	}
	if s.exported == nil {
		s.exported = map[uint32]string{}
	}
	if _, ok := s.exported[idx]; !ok {
		s.exported[idx] = name
	}
}

// snapGlobals returns the export names through which the host reads and
// writes each mutable global, in index order, refusing globals whose
// value an export cannot carry faithfully.
func (c *checker) snapGlobals() ([]string, error) {
	var names []string
	for i, g := range c.snap.globals {
		if !g.mutable {
			continue
		}
		switch g.valType {
		case 0x7f, 0x7e, 0x7d, 0x7c: // i32, i64, f32, f64: one uint64 each
		default:
			return nil, fmt.Errorf("global %d is a mutable %s, whose value the host cannot save", i, valTypeName(g.valType))
		}
		if name, ok := c.snap.exported[uint32(i)]; ok {
			names = append(names, name)
		} else {
			names = append(names, globalExportPrefix+strconv.Itoa(i))
		}
	}
	return names, nil
}

func valTypeName(t byte) string {
	switch t {
	case 0x7b:
		return "v128"
	case 0x70:
		return "funcref"
	case 0x6f:
		return "externref"
	}
	return fmt.Sprintf("type 0x%02x", t)
}

// exportGlobals returns wasm with an export added for each mutable global
// the module defines but does not export, named globalExportPrefix and
// its index, or wasm itself when there is none. Only the export section
// changes (or one is added): indexes, code and every other section keep
// their bytes, so the module behaves as before; a guest cannot see its
// own exports. It must run before capTables, whose offsets lie before
// the export section and stay valid.
func (c *checker) exportGlobals(wasm []byte) []byte {
	var added [][]byte
	for i, g := range c.snap.globals {
		if !g.mutable || g.imported {
			continue
		}
		if _, ok := c.snap.exported[uint32(i)]; ok {
			continue
		}
		name := globalExportPrefix + strconv.Itoa(i)
		e := appendULEB(nil, uint64(len(name)))
		e = append(e, name...)
		e = append(e, 0x03)
		added = append(added, appendULEB(e, uint64(i)))
	}
	if len(added) == 0 {
		return wasm
	}
	var content []byte
	var from, to int // the bytes the new section replaces
	if s := c.snap.exportSection; s.found {
		r := reader{b: wasm[:s.end], pos: s.start}
		n := r.u32() // checked by the checker
		content = appendULEB(nil, uint64(n)+uint64(len(added)))
		content = append(content, wasm[r.pos:s.end]...)
		from, to = s.id, s.end
	} else {
		content = appendULEB(nil, uint64(len(added)))
		from = max(c.snap.insertAt, 8)
		to = from
	}
	for _, e := range added {
		content = append(content, e...)
	}
	out := make([]byte, 0, len(wasm)+len(content)+6)
	out = append(out, wasm[:from]...)
	out = appendULEB(append(out, 7), uint64(len(content)))
	out = append(out, content...)
	return append(out, wasm[to:]...)
}
