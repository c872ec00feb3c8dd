package sources

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrNotPluginFile: a file:// source names something other than a
// regular file on an ordinary file system (a device, a FIFO, a folder, or
// a file of /proc, /sys or another kernel file system).
var ErrNotPluginFile = errors.New("not a plugin file")

// kernelDirs are the folders of kernel file systems, refused by path
// (after symlinks) as well as by file-system type where that is known.
var kernelDirs = []string{"/proc", "/sys", "/dev"}

// readSourceFile reads a file:// source (hyper-mcp's local plugins): a
// regular file only, through symlinks, never under /proc, /sys or /dev nor
// on a kernel file system (procfs, sysfs, debugfs…, checked on the file
// opened), of at most max bytes. /proc/self/environ is a "regular" file
// that holds the server's environment: it must never reach the store.
func readSourceFile(path string, max uint64) ([]byte, error) {
	resolved, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	resolved = filepath.Clean(resolved)
	for _, d := range kernelDirs {
		if resolved == d || strings.HasPrefix(resolved, d+"/") {
			return nil, fmt.Errorf("%s: %w: it is under %s", path, ErrNotPluginFile, d)
		}
	}
	f, err := os.OpenFile(resolved, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		kind := "not a regular file"
		switch m := info.Mode(); {
		case m&os.ModeNamedPipe != 0:
			kind = "a FIFO (named pipe)"
		case m&os.ModeDevice != 0:
			kind = "a device"
		case m&os.ModeSocket != 0:
			kind = "a socket"
		case m.IsDir():
			kind = "a folder"
		}
		return nil, fmt.Errorf("%s: %w: it is %s", path, ErrNotPluginFile, kind)
	}
	if fs := kernelFS(f); fs != "" {
		return nil, fmt.Errorf("%s: %w: it is on %s", path, ErrNotPluginFile, fs)
	}
	if uint64(info.Size()) > max {
		return nil, fmt.Errorf("%d bytes: %w (max_module_size = %d)", info.Size(), ErrTooLarge, max)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(min(max, 1<<62))+1))
	if err != nil {
		return nil, err
	}
	if uint64(len(b)) > max {
		return nil, fmt.Errorf("more than %d bytes: %w (max_module_size)", max, ErrTooLarge)
	}
	return b, nil
}
