package sandbox

import (
	"errors"
	"io/fs"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// wazero's half of the cache folder: wazero v1.12 keeps the machine code
// it compiles in a folder of [Options.CacheDir] per wazero version and
// platform (wazeroDirName), a file per module, named by the hex of a
// digest of the module's bytes, its interruption setting and the CPU's
// features (wazeroEntry), written to a temporary file (wazeroTemp)
// renamed over it. It removes a file only when another version of it
// wrote it, so every module ever compiled (plugins rebuilt, tags moved,
// a shared cache's uploads) would leave its code for good: this file
// bounds the folder (compiledMaxBytes) and sweeps other versions'.
//
// wazero opens a file at each load that misses its memory and reads it
// whole; one that has gone is a miss, compiled again and written again,
// and one removed after its open is still read whole (Unix). wazero
// never touches a file it reads, and its key needs the CPU's features as
// wazero's internals read them, so wasmtools cannot set a file's time at
// each use as it does its own entries': a file's use is its write, or
// its last access where the file system keeps that (usedAt).

// compiledMaxBytes bounds the bytes of this wazero's folder of machine
// code: past it, the files used least recently go. 2 GiB holds the code
// of some 130 Go plugins (a 4 MB one, the examples', compiles to 16 MB);
// with checkedMaxBytes a cache folder stays within 3 GiB for one build,
// and what older builds and versions used within the week (sweepChecked,
// sweepCompiled).
const compiledMaxBytes = 2 << 30

// wazeroDirName is the folder of the cache folder wazero (v1.12's
// cache.go) keeps this process's machine code in: its version as the
// build's information has it, the architecture, the system.
func wazeroDirName() string {
	return "wazero-" + wazeroVersion() + "-" + runtime.GOARCH + "-" + runtime.GOOS
}

// wazeroVersion is wazero's own version (its internal/version), read
// the same way: the last dependency whose path has wazero's, else the
// main module's version, else "dev" (a test binary's: its folder is not
// the one `serve --prepare` fills).
func wazeroVersion() string {
	missing := func(v string) bool { return v == "" || v == "(devel)" }
	var v string
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if strings.Contains(dep.Path, "github.com/tetratelabs/wazero") {
				v = dep.Version
			}
		}
		if missing(v) {
			v = info.Main.Version
		}
	}
	if missing(v) {
		return "dev"
	}
	return v
}

// wazeroEntry reports whether name is one of wazero's files of machine
// code: 64 hex digits.
func wazeroEntry(name string) bool {
	if len(name) != 64 {
		return false
	}
	for _, c := range name {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// wazeroTemp reports whether name is a temporary file wazero writes a
// file of machine code to before its rename: the name, a dot, digits,
// ".tmp".
func wazeroTemp(name string) bool {
	if len(name) < 64 || !wazeroEntry(name[:64]) {
		return false
	}
	digits, ok := strings.CutSuffix(name[64:], ".tmp")
	if !ok || len(digits) < 2 || digits[0] != '.' {
		return false
	}
	return strings.Trim(digits[1:], "0123456789") == ""
}

// wazeroFolder opens the folder name of the cache folder as a root that
// nothing listed or removed through it can leave: whoever can write a
// shared cache folder could make a folder of it a link to one of the
// user's own, whose files an eviction would remove. The caller closes it.
func (r *Runtime) wazeroFolder(name string) (*os.Root, error) {
	cache, err := os.OpenRoot(r.cacheDir)
	if err != nil {
		return nil, err
	}
	defer cache.Close()
	return cache.OpenRoot(name)
}

// evictCompiledSoon bounds wazero's folder (evictCompiled) on a
// goroutine, which Close waits for, after a compilation that may have
// written to it: one at a time, and once more after the one running if
// compilations ended meanwhile.
func (r *Runtime) evictCompiledSoon() {
	if r.cacheDir == "" {
		return
	}
	r.evictMu.Lock()
	defer r.evictMu.Unlock()
	if r.evicting {
		r.evictAgain = true
		return
	}
	r.evicting = true
	r.sweeping.Add(1)
	go func() {
		defer r.sweeping.Done()
		for {
			r.evictCompiled()
			r.evictMu.Lock()
			again := r.evictAgain
			r.evictAgain, r.evicting = false, again
			r.evictMu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// evictCompiled removes the files of this wazero's folder used least
// recently (usedAt) until what is left is within r.compiledBound, never
// the one used last (a module larger than the bound keeps its code
// until another is written). A file is looked at again just before its
// removal: one written again since the listing (its module compiled
// again) stays. Temporary files are sweepCompiled's; anything but
// wazero's regular files is left as it is.
func (r *Runtime) evictCompiled() {
	dir, err := r.wazeroFolder(wazeroDirName())
	if err != nil {
		return
	}
	defer dir.Close()
	found, err := fs.ReadDir(dir.FS(), ".")
	if err != nil {
		return
	}
	entries, total := leastUsedFirst(found, wazeroEntry, dir.Lstat, usedAt)
	if total <= r.compiledBound || len(entries) < 2 {
		return
	}
	removed := 0
	for _, e := range entries[:len(entries)-1] {
		if total <= r.compiledBound {
			break
		}
		if fi, err := dir.Lstat(e.name); err != nil || !fi.Mode().IsRegular() || !usedAt(fi).Equal(e.used) {
			continue
		}
		if err := dir.Remove(e.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		total -= e.size
		removed++
	}
	if removed > 0 {
		r.log.Debug("compilation cache: machine code used least recently removed", "files", removed, "bound", r.compiledBound)
	}
}

// sweepCompiled removes, in the folders of other wazero versions and
// platforms, wazero's files not used for checkedMaxAge (an upgrade
// leaves the old version's behind), and in every wazero folder its
// temporary files older than checkedTempMaxAge (a write a crash left
// half done). The folders themselves stay: wazero makes its folder only
// as its cache is made, so a process of that version still running (a
// rolling upgrade, another platform sharing the volume) would fail to
// write to it, where a file removed is only compiled again.
func (r *Runtime) sweepCompiled() {
	cache, err := os.OpenRoot(r.cacheDir)
	if err != nil {
		return
	}
	found, err := fs.ReadDir(cache.FS(), ".")
	cache.Close()
	if err != nil {
		return
	}
	mine := wazeroDirName()
	for _, e := range found {
		if !strings.HasPrefix(e.Name(), "wazero-") || !e.IsDir() {
			continue
		}
		dir, err := r.wazeroFolder(e.Name())
		if err != nil {
			continue
		}
		files, _ := fs.ReadDir(dir.FS(), ".")
		for _, f := range files {
			var maxAge time.Duration
			switch {
			case wazeroTemp(f.Name()):
				maxAge = checkedTempMaxAge
			case wazeroEntry(f.Name()) && e.Name() != mine:
				maxAge = checkedMaxAge
			default:
				continue
			}
			if fi, err := dir.Lstat(f.Name()); err == nil && fi.Mode().IsRegular() && time.Since(usedAt(fi)) > maxAge {
				_ = dir.Remove(f.Name())
			}
		}
		dir.Close()
	}
}
