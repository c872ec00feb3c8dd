package sandbox

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/tetratelabs/wazero"
	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
	"github.com/tetratelabs/wazero/experimental/sysfs"
	wsys "github.com/tetratelabs/wazero/sys"
)

// GrantFile is a folder the guest reads ([GrantRequest.Mode] "read") or
// changes ("read-write").
const GrantFile GrantKind = "file"

// File grant modes.
const (
	ModeRead      = "read"
	ModeReadWrite = "read-write"
)

// WithAskMounts sets the folders a guest sees but may use only once the
// [Asker] of the call grants it (the ceiling of file grants): the first
// use of one in a call (opening, listing or stat-ing anything in it) asks
// for "read"; the first change (writing, creating, renaming, removing)
// asks for "read-write", which a ReadOnly mount never allows. A grant
// lasts for the rest of the call; the Asker remembers for longer if it
// should. A file kept open into a later call is read or changed only
// under that call's grant, asked for as at its first use. Refused, or outside a call (initialisation), the operation
// fails with EACCES. The default is none. A guest path may not be that
// of a mount of [Policy.WithMounts].
func (p Policy) WithAskMounts(m ...Mount) Policy {
	p.askMounts = append([]Mount(nil), m...)
	return p
}

// AskMounts returns the folders that may be asked for (see
// [Policy.WithAskMounts]).
func (p Policy) AskMounts() []Mount { return append([]Mount(nil), p.askMounts...) }

// askRoot is an ask mount, opened.
type askRoot struct {
	Mount
	root *os.Root
}

// openAskMounts opens the folders of the ask mounts; the caller closes
// the roots with the module.
func (p Policy) openAskMounts() ([]askRoot, []*os.Root, error) {
	var out []askRoot
	var roots []*os.Root
	for _, m := range p.askMounts {
		root, err := os.OpenRoot(m.HostPath)
		if err != nil {
			closeRoots(roots)
			return nil, nil, fmt.Errorf("ask mount %s: %w", m.HostPath, err)
		}
		roots = append(roots, root)
		out = append(out, askRoot{Mount: m, root: root})
	}
	return out, roots, nil
}

// gatedFS is an ask mount in one instance: each operation first checks
// that the current call was granted the mount, asking if not.
type gatedFS struct {
	rootFS
	inst *Instance
	idx  int // of the mount in the policy's ask mounts
	m    Mount
}

// fileGrant is what a call was granted of one ask mount.
type fileGrant uint8

const (
	fileNone fileGrant = iota
	fileRead
	fileReadWrite
	fileDenied
)

// allow checks, or asks for, the mount in mode; 0 when granted.
func (g *gatedFS) allow(write bool) experimentalsys.Errno {
	i := g.inst
	want, mode := fileRead, ModeRead
	if write {
		want, mode = fileReadWrite, ModeReadWrite
		if g.m.ReadOnly {
			return experimentalsys.EROFS
		}
	}
	have := i.fileGrants[g.idx]
	switch {
	case have == fileDenied:
		return experimentalsys.EACCES
	case have >= want:
		return 0
	case i.callCtx == nil:
		return experimentalsys.EACCES // no call: no one to ask
	}
	target, _ := filepath.Abs(g.m.HostPath)
	if err := askGrant(i.callCtx, GrantRequest{Kind: GrantFile, Target: target, Mode: mode}); err != nil {
		if have == fileNone {
			i.fileGrants[g.idx] = fileDenied
		}
		return experimentalsys.EACCES
	}
	i.fileGrants[g.idx] = want
	return 0
}

// isTop reports whether p names the mount's folder itself, which WASI
// opens and stats to pre-open it (at initialisation, with no one to ask):
// that is allowed, and only listing it asks (see gatedFile).
func isTop(p string) bool {
	n, e := name(p)
	return e == 0 && n == "."
}

func (g *gatedFS) OpenFile(p string, flag experimentalsys.Oflag, perm fs.FileMode) (experimentalsys.File, experimentalsys.Errno) {
	write := flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR|experimentalsys.O_CREAT|experimentalsys.O_TRUNC|experimentalsys.O_APPEND) != 0
	top := !write && isTop(p)
	if !top {
		if e := g.allow(write); e != 0 {
			return nil, e
		}
	}
	f, e := g.rootFS.OpenFile(p, flag, perm)
	if e != 0 {
		return nil, e
	}
	return &gatedFile{File: f, g: g, top: top, writes: flag&(experimentalsys.O_WRONLY|experimentalsys.O_RDWR) != 0}, 0
}

// gatedFile is a file of an ask mount, opened: each use checks the grant
// of the call it is used in, as opening it did, since a grant lasts for
// its call and a guest may keep a file open into the next (a red team,
// stop 66: a file opened under one call's "allow once" was read and
// written in later calls whose person refused the folder). The mount's
// folder itself (top), which WASI opens at initialisation, asks only to
// be listed.
type gatedFile struct {
	experimentalsys.File
	g      *gatedFS
	top    bool
	writes bool // opened for writing; else a write fails as it would, unasked
}

// allow checks, or asks for, what a use of f needs: reading (the folder
// listed, for top), or changing when f was opened to.
func (f *gatedFile) allow(write bool) experimentalsys.Errno {
	if write && !f.writes {
		return 0 // the file refuses it itself (EBADF): nothing to ask
	}
	return f.g.allow(write)
}

func (f *gatedFile) Readdir(n int) ([]experimentalsys.Dirent, experimentalsys.Errno) {
	if e := f.allow(false); e != 0 {
		return nil, e
	}
	return f.File.Readdir(n)
}

func (f *gatedFile) Stat() (wsys.Stat_t, experimentalsys.Errno) {
	if !f.top {
		if e := f.allow(false); e != 0 {
			return wsys.Stat_t{}, e
		}
	}
	return f.File.Stat()
}

func (f *gatedFile) Read(buf []byte) (int, experimentalsys.Errno) {
	if e := f.allow(false); e != 0 {
		return 0, e
	}
	return f.File.Read(buf)
}

func (f *gatedFile) Pread(buf []byte, off int64) (int, experimentalsys.Errno) {
	if e := f.allow(false); e != 0 {
		return 0, e
	}
	return f.File.Pread(buf, off)
}

func (f *gatedFile) Write(buf []byte) (int, experimentalsys.Errno) {
	if e := f.allow(true); e != 0 {
		return 0, e
	}
	return f.File.Write(buf)
}

func (f *gatedFile) Pwrite(buf []byte, off int64) (int, experimentalsys.Errno) {
	if e := f.allow(true); e != 0 {
		return 0, e
	}
	return f.File.Pwrite(buf, off)
}

func (f *gatedFile) Truncate(size int64) experimentalsys.Errno {
	if e := f.allow(true); e != 0 {
		return e
	}
	return f.File.Truncate(size)
}

func (f *gatedFile) Utimens(atim, mtim int64) experimentalsys.Errno {
	if e := f.allow(true); e != 0 {
		return e
	}
	return f.File.Utimens(atim, mtim)
}

func (g *gatedFS) Lstat(p string) (wsys.Stat_t, experimentalsys.Errno) {
	if !isTop(p) {
		if e := g.allow(false); e != 0 {
			return wsys.Stat_t{}, e
		}
	}
	return g.rootFS.Lstat(p)
}

func (g *gatedFS) Stat(p string) (wsys.Stat_t, experimentalsys.Errno) {
	if !isTop(p) {
		if e := g.allow(false); e != 0 {
			return wsys.Stat_t{}, e
		}
	}
	return g.rootFS.Stat(p)
}

func (g *gatedFS) Readlink(p string) (string, experimentalsys.Errno) {
	if e := g.allow(false); e != 0 {
		return "", e
	}
	return g.rootFS.Readlink(p)
}

func (g *gatedFS) Mkdir(p string, perm fs.FileMode) experimentalsys.Errno {
	if e := g.allow(true); e != 0 {
		return e
	}
	return g.rootFS.Mkdir(p, perm)
}

func (g *gatedFS) Chmod(p string, perm fs.FileMode) experimentalsys.Errno {
	if e := g.allow(true); e != 0 {
		return e
	}
	return g.rootFS.Chmod(p, perm)
}

func (g *gatedFS) Rename(from, to string) experimentalsys.Errno {
	if e := g.allow(true); e != 0 {
		return e
	}
	return g.rootFS.Rename(from, to)
}

func (g *gatedFS) Rmdir(p string) experimentalsys.Errno {
	if e := g.allow(true); e != 0 {
		return e
	}
	return g.rootFS.Rmdir(p)
}

func (g *gatedFS) Unlink(p string) experimentalsys.Errno {
	if e := g.allow(true); e != 0 {
		return e
	}
	return g.rootFS.Unlink(p)
}

func (g *gatedFS) Utimens(p string, atim, mtim int64) experimentalsys.Errno {
	if e := g.allow(true); e != 0 {
		return e
	}
	return g.rootFS.Utimens(p, atim, mtim)
}

// instanceFS is the file system of instance inst: the mounts, shared, and
// the ask mounts, gated for inst. nil for none.
func (c *Compiled) instanceFS(inst *Instance) wazero.FSConfig {
	if len(c.asks) == 0 {
		return c.fsConfig
	}
	fc := c.fsConfig
	if fc == nil {
		fc = wazero.NewFSConfig()
	}
	inst.fileGrants = make([]fileGrant, len(c.asks))
	for idx, a := range c.asks {
		guest := a.GuestPath
		if guest == "" {
			guest = "/"
		}
		g := &gatedFS{rootFS: rootFS{root: a.root, readOnly: a.ReadOnly}, inst: inst, idx: idx, m: a.Mount}
		fc = fc.(sysfs.FSConfig).WithSysFSMount(g, guest)
	}
	return fc
}
