package sandbox

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// The checked-module cache keeps, beside wazero's machine code in
// [Options.CacheDir], what [Runtime.Compile]'s check and rewriting made of
// a module: the bytes given to wazero and what the check learnt for
// snapshots. A start from a warm cache then skips the checker's and the
// rewriter's passes over the module: some 60% of a warm load of a 4 MB Go
// plugin (0.23 s), 1 s of its 1.9 s under the race detector.
//
// An entry is keyed by the module's digest, the policy's module limits,
// the interruption, and the digest of this package's sources as built
// (sources, below): a host built from a changed checker or rewriter never
// reads an older one's entries. An entry ends with the digest of what
// precedes it, so a torn or altered file is a miss, written again. Whoever
// can write the cache folder can already plant machine code in wazero's
// half of it: docs/SECURITY.md asks for a folder only wasmtools writes.

// sources is this package's code, which its digest keys the entries by.
// An embed pattern cannot leave files out, and *.go carried the tests
// too (0.3 MB of every binary, counted by no digest): every test's
// name ends in t.go, so *[^t].go takes every file of the code but those
// whose name ends so, named one by one. TestSourcesEmbeddedAreTheCode
// holds this to the package's folder (a file of the code not embedded
// would change the checker or the rewriter without changing the key).
//
//go:embed *[^t].go interrupt.go snapshot.go
var sources embed.FS

// sourcesDigest is the digest of this package's Go files, as built.
var sourcesDigest = sync.OnceValue(func() string { return digestSources(sources) })

// digestSources returns the digest of the Go files of fsys but tests:
// a test file changes no check or rewriting, and counted, each edit of
// one made the tests' shared cache a folder of entries anew. (A test
// that set a hook of the checker's or the rewriter's would have to be
// counted, or key its entries.)
func digestSources(fsys fs.FS) string {
	h := sha256.New()
	names, _ := fs.Glob(fsys, "*.go")
	sort.Strings(names)
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		b, _ := fs.ReadFile(fsys, n)
		fmt.Fprintf(h, "%s %d\n", n, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkedMagic starts every entry.
const checkedMagic = "wasmtools-checked-1\n"

// checkedPrefix names the folders of entries in the cache folder, one per
// build of this package's sources.
const checkedPrefix = "wasmtools-checked-"

// checkedMaxAge is how long a folder of another build's entries is kept
// after it was last written: an upgrade leaves the old one behind.
const checkedMaxAge = 7 * 24 * time.Hour

// checkedMaxBytes bounds the bytes of this build's folder of entries:
// past it, a write removes the entries used least recently (their time,
// set by each read and write), so that modules replaced (plugins
// rebuilt, tags moved) do not fill the disk. 1 GiB holds the entries of
// some 250 plugins of a Go plugin's 4 MB, and at least 7 of the 64 MiB
// a module may be by default. wazero's half of the folder (its machine
// code) has a bound of its own, compiledMaxBytes. Both are defaults:
// Options.CheckedCacheBytes and CompiledCacheBytes (the configuration's
// [cache]) set others.
const checkedMaxBytes = 1 << 30

// checked is what Compile's check and rewriting made of a module.
type checked struct {
	wasm []byte // as given to wazero (before splitCustom)
	snap checkedSnap
}

// checkedSnap is the part of [snapModule] the check fills.
type checkedSnap struct {
	Refusal  string   `json:"refusal,omitempty"`
	Globals  []string `json:"globals,omitempty"`
	HasStart bool     `json:"hasStart,omitempty"`
}

func (s checkedSnap) module() *snapModule {
	return &snapModule{refusal: s.Refusal, globals: s.Globals, hasStart: s.HasStart}
}

// checkedKey returns the entry's file name for a module of digest sum
// compiled under limits, instrumented (flag) or not.
func checkedKey(sum [32]byte, limits ModuleLimits, flag bool) string {
	h := sha256.New()
	h.Write(sum[:])
	fmt.Fprintf(h, "%+v %v", limits.withDefaults(), flag)
	return hex.EncodeToString(h.Sum(nil))
}

// checkedTempMaxAge is how long an entry's temporary file (storeChecked)
// is kept: older, it is a write a crash left half done, not one under way.
const checkedTempMaxAge = 24 * time.Hour

// checkedDir returns the folder of this build's entries, "" without a
// disk cache. The first call starts the sweep (sweepChecked, and
// sweepCompiled for wazero's folders) on a goroutine of its own, which
// Close waits for: run inside that call, a large or slow cache folder
// held the first compilation and every one begun meanwhile, a starting
// server's loads.
func (r *Runtime) checkedDir() string {
	if r.cacheDir == "" {
		return ""
	}
	mine := filepath.Join(r.cacheDir, checkedPrefix+sourcesDigest()[:16])
	r.checkedOnce.Do(func() {
		r.sweeping.Add(1)
		go func() {
			defer r.sweeping.Done()
			if r.sweepHook != nil {
				r.sweepHook()
			}
			r.sweepChecked(mine)
			r.sweepCompiled()
		}()
	})
	return mine
}

// sweepChecked removes other builds' folders of entries left unwritten
// for checkedMaxAge, and this build's temporary files (in mine) older
// than checkedTempMaxAge. What it misses (a file it cannot remove) waits
// for the next runtime's.
func (r *Runtime) sweepChecked(mine string) {
	// The folders are read, not globbed: a path is no pattern ("[", "*"
	// in it matched other folders, and not this one).
	sweep := func(dir, prefix string, maxAge time.Duration) {
		found, _ := os.ReadDir(dir)
		for _, e := range found {
			p := filepath.Join(dir, e.Name())
			if !strings.HasPrefix(e.Name(), prefix) || p == mine {
				continue
			}
			if fi, err := os.Stat(p); err == nil && time.Since(fi.ModTime()) > maxAge {
				os.RemoveAll(p)
			}
		}
	}
	sweep(r.cacheDir, checkedPrefix, checkedMaxAge)
	sweep(mine, ".", checkedTempMaxAge)
}

// checkedMaxEntry bounds an entry of a module of at most maxSize bytes:
// what loadChecked reads, and storeChecked writes. The rewriting makes a
// plugin a little larger; a module it makes larger than this (a hostile
// one of tiny functions or loops, each given the interruption's check:
// 7 times as large) is not kept, and checked at each start.
func checkedMaxEntry(maxSize uint64) int64 {
	const most = math.MaxInt64 / 4
	return int64(min(maxSize, most))*2 + 1<<20
}

// loadChecked returns the entry of key, if there is a sound one. maxSize
// is the module limit's, for checkedMaxEntry.
func (r *Runtime) loadChecked(key string, maxSize uint64) (*checked, bool) {
	dir := r.checkedDir()
	if dir == "" {
		return nil, false
	}
	r.checkedMu.Lock()
	r.checkedReading[key]++
	r.checkedMu.Unlock()
	b, err := r.readChecked(filepath.Join(dir, key), maxSize)
	r.checkedMu.Lock()
	if r.checkedReading[key]--; r.checkedReading[key] == 0 {
		delete(r.checkedReading, key)
	}
	r.checkedMu.Unlock()
	if err != nil {
		return nil, false
	}
	c, err := decodeChecked(b)
	if err != nil {
		r.log.Debug("checked-module cache: entry ignored", "entry", key, "error", err)
		return nil, false
	}
	// Used now: the bound removes it after those used before.
	now := time.Now()
	_ = os.Chtimes(filepath.Join(dir, key), now, now)
	return c, true
}

// readChecked reads the entry at path, at most checkedMaxEntry of
// maxSize.
func (r *Runtime) readChecked(path string, maxSize uint64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if r.checkedReadHook != nil {
		r.checkedReadHook()
	}
	return io.ReadAll(io.LimitReader(f, checkedMaxEntry(maxSize)))
}

// storeChecked writes c as key's entry, unless it is larger than
// loadChecked reads (checkedMaxEntry of maxSize): written at each start,
// never read. A failure costs the next start the check, never the
// plugin: it is logged at debug level, as wazero's half of the cache
// reports its own.
func (r *Runtime) storeChecked(key string, c *checked, maxSize uint64) {
	dir := r.checkedDir()
	if dir == "" {
		return
	}
	b := encodeChecked(c)
	if int64(len(b)) > checkedMaxEntry(maxSize) {
		r.log.Debug("checked-module cache: entry not written, larger than a start reads", "entry", key, "size", len(b))
		return
	}
	err := func() error {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		tmp, err := os.CreateTemp(dir, "."+key+".*")
		if err != nil {
			return err
		}
		defer os.Remove(tmp.Name())
		if _, err := tmp.Write(b); err != nil {
			tmp.Close()
			return err
		}
		if err := tmp.Close(); err != nil {
			return err
		}
		return os.Rename(tmp.Name(), filepath.Join(dir, key))
	}()
	if err != nil {
		r.log.Debug("checked-module cache: entry not written", "entry", key, "error", err)
		return
	}
	r.evictChecked(dir, key)
}

// evictChecked removes the entries of dir used least recently (their
// time: each read and write sets it) until what is left is within
// r.checkedBound, sparing kept (the entry just written) and the entries
// this runtime is reading. Another process's read of one removed goes
// on, on Unix, with the file it opened; one that opens it after finds
// none, and checks its module afresh. Temporary files are sweepChecked's.
func (r *Runtime) evictChecked(dir, kept string) {
	found, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	ours := func(name string) bool { return !strings.HasPrefix(name, ".") }
	stat := func(name string) (fs.FileInfo, error) { return os.Lstat(filepath.Join(dir, name)) }
	entries, total := leastUsedFirst(found, ours, stat, fs.FileInfo.ModTime)
	if total <= r.checkedBound {
		return
	}
	for _, e := range entries {
		if total <= r.checkedBound {
			break
		}
		if e.name == kept {
			continue
		}
		// Under checkedMu, so that no read of this runtime opens it
		// between the look and the removal.
		r.checkedMu.Lock()
		removed := false
		if r.checkedReading[e.name] == 0 {
			err := os.Remove(filepath.Join(dir, e.name))
			removed = err == nil || errors.Is(err, fs.ErrNotExist)
		}
		r.checkedMu.Unlock()
		if removed {
			total -= e.size
		}
	}
}

// cacheFile is a file of the cache folder as an eviction weighs it.
type cacheFile struct {
	name string
	size int64
	used time.Time
}

// leastUsedFirst returns the regular files of found that ours names, as
// stat (an lstat) and used see them, the least recently used first, and
// their total size. A file removed meanwhile is left out.
func leastUsedFirst(found []fs.DirEntry, ours func(string) bool, stat func(string) (fs.FileInfo, error), used func(fs.FileInfo) time.Time) ([]cacheFile, int64) {
	var files []cacheFile
	var total int64
	for _, e := range found {
		if !ours(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		fi, err := stat(e.Name())
		if err != nil {
			continue
		}
		files = append(files, cacheFile{e.Name(), fi.Size(), used(fi)})
		total += fi.Size()
	}
	sort.Slice(files, func(i, j int) bool { return files[i].used.Before(files[j].used) })
	return files, total
}

// encodeChecked lays c out as magic, the snapshot facts' JSON (its length
// first), the bytes, and the digest of all that.
func encodeChecked(c *checked) []byte {
	meta, _ := json.Marshal(c.snap)
	var b bytes.Buffer
	b.WriteString(checkedMagic)
	binary.Write(&b, binary.LittleEndian, uint32(len(meta)))
	b.Write(meta)
	b.Write(c.wasm)
	sum := sha256.Sum256(b.Bytes())
	b.Write(sum[:])
	return b.Bytes()
}

var errCheckedEntry = errors.New("not a sound entry")

func decodeChecked(b []byte) (*checked, error) {
	if len(b) < len(checkedMagic)+4+sha256.Size || string(b[:len(checkedMagic)]) != checkedMagic {
		return nil, errCheckedEntry
	}
	body, sum := b[:len(b)-sha256.Size], b[len(b)-sha256.Size:]
	if got := sha256.Sum256(body); !bytes.Equal(got[:], sum) {
		return nil, fmt.Errorf("%w: digest mismatch", errCheckedEntry)
	}
	rest := body[len(checkedMagic):]
	n := binary.LittleEndian.Uint32(rest)
	rest = rest[4:]
	if uint64(n) > uint64(len(rest)) {
		return nil, errCheckedEntry
	}
	c := &checked{wasm: rest[n:]}
	if err := json.Unmarshal(rest[:n], &c.snap); err != nil {
		return nil, fmt.Errorf("%w: %v", errCheckedEntry, err)
	}
	if err := checkHeader(c.wasm); err != nil {
		return nil, fmt.Errorf("%w: %v", errCheckedEntry, err)
	}
	return c, nil
}
