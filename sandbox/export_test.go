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
