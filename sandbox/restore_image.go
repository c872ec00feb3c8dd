package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"slices"
)

// Restoring onto the image (docs/DESIGN.md, "sandbox: restoring onto the
// image"). A snapshot holds the pages that differ from the module's
// initial memory (its base), and a plain restore starts from a fresh
// instance, whose memory wazero builds from the data segments, and writes
// them: every page of a Go guest's 3.4 MiB is written, and each first
// write of a 4 KiB page costs a fault. Where the module has a mapped image
// instead, the restore starts from an instance on the image (its
// reservation recycled when one is pooled) and writes only the 4 KiB
// pieces whose bytes differ from what is there: a session's state is
// mostly its image's, so most pages are left shared. Pages the image
// changed from the base and the snapshot does not hold (the session put
// them back as they were) are set to the base's bytes, kept for that.

// imageDiff is what an image changed from the module's base memory.
type imageDiff struct {
	img *image
	// base holds, for each page of the image that differs from the
	// base, the base's bytes (nil for a page of zeros).
	base map[uint32][]byte
}

// diffFor returns img's difference from the base, computing it the first
// time (a throwaway instance reads the base).
func (c *Compiled) diffFor(ctx context.Context, img *image, base *baseImage) (*imageDiff, error) {
	c.snap.mu.Lock()
	d := c.snap.diff
	c.snap.mu.Unlock()
	if d != nil && d.img == img {
		return d, nil
	}
	src := img.mem
	if src == nil {
		var err error
		if src, err = img.file.bytes(); err != nil {
			return nil, err
		}
	}
	d = &imageDiff{img: img, base: map[uint32][]byte{}}
	var changed []uint32
	for p := uint32(0); p < img.state.pages; p++ {
		for q := p * piecesPerPage; q < (p+1)*piecesPerPage; q++ {
			if hashPage(src[q*pieceSize:(q+1)*pieceSize]) != base.hash(q) {
				changed = append(changed, p)
				break
			}
		}
	}
	if len(changed) > 0 {
		inst, err := c.instantiate(ctx, false, nil)
		if err != nil {
			return nil, err
		}
		err = inst.withMemory(func(mem []byte) error {
			for _, p := range changed {
				var b []byte
				if uint64(p+1)*pageSize <= uint64(len(mem)) && !isZero(mem[p*pageSize:(p+1)*pageSize]) {
					b = slices.Clone(mem[p*pageSize : (p+1)*pageSize])
				}
				d.base[p] = b
			}
			return nil
		})
		_ = inst.Close(context.Background())
		if err != nil {
			return nil, err
		}
	}
	c.snap.mu.Lock()
	c.snap.diff = d
	c.snap.mu.Unlock()
	return d, nil
}

// restoreOnImage restores s into a new instance on img. It reports false,
// with no instance, where s cannot be restored so: its memory is smaller
// than the image's.
func (c *Compiled) restoreOnImage(ctx context.Context, img *image, s *snapshotState) (*Instance, bool, error) {
	if s.pages < img.state.pages {
		return nil, false, nil
	}
	base, err := c.baseImage(ctx)
	if err != nil {
		return nil, true, err
	}
	diff, err := c.diffFor(ctx, img, base)
	if err != nil {
		return nil, true, err
	}
	inst, err := c.fromImage(ctx, img)
	if err != nil {
		return nil, true, err
	}
	if err := inst.restoreOnImage(s, diff); err != nil {
		_ = inst.Close(context.Background())
		return nil, true, err
	}
	return inst, true, nil
}

func (inst *Instance) restoreOnImage(s *snapshotState, diff *imageDiff) error {
	mem := moduleMemory(inst.mod)
	if mem == nil {
		return fmt.Errorf("%w: %d pages of memory, but the module has none", ErrBadSnapshot, s.pages)
	}
	if grow := s.pages - mem.Size()/pageSize; grow > 0 {
		if _, ok := mem.Grow(grow); !ok {
			return fmt.Errorf("%w: %d pages of memory, over the memory limit", ErrBadSnapshot, s.pages)
		}
	}
	var cache cachedFrames
	err := inst.withMemory(func(b []byte) error {
		saved := map[uint32]bool{} // by piece
		if len(s.data) > 0 {
			scratch := frameScratch.Get().(*[]byte)
			defer frameScratch.Put(scratch)
			u := s.unit
			buf := slices.Grow((*scratch)[:0], int(u))[:u]
			*scratch = buf[:0]
			for _, p := range s.data {
				for q := range u / pieceSize {
					saved[p.index*(u/pieceSize)+q] = true
				}
				want := p.data
				if p.frame != nil {
					if err := decodePage(p.frame, buf); err != nil {
						return fmt.Errorf("page %d: %w", p.index, err)
					}
					want = buf
				}
				writeChanged(b[p.index*u:(p.index+1)*u], want)
			}
		}
		var err error
		cache, err = s.eachFrame(func(p uint32, piece []byte) []byte {
			saved[p] = true
			dst := b[p*pieceSize : (p+1)*pieceSize]
			writeChanged(dst, piece)
			return dst
		})
		if err != nil {
			return err
		}
		for p, want := range diff.base {
			if want == nil {
				want = zeroPage[:]
			}
			for q := range uint32(piecesPerPage) {
				if i := p*piecesPerPage + q; !saved[i] {
					writeChanged(b[i*pieceSize:(i+1)*pieceSize], want[q*pieceSize:(q+1)*pieceSize])
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	inst.snapPieces = 0
	if s.unit == pieceSize {
		// The memory is the base's but for the cached pieces.
		inst.snapPieces = s.pages * piecesPerPage
	}
	inst.snapFrames = cache
	inst.armWrites()
	return inst.setState(s, s.vars)
}

// osPage is the unit writeChanged compares in: the system's page, whose
// first write to a shared mapping of the image costs a fault.
const osPage = 4096

// writeChanged makes dst's bytes src's, writing only the osPage pieces
// that differ, so that a piece already right stays shared with the image.
func writeChanged(dst, src []byte) {
	for off := 0; off < len(dst); off += osPage {
		end := min(off+osPage, len(dst))
		if !bytes.Equal(dst[off:end], src[off:end]) {
			copy(dst[off:end], src[off:end])
		}
	}
}
