package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
)

// Overrunning reports how many compilations passed their deadline and are
// still running in the background.
func (r *Runtime) Overrunning() int { return int(r.overrun.Load()) }

// Compiling reports how many compilations are running.
func (r *Runtime) Compiling() int { return int(r.running.Load()) }

// ImageMapped reports whether the module's image is a file its instances
// map, rather than bytes they copy.
func (c *Compiled) ImageMapped() bool {
	img := c.imageFor()
	return img != nil && img.file != nil
}

// SnapshotCompressed reports how many pages the instance's last snapshot
// compressed anew, rather than reusing the frames of the one before.
func (i *Instance) SnapshotCompressed() int { return i.snapCompressed }

// SnapshotPages returns the indexes of the units (4 KiB pieces, or 64
// KiB pages before version 3) snap holds, in increasing order.
func (c *Compiled) SnapshotPages(snap []byte) ([]uint32, error) {
	s, err := c.decodeSnapshot(snap)
	if err != nil {
		return nil, err
	}
	var pages []uint32
	for _, p := range s.data {
		pages = append(pages, p.index)
	}
	for _, f := range s.frames {
		pages = append(pages, f.pieces...)
	}
	slices.Sort(pages)
	return pages, nil
}

// Reused reports whether the instance's memory is a reservation an
// earlier instance freed, reset to the image (recycle_linux.go).
func (i *Instance) Reused() bool { return i.mem != nil && i.mem.reused }

// MemoryCopy returns a copy of the instance's linear memory.
func (i *Instance) MemoryCopy() []byte {
	var b []byte
	_ = i.withMemory(func(mem []byte) error {
		b = append([]byte(nil), mem...)
		return nil
	})
	return b
}

// ImageBytes returns the module's pre-initialised image's memory, or nil.
func (c *Compiled) ImageBytes() []byte {
	img := c.imageFor()
	switch {
	case img == nil:
		return nil
	case img.file != nil:
		b, _ := img.file.bytes()
		return b
	}
	return img.mem
}

// Pooled reports how many freed reservations the module's image keeps.
func (c *Compiled) Pooled() int {
	img := c.imageFor()
	if img == nil || img.file == nil {
		return 0
	}
	return img.file.pooled()
}

// DifferingBytes counts the bytes at which a and b differ, the difference
// of their lengths included.
var DifferingBytes = differingBytes

// SnapshotTracked reports whether the instance's last snapshot read only
// the pieces the kernel said were written since the one before.
func (i *Instance) SnapshotTracked() bool { return i.snapTracked }

// ChooseTracking makes the instance's next snapshot track its writes (or
// hash the pieces it owns), as if its own figures had chosen so
// (trackChoice).
func (i *Instance) ChooseTracking(on bool) { i.track.chosen, i.track.on = true, on }

// ChooseProtecting makes the instance's next scan, if it tracks, protect
// the pages it finds written again (or leave them written), as if the
// rent-or-buy rule had chosen so (trackChoice.protect). The scan still
// protects when it arms.
func (i *Instance) ChooseProtecting(protect bool) {
	if protect {
		i.track.protectNs = 0
	} else {
		i.track.rent, i.track.protectNs = 0, 1e18 // an hour and more: never reached
	}
}

// SnapshotLeftWritten reports whether the instance's last snapshot
// tracked and left the pages it found written unprotected.
func (i *Instance) SnapshotLeftWritten() bool { return i.snapTracked && i.track.left }

// WriteMemory runs f on the instance's live memory, between calls: the
// host's own writes, or the kernel's (a read(2) into it).
func (i *Instance) WriteMemory(f func(mem []byte)) {
	_ = i.withMemory(func(mem []byte) error {
		f(mem)
		return nil
	})
}

// GrowMemory grows the instance's memory by pages of 64 KiB, as the
// guest's memory.grow does, and reports whether it could.
func (i *Instance) GrowMemory(pages uint32) bool {
	m := moduleMemory(i.mod)
	if m == nil {
		return false
	}
	_, ok := m.Grow(pages)
	return ok
}

// TrackedReservation is a reservation of max bytes whose first len(img)
// bytes map img (copy-on-write, as an instance's memory on its image),
// the rest committed up to size: its memory, a scan of its writes as a
// snapshot makes (scanWrites), and its release.
func TrackedReservation(img []byte, max, size uint64) (mem []byte, scan func() ([]uint64, bool), free func(), err error) {
	m := reserveMemory(max)
	if m == nil {
		return nil, nil, nil, errors.New("no reservation")
	}
	if len(img) > 0 {
		f, err := newImageFile(img)
		if err != nil {
			return nil, nil, nil, err
		}
		m.img, m.imgSize = f, uint64(len(img))
		if err := m.mapImage(); err != nil {
			return nil, nil, nil, err
		}
	}
	if size > uint64(len(img)) {
		if err := commit(m.mem[len(img):size]); err != nil {
			return nil, nil, nil, err
		}
	}
	m.committed = size
	mem = m.mem[:size]
	return mem, func() ([]uint64, bool) { w, ok, _ := m.scanWrites(mem, true, true); return w, ok }, func() { m.mu.Lock(); m.unmap(); m.mu.Unlock() }, nil
}

// CloseImageFile closes the module's image file, as Close does after
// closing the runtime, but leaves the module open: what an instantiation
// that Close ran under finds when wazero allocates its memory. It reports
// false when the module has no image file.
func (c *Compiled) CloseImageFile() bool {
	img := c.imageFor()
	if img == nil || img.file == nil {
		return false
	}
	img.file.close()
	return true
}

// CheckedEntries lists the checked-module cache's entries under dir.
func CheckedEntries(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, checkedPrefix+"*", "*"))
	return m
}

// EditCheckedEntry rewrites the entry at path with edit applied to the
// bytes it gives wazero, its digest made anew: an entry as sound as one
// Compile wrote.
func EditCheckedEntry(path string, edit func(wasm []byte) []byte) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	c, err := decodeChecked(b)
	if err != nil {
		return err
	}
	c.wasm = edit(slices.Clone(c.wasm))
	return os.WriteFile(path, encodeChecked(c), 0o644)
}

// CheckedEntrySound reports whether the entry at path decodes.
func CheckedEntrySound(path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	_, err = decodeChecked(b)
	return err == nil
}

// SetSweepHook has f called as the checked-module cache's sweep begins:
// a test holds it there. Set it before the first compilation.
func (r *Runtime) SetSweepHook(f func()) { r.sweepHook = f }

// SetCheckedReadHook has f called as an entry of the checked-module
// cache is read, its file open: a test holds the read there. Set it
// before the first compilation.
func (r *Runtime) SetCheckedReadHook(f func()) { r.checkedReadHook = f }

// WazeroCacheDir is the folder of the cache folder dir wazero keeps
// this process's machine code in.
func WazeroCacheDir(dir string) string { return filepath.Join(dir, wazeroDirName()) }
