package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/tetratelabs/wazero"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	wsys "github.com/tetratelabs/wazero/sys"
)

// Mount grants the guest a host folder at GuestPath, read-only unless
// ReadOnly is false.
//
// The guest cannot leave the folder: every operation goes through an
// [os.Root] of it, which resolves each path component inside the folder
// (openat with the kernel's checks, not a path checked and then reopened),
// so ".." past its top and symbolic links that point outside are refused
// even while something on the host swaps a folder for a link. The guest
// cannot make links. A symbolic link inside works when its target is
// relative and inside; one with an absolute target is refused even if
// that target is inside.
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
		cfg = cfg.(sysfs.FSConfig).WithSysFSMount(&rootFS{root: root, readOnly: m.ReadOnly}, guest)
	}
	return cfg, roots, nil
}

func closeRoots(roots []*os.Root) {
	for _, r := range roots {
		r.Close()
	}
}

// rootFS serves a mount from an [os.Root]: every path the guest names is
// opened, created, renamed or removed by the Root itself, never by a host
// path built from it, so no check can be raced between checking a path
// and using it.
type rootFS struct {
	experimentalsys.UnimplementedFS
	root     *os.Root
	readOnly bool
}

// name turns a guest path (relative to the mount, maybe with a leading
// "/") into a name for the Root, refusing ".." past the top outright.
func name(p string) (string, experimentalsys.Errno) {
	if escapes(p) {
		return "", experimentalsys.EPERM
	}
	p = strings.TrimLeft(p, "/")
	if p == "" {
		p = "."
	}
	return p, 0
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

// errno converts an error of the Root. A path the Root refuses for
// leaving it (through ".." or a symbolic link) is EPERM.
func errno(err error) experimentalsys.Errno {
	if err == nil {
		return 0
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent" {
		return experimentalsys.EPERM
	}
	var le *os.LinkError
	if errors.As(err, &le) && le.Err != nil && le.Err.Error() == "path escapes from parent" {
		return experimentalsys.EPERM
	}
	return experimentalsys.UnwrapOSError(err)
}

func (r *rootFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	n, e := name(p)
	if e != 0 {
		return nil, e
	}
	writes := flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR|experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0
	if r.readOnly && writes {
		return nil, experimentalsys.EROFS
	}
	if flag&experimentalsys.O_DIRECTORY != 0 && flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR) != 0 {
		return nil, experimentalsys.EISDIR
	}
	var of int
	switch {
	case flag&experimentalsys.O_RDWR != 0:
		of = os.O_RDWR
	case flag&experimentalsys.O_WRONLY != 0:
		of = os.O_WRONLY
	default:
		of = os.O_RDONLY
	}
	for _, m := range []struct {
		w experimentalsys.Oflag
		o int
	}{
		{experimentalsys.O_APPEND, os.O_APPEND},
		{experimentalsys.O_CREAT, os.O_CREATE},
		{experimentalsys.O_EXCL, os.O_EXCL},
		{experimentalsys.O_TRUNC, os.O_TRUNC},
		{experimentalsys.O_SYNC | experimentalsys.O_DSYNC | experimentalsys.O_RSYNC, os.O_SYNC},
	} {
		if flag&m.w != 0 {
			of |= m.o
		}
	}
	if flag&experimentalsys.O_NOFOLLOW != 0 {
		// The Root follows links, inside it only; a guest asking not to
		// follow one is told it is one, as open(2) does.
		if st, err := r.root.Lstat(n); err == nil && st.Mode()&fs.ModeSymlink != 0 {
			return nil, experimentalsys.ELOOP
		}
	}
	f, err := r.root.OpenFile(n, of, perm)
	if err != nil {
		return nil, errno(err)
	}
	adapted, e := (&sysfs.AdaptFS{FS: &opened{root: r.root, name: n, f: f}}).OpenFile(n, flag, perm)
	if e != 0 {
		f.Close()
		return nil, e
	}
	file := &rootFile{File: adapted, f: f, root: r.root, name: n, append: of&os.O_APPEND != 0, readOnly: r.readOnly, writes: of&(os.O_WRONLY|os.O_RDWR) != 0}
	if flag&experimentalsys.O_DIRECTORY != 0 {
		if dir, e := file.IsDir(); e != 0 || !dir {
			file.Close()
			return nil, experimentalsys.ENOTDIR
		}
	}
	return file, 0
}

func (r *rootFS) Lstat(p string) (wsys.Stat_t, experimentalsys.Errno) {
	n, e := name(p)
	if e != 0 {
		return wsys.Stat_t{}, e
	}
	info, err := r.root.Lstat(n)
	if err != nil {
		return wsys.Stat_t{}, errno(err)
	}
	return wsys.NewStat_t(info), 0
}

func (r *rootFS) Stat(p string) (wsys.Stat_t, experimentalsys.Errno) {
	n, e := name(p)
	if e != 0 {
		return wsys.Stat_t{}, e
	}
	info, err := r.root.Stat(n)
	if err != nil {
		return wsys.Stat_t{}, errno(err)
	}
	return wsys.NewStat_t(info), 0
}

func (r *rootFS) Readlink(p string) (string, experimentalsys.Errno) {
	n, e := name(p)
	if e != 0 {
		return "", e
	}
	target, err := r.root.Readlink(n)
	return target, errno(err)
}

// writable returns the Root's name for p, or why p may not be changed.
func (r *rootFS) writable(p string) (string, experimentalsys.Errno) {
	if r.readOnly {
		return "", experimentalsys.EROFS
	}
	return name(p)
}

func (r *rootFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	n, e := r.writable(p)
	if e != 0 {
		return e
	}
	e = errno(r.root.Mkdir(n, perm))
	if e == experimentalsys.ENOTDIR {
		e = experimentalsys.ENOENT // as wazero's directory file system says
	}
	return e
}

func (r *rootFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	n, e := r.writable(p)
	if e != 0 {
		return e
	}
	return errno(r.root.Chmod(n, perm))
}

func (r *rootFS) Rename(from, to string) experimentalsys.Errno {
	f, e := r.writable(from)
	if e != 0 {
		return e
	}
	t, e := r.writable(to)
	if e != 0 {
		return e
	}
	return errno(r.root.Rename(f, t))
}

func (r *rootFS) Rmdir(p string) experimentalsys.Errno {
	n, e := r.writable(p)
	if e != 0 {
		return e
	}
	info, err := r.root.Lstat(n)
	if err != nil {
		return errno(err)
	}
	if !info.IsDir() {
		return experimentalsys.ENOTDIR
	}
	return errno(r.root.Remove(n))
}

func (r *rootFS) Unlink(p string) experimentalsys.Errno {
	n, e := r.writable(p)
	if e != 0 {
		return e
	}
	info, err := r.root.Lstat(n)
	if err != nil {
		return errno(err)
	}
	if info.IsDir() {
		return experimentalsys.EISDIR
	}
	return errno(r.root.Remove(n))
}

func (r *rootFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	n, e := r.writable(p)
	if e != 0 {
		return e
	}
	return utimens(r.root, n, atim, mtim)
}

// utimens sets the times of name, keeping a time given as UTIME_OMIT.
func utimens(root *os.Root, name string, atim, mtim int64) experimentalsys.Errno {
	if atim == experimentalsys.UTIME_OMIT && mtim == experimentalsys.UTIME_OMIT {
		return 0
	}
	if atim == experimentalsys.UTIME_OMIT || mtim == experimentalsys.UTIME_OMIT {
		info, err := root.Stat(name)
		if err != nil {
			return errno(err)
		}
		st := wsys.NewStat_t(info)
		if atim == experimentalsys.UTIME_OMIT {
			atim = st.Atim
		}
		if mtim == experimentalsys.UTIME_OMIT {
			mtim = st.Mtim
		}
	}
	return errno(root.Chtimes(name, time.Unix(0, atim), time.Unix(0, mtim)))
}

// Link and Symlink are refused: a guest-made link could point out.
func (r *rootFS) Link(string, string) experimentalsys.Errno    { return experimentalsys.EPERM }
func (r *rootFS) Symlink(string, string) experimentalsys.Errno { return experimentalsys.EPERM }

// rootFile is a file opened through a Root. wazero's adapter of fs.File
// does the reading, writing, seeking and listing on the *os.File; rootFile
// adds what the adapter leaves out.
type rootFile struct {
	experimentalsys.File
	f      *os.File
	root   *os.Root
	name   string // in the Root, for Utimens
	append bool
	// readOnly: the file system's; writes: opened for writing. Utimens
	// goes through the Root by name, not the descriptor, so it checks
	// them itself.
	readOnly, writes bool
}

// opened is the fs.FS the adapter opens a rootFile's file from: first the
// file already opened through the Root, then (to rewind a folder) the same
// name again, read-only, through the Root.
type opened struct {
	root *os.Root
	name string
	f    *os.File
}

func (o *opened) Open(string) (fs.File, error) {
	if f := o.f; f != nil {
		o.f = nil
		return f, nil
	}
	return o.root.Open(o.name)
}

func (f *rootFile) IsAppend() bool { return f.append }

// SetAppend cannot change the mode of an open file (wazero's own files
// reopen it by path, which a Root-confined file must not); it reports
// ENOSYS for a change.
func (f *rootFile) SetAppend(enable bool) experimentalsys.Errno {
	if enable == f.append {
		return 0
	}
	return experimentalsys.ENOSYS
}

func (f *rootFile) Truncate(size int64) experimentalsys.Errno { return errno(f.f.Truncate(size)) }
func (f *rootFile) Sync() experimentalsys.Errno               { return errno(f.f.Sync()) }
func (f *rootFile) Datasync() experimentalsys.Errno           { return errno(f.f.Sync()) }

// Utimens sets the file's times through the Root, by its name there, if
// the file was opened for writing in a file system that is not read-only:
// a descriptor opened to read (a folder WASI pre-opened, a file of a
// mount granted "read" only) changes nothing, its times included (a red
// team, stop 64: fd_filestat_set_times changed them on the host).
func (f *rootFile) Utimens(atim, mtim int64) experimentalsys.Errno {
	switch {
	case f.readOnly:
		return experimentalsys.EROFS
	case !f.writes:
		return experimentalsys.EBADF
	}
	return utimens(f.root, f.name, atim, mtim)
}
