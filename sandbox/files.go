package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/tetratelabs/wazero"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	wsys "github.com/tetratelabs/wazero/sys"
)

// Mount grants the guest a host folder at GuestPath, read-only unless
// ReadOnly is false.
//
// The guest cannot leave the folder: ".." past its top, absolute paths and
// symbolic links that point outside are refused (wazero's own directory
// mounts follow both), and it cannot make links. A symbolic link inside
// works when its target is relative and inside; one with an absolute
// target is refused even if that target is inside.
type Mount struct {
	HostPath  string
	GuestPath string
	ReadOnly  bool
}

// WithMounts grants host folders. The default is none: the guest sees no
// file system at all.
func (p Policy) WithMounts(m ...Mount) Policy {
	p.mounts = append([]Mount(nil), m...)
	return p
}

// fsConfig builds the guest's file system from the mounts (nil for none),
// and returns the roots the caller closes once no instance uses them.
func (p Policy) fsConfig() (wazero.FSConfig, []*os.Root, error) {
	if len(p.mounts) == 0 {
		return nil, nil, nil
	}
	cfg := wazero.NewFSConfig()
	var roots []*os.Root
	for _, m := range p.mounts {
		info, err := os.Stat(m.HostPath)
		if err != nil || !info.IsDir() {
			closeRoots(roots)
			return nil, nil, fmt.Errorf("mount %s: the host path must be a folder: %v", m.HostPath, err)
		}
		root, err := os.OpenRoot(m.HostPath)
		if err != nil {
			closeRoots(roots)
			return nil, nil, fmt.Errorf("mount %s: %w", m.HostPath, err)
		}
		roots = append(roots, root)
		guest := m.GuestPath
		if guest == "" {
			guest = "/"
		}
		confined := &confinedFS{FS: sysfs.DirFS(m.HostPath), root: root, readOnly: m.ReadOnly}
		cfg = cfg.(sysfs.FSConfig).WithSysFSMount(confined, guest)
	}
	return cfg, roots, nil
}

func closeRoots(roots []*os.Root) {
	for _, r := range roots {
		r.Close()
	}
}

// confinedFS keeps a guest inside one host folder. Every path is checked
// with an os.Root of the folder, which refuses ".." past the top and
// symbolic links leading out, before wazero's directory file system uses
// it.
type confinedFS struct {
	experimentalsys.FS
	root     *os.Root
	readOnly bool
}

// check refuses a path that leaves the folder. A path that does not exist
// yet (a file being created) is checked through its parent.
func (c *confinedFS) check(p string) experimentalsys.Errno {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	if p == "" {
		p = "."
	}
	if _, err := c.root.Lstat(p); err == nil {
		// It exists: if it is a link, it must resolve inside.
		if _, err := c.root.Stat(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return experimentalsys.EPERM
		}
		return 0
	} else if !errors.Is(err, fs.ErrNotExist) {
		return experimentalsys.EPERM
	}
	if dir := path.Dir(p); dir != "." {
		if _, err := c.root.Stat(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return experimentalsys.EPERM
		}
	}
	return 0
}

// escapes reports whether the guest's raw path tries to leave by "..".
func escapes(p string) bool {
	depth := 0
	for _, part := range strings.Split(p, "/") {
		switch part {
		case "", ".":
		case "..":
			if depth--; depth < 0 {
				return true
			}
		default:
			depth++
		}
	}
	return false
}

func (c *confinedFS) guard(paths ...string) experimentalsys.Errno {
	for _, p := range paths {
		if escapes(p) {
			return experimentalsys.EPERM
		}
		if e := c.check(p); e != 0 {
			return e
		}
	}
	return 0
}

func (c *confinedFS) writable(paths ...string) experimentalsys.Errno {
	if c.readOnly {
		return experimentalsys.EROFS
	}
	return c.guard(paths...)
}

func (c *confinedFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	if c.readOnly && flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR|experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0 {
		return nil, experimentalsys.EROFS
	}
	if e := c.guard(p); e != 0 {
		return nil, e
	}
	return c.FS.OpenFile(p, flag, perm)
}

func (c *confinedFS) Lstat(p string) (wsys.Stat_t, experimentalsys.Errno) {
	if e := c.guard(path.Dir(p)); e != 0 {
		return wsys.Stat_t{}, e
	}
	return c.FS.Lstat(p)
}

func (c *confinedFS) Stat(p string) (wsys.Stat_t, experimentalsys.Errno) {
	if e := c.guard(p); e != 0 {
		return wsys.Stat_t{}, e
	}
	return c.FS.Stat(p)
}

func (c *confinedFS) Readlink(p string) (string, experimentalsys.Errno) {
	if e := c.guard(path.Dir(p)); e != 0 {
		return "", e
	}
	return c.FS.Readlink(p)
}

func (c *confinedFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if e := c.writable(p); e != 0 {
		return e
	}
	return c.FS.Mkdir(p, perm)
}

func (c *confinedFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	if e := c.writable(p); e != 0 {
		return e
	}
	return c.FS.Chmod(p, perm)
}

func (c *confinedFS) Rename(from, to string) experimentalsys.Errno {
	if e := c.writable(from, to); e != 0 {
		return e
	}
	return c.FS.Rename(from, to)
}

func (c *confinedFS) Rmdir(p string) experimentalsys.Errno {
	if e := c.writable(p); e != 0 {
		return e
	}
	return c.FS.Rmdir(p)
}

func (c *confinedFS) Unlink(p string) experimentalsys.Errno {
	if e := c.writable(path.Dir(p)); e != 0 {
		return e
	}
	return c.FS.Unlink(p)
}

func (c *confinedFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if e := c.writable(p); e != 0 {
		return e
	}
	return c.FS.Utimens(p, atim, mtim)
}

// Link and Symlink are refused: a guest-made link could point out.
func (c *confinedFS) Link(string, string) experimentalsys.Errno    { return experimentalsys.EPERM }
func (c *confinedFS) Symlink(string, string) experimentalsys.Errno { return experimentalsys.EPERM }
