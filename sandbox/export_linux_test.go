package sandbox

// PoolKept reports the private bytes the module's pooled reservations
// hold (recycle_linux.go), for tests.
func (c *Compiled) PoolKept() uint64 {
	img := c.imageFor()
	if img == nil || img.file == nil {
		return 0
	}
	img.file.mu.RLock()
	defer img.file.mu.RUnlock()
	return img.file.poolKept
}
