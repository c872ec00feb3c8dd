package sandbox

import (
	"context"
	"fmt"
	"maps"
	"strings"
)

// Pre-initialised images (docs/DESIGN.md, "sandbox: pre-initialised
// images"): the state of a module's first instance after its
// initialisation (or after plugins.Load listed its tools), kept once per
// Compiled, from which later instances start instead of running the
// initialisation again. On Linux the image's memory is a memfd mapped
// copy-on-write (MAP_PRIVATE) into each instance's reservation, so idle
// instances share every page they have not written; elsewhere it is
// copied in.

// Images says whether a plugin's new instances start from a
// pre-initialised image (see [Policy.WithImages]).
type Images uint8

const (
	// ImagesAuto, the default, uses images unless the module opts out
	// with an [ImageSection] custom section saying "off".
	ImagesAuto Images = iota
	// ImagesOn uses images whatever the module's section says.
	ImagesOn
	// ImagesOff never uses images: each instance runs its
	// initialisation.
	ImagesOff
)

// ImageSection is the custom section by which a module says whether its
// instances may start from a pre-initialised image: "off" (an image copies
// the guest runtime's seeded state, such as Go's math/rand and map seeds,
// into every instance; a plugin that relies on those differing between
// sessions says off) or "on". The operator's [Policy.WithImages] wins.
const ImageSection = "wasmtools.image"

// WithImages sets whether new instances start from a pre-initialised
// image: the state of the module's first instance after its
// initialisation, mapped copy-on-write (Linux) or copied. The default,
// [ImagesAuto], follows the module's [ImageSection], and uses images
// without one. Images are used only for modules the host can snapshot
// ([Compiled.CanSnapshot]). What an image shares between instances, and
// what it does not (WASI random_get, so crypto/rand, stays per call), is
// in docs/SECURITY.md.
func (p Policy) WithImages(m Images) Policy {
	p.images = m
	return p
}

// Images reports the policy's image setting.
func (p Policy) Images() Images { return p.images }

// image is a module's state after its initialisation.
type image struct {
	state *snapshotState // no pages: the memory is below
	size  uint64         // the memory's size in bytes
	file  *imageFile     // the memory, as a memfd to map; nil where not
	mem   []byte         // the memory, to copy, where file is nil
}

// UsesImages reports whether new instances start from a pre-initialised
// image, and if not, why not.
func (c *Compiled) UsesImages() (bool, string) { return c.snap.images, c.snap.noImages }

// decideImages sets c.snap.images from the policy and the module.
func (c *Compiled) decideImages() {
	c.snap.images, c.snap.noImages = c.imagesWanted()
}

func (c *Compiled) imagesWanted() (bool, string) {
	if err := c.CanSnapshot(); err != nil {
		return false, err.(*SnapshotError).Reason
	}
	switch c.policy.images {
	case ImagesOn:
		return true, ""
	case ImagesOff:
		return false, "the operator turned images off for this plugin"
	}
	switch s := strings.TrimSpace(string(c.CustomSection(ImageSection))); s {
	case "off":
		return false, fmt.Sprintf("the plugin's %s section says off", ImageSection)
	}
	return true, ""
}

// imageFor returns the module's image, or nil when there is none (yet,
// or ever).
func (c *Compiled) imageFor() *image {
	if !c.snap.images {
		return nil
	}
	c.snap.mu.Lock()
	defer c.snap.mu.Unlock()
	if c.snap.image != nil {
		c.snap.imageUsed = true
	}
	return c.snap.image
}

// keepImage makes inst's state, just after its initialisation, the
// module's image, unless another instance did already. A failure only
// leaves the module without an image; it is logged.
func (c *Compiled) keepImage(inst *Instance) {
	c.snap.mu.Lock()
	defer c.snap.mu.Unlock()
	if c.snap.image != nil || c.snap.imageTried {
		return
	}
	c.snap.imageTried = true
	img, err := inst.makeImage()
	if err != nil {
		c.policy.log.Warn("no pre-initialised image: instances run their initialisation", "error", err)
		return
	}
	c.snap.image = img
}

// KeepImage makes the instance's present state the module's image, in
// place of the state right after its initialisation, when the module uses
// images and no instance has started from its image yet; else it does
// nothing. The caller promises that the state holds nothing of any
// client's: plugins.Load calls it after listing the tools, so that the
// image also holds what the guest runtime does on its first call (Go
// sweeps its heap and starts its background work then), which every
// instance would otherwise do again. It must not run during a call of the
// instance.
func (inst *Instance) KeepImage() {
	c := inst.compiled
	if !c.snap.images || inst.err != nil || inst.deadline != nil {
		return
	}
	c.snap.mu.Lock()
	defer c.snap.mu.Unlock()
	if c.snap.imageUsed {
		return
	}
	img, err := inst.makeImage()
	if err != nil {
		c.policy.log.Warn("pre-initialised image not renewed", "error", err)
		return
	}
	if old := c.snap.image; old != nil && old.file != nil {
		old.file.close()
	}
	c.snap.image, c.snap.imageTried = img, true
}

func (inst *Instance) makeImage() (*image, error) {
	// The instance goes on changing its vars map: the image keeps a copy.
	st := &snapshotState{wall: inst.wall.Load(), mono: inst.mono.Load(), vars: maps.Clone(inst.kernel.vars), varBytes: inst.kernel.varBytes}
	for _, name := range inst.compiled.snap.globals {
		st.globals = append(st.globals, inst.mod.ExportedGlobal(name).Get())
	}
	img := &image{state: st}
	err := inst.withMemory(func(mem []byte) error {
		img.size = uint64(len(mem))
		st.pages = uint32(len(mem) / pageSize)
		f, err := newImageFile(mem)
		if err != nil {
			img.mem = append([]byte(nil), mem...) // copied into each instance
			return nil
		}
		img.file = f
		return nil
	})
	return img, err
}

// fromImage starts an instance from img: instantiation as usual (wazero
// applies the data segments to fresh memory), the memory grown to the
// image's size, then the image mapped over it (or copied in), and the
// globals, vars and clocks set.
func (c *Compiled) fromImage(ctx context.Context, img *image) (*Instance, error) {
	inst, err := c.instantiate(ctx, false, img)
	if err != nil {
		return nil, err
	}
	if err := inst.applyImage(img); err != nil {
		_ = inst.Close(context.Background())
		return nil, fmt.Errorf("instantiate from image: %w", err)
	}
	return inst, nil
}

func (inst *Instance) applyImage(img *image) error {
	s := img.state
	if mem := moduleMemory(inst.mod); mem != nil {
		cur := mem.Size() / pageSize
		if cur > s.pages {
			return fmt.Errorf("the module starts with %d pages, its image has %d", cur, s.pages)
		}
		if grow := s.pages - cur; grow > 0 {
			if _, ok := mem.Grow(grow); !ok {
				return fmt.Errorf("growing to the image's %d pages failed", s.pages)
			}
		}
		mapped, err := inst.mem.settleImage()
		if err != nil {
			return fmt.Errorf("map the image: %w", err)
		}
		if !mapped {
			src := img.mem
			if src == nil {
				var err error
				if src, err = img.file.bytes(); err != nil {
					return err
				}
			}
			err := inst.withMemory(func(b []byte) error {
				copy(b, src)
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	// setVar replaces values, never changes them in place, so the
	// values can be shared; the map cannot.
	return inst.setState(s, maps.Clone(s.vars))
}
