package sandbox

import "testing"

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

// TrackWritesAnyway makes snapshots track writes for the rest of t where
// the kernel can, whatever it was measured to cost here (tracking's own
// tests); false where the kernel cannot.
func TrackWritesAnyway(t testing.TB) bool {
	if writeTracker() < 0 || scansFailed.Load() {
		return false
	}
	trackAnyway.Store(true)
	t.Cleanup(func() { trackAnyway.Store(false) })
	return true
}
