package sandbox

// Overrunning reports how many compilations passed their deadline and are
// still running in the background.
func (r *Runtime) Overrunning() int { return int(r.overrun.Load()) }

// ImageMapped reports whether the module's image is a file its instances
// map, rather than bytes they copy.
func (c *Compiled) ImageMapped() bool {
	img := c.imageFor()
	return img != nil && img.file != nil
}

// SnapshotCompressed reports how many pages the instance's last snapshot
// compressed anew, rather than reusing the frames of the one before.
func (i *Instance) SnapshotCompressed() int { return i.snapCompressed }

// SnapshotPages returns the indexes of the pages snap holds.
func (c *Compiled) SnapshotPages(snap []byte) ([]uint32, error) {
	s, err := c.decodeSnapshot(snap)
	if err != nil {
		return nil, err
	}
	var pages []uint32
	for _, p := range s.data {
		pages = append(pages, p.index)
	}
	return pages, nil
}
