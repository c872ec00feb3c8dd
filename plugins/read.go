package plugins

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"github.com/wasmtools/wasmtools/sandbox"
)

// ReadFile reads a plugin file as the reloader does (see readPluginFile):
// a regular file, through symlinks, of at most limit bytes; never a FIFO
// or a device. For programs that keep plugin files of their own (the
// store of remote plugins).
func ReadFile(path string, limit uint64) ([]byte, error) {
	return readPluginFile(path, limit)
}

// ReadFileIn is [ReadFile] of the file name of root: a symbolic link is
// followed inside root only (one that leads out of it is an error). For
// files that must not be read from elsewhere (the store's own files).
func ReadFileIn(root *os.Root, name string, limit uint64) ([]byte, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readOpened(f, limit, nil)
}

// ErrNotRegular is matched by the error of [ReadFile] and
// [ReadFileVetted] for anything but a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ReadFileVetted is [ReadFile] with vet, if set, asked about the file
// opened (after the regular-file check, before any byte is read): its
// error refuses the file. For checks that must be made on what is read,
// not on a path that may change meanwhile (the file system it is on).
func ReadFileVetted(path string, limit uint64, vet func(*os.File) error) ([]byte, error) {
	return readVetted(path, limit, vet)
}

// readPluginFile reads the plugin file at path, refusing anything but a
// regular file of at most limit bytes. A plugin folder is the operator's,
// but what is in it may be a symlink to /dev/zero (which os.ReadFile
// reads until the process runs out of memory), a FIFO (which blocks the
// load forever) or a file too large to be a plugin.
//
// A symlink is followed, to a regular file only. The file is opened with
// O_NONBLOCK, so that opening a FIFO does not wait for a writer, and the
// opened file is checked with fstat, so that what is read is what was
// checked. Reading stops at limit+1 bytes, in case the file grows while
// it is read.
func readPluginFile(path string, limit uint64) ([]byte, error) {
	return readVetted(path, limit, nil)
}

func readVetted(path string, limit uint64, vet func(*os.File) error) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readOpened(f, limit, vet)
}

// readOpened reads f as readVetted does once it opened it.
func readOpened(f *os.File, limit uint64, vet func(*os.File) error) ([]byte, error) {
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%w (%s): refused", ErrNotRegular, fileKind(info.Mode()))
	}
	if vet != nil {
		if err := vet(f); err != nil {
			return nil, err
		}
	}
	if uint64(info.Size()) > limit {
		return nil, fmt.Errorf("%d bytes is over the limit max_module_size = %d", info.Size(), limit)
	}
	b, err := io.ReadAll(io.LimitReader(f, int64(min(limit, 1<<62))+1))
	if err != nil {
		return nil, err
	}
	if uint64(len(b)) > limit {
		return nil, fmt.Errorf("over the limit max_module_size = %d bytes (the file grew while it was read)", limit)
	}
	return b, nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSocket != 0:
		return "a socket"
	default:
		return m.Type().String()
	}
}

// maxFileSize is the most of the plugin file at path that is read: the
// module size limit of the policy optsFor (which may be nil) gives it.
func maxFileSize(optsFor func(path string) Options, path string) uint64 {
	policy := sandbox.NewPolicy()
	if optsFor != nil {
		if p := optsFor(path).Policy; p != nil {
			policy = *p
		}
	}
	return policy.ModuleLimits().MaxModuleSize
}
