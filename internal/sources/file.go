package sources

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/wasmtools/wasmtools/plugins"
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
	wasm, err := plugins.ReadFileVetted(resolved, max, func(f *os.File) error {
		if fs := kernelFS(f); fs != "" {
			return fmt.Errorf("%s: %w: it is on %s", path, ErrNotPluginFile, fs)
		}
		return nil
	})
	if errors.Is(err, plugins.ErrNotRegular) {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrNotPluginFile, err)
	}
	return wasm, err
}
