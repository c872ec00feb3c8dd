//go:build !linux

package sandbox

import (
	"io/fs"
	"time"
)

// usedAt is when the file of fi was last used: written (its access time
// is not read here).
func usedAt(fi fs.FileInfo) time.Time { return fi.ModTime() }
