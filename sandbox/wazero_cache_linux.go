//go:build linux

package sandbox

import (
	"io/fs"
	"syscall"
	"time"
)

// usedAt is when the file of fi was last used: written, or read, as its
// access time says where the file system keeps one later than its write
// (Linux's default, relatime, sets it at the first read after a write,
// then at most once a day: a module loaded every day is never among the
// least recently used; with noatime it is the write).
func usedAt(fi fs.FileInfo) time.Time {
	t := fi.ModTime()
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if a := time.Unix(st.Atim.Unix()); a.After(t) {
			return a
		}
	}
	return t
}
