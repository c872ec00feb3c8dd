package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/wasmtools/wasmtools/plugins"
)

// The store keeps the versions that are served or may be served, not
// every version fetched: a tag that moves on every refresh (a registry
// that churns, an author who signs a version a minute) would otherwise
// fill the disk at max_module_size a refresh. A version is kept while a
// link of any manager sharing the store points at it (each registers its
// link folder in Dir/links) or a record of the index names it (what an
// offline start would serve).
//
// Managers sharing the store may not share a view of the file system
// (two containers mounting one volume, a service with a private /tmp):
// a link folder not found from here may be serving elsewhere. So a
// registration names its manager's view (fsView) and is a lease, renewed
// on every Sync and every renewEvery: one of this view whose folder is
// gone is of a manager that ended; one whose folder cannot be seen from
// here keeps every version (what it serves is unknown) until it lapses,
// unrenewed for registrationLapse.
//
// A version is considered when a link of m moves off it (forget), and
// every Sync sweeps the store (sweep): what forget kept while removal was
// off would otherwise stay for good, as would a version fetched and never
// linked and a write a crash left half done. Another process's fetch may
// have stored a version and not yet linked or recorded it, which nothing
// here can see, so the sweep leaves what is younger than strayAge.

const (
	// renewEvery is how often a manager renews its registration besides
	// on every Sync (KeepRegistered).
	renewEvery = time.Hour
	// registrationLapse is how long a registration unrenewed is taken for
	// one of a manager that ended, wherever its folder is. A week: far
	// beyond renewEvery, a clock that differs between machines sharing a
	// volume and a process or machine paused over a weekend, and all it
	// costs is the store's cleanup held off for that long after a manager
	// that could not be seen ended without Close (a crash, kill -9).
	registrationLapse = 7 * 24 * time.Hour
	// strayAge is how old a stored version nothing names must be for a
	// sweep to remove it. Another process stores a version moments
	// before it records and links it; a day is far beyond that, a
	// process paused between the two, and a clock that differs between
	// machines sharing a volume, and all it costs is a version kept a
	// day longer.
	strayAge = 24 * time.Hour
	// recordLapse is how long a record of settings no source of this
	// manager has must go unrenewed for a sweep to remove it (and the
	// hold it has on its version). Renewals stop when the server whose
	// source it is stops, and the record is what that server's next
	// start serves without the network; a store is shared by servers
	// run now and then (the default --source-dir is one a user: every
	// project's stdio server, started by its client), so not strayAge,
	// which left one stopped three days nothing to serve offline. A
	// month: all it costs is a version of each setting left behind (a
	// source removed, a pin or key changed) kept that long.
	recordLapse = 30 * 24 * time.Hour
)

// registration is the content of a file of Dir/links.
type registration struct {
	Dir  string `json:"dir"`
	View string `json:"view,omitempty"`
}

// register records m's link folder and view in Dir/links, so that
// managers sharing the store keep the versions it serves. Its name is of
// both: managers of two views may have folders of the same path.
func (m *Manager) register() error {
	dir, err := filepath.Abs(m.opts.LinkDir)
	if err != nil {
		return err
	}
	body, err := json.Marshal(registration{Dir: dir, View: m.view})
	if err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(m.view + "\x00" + dir))
	name := hex.EncodeToString(sum[:16])
	if err := m.writeStore("links", name, ".link.", body); err != nil {
		return err
	}
	path := filepath.Join(m.opts.Dir, "links", name)
	m.mu.Lock()
	m.registered = path
	m.mu.Unlock()
	return nil
}

// renew renews m's registration (its modification time), writing it
// again if another manager removed it (took m for ended after a pause
// past registrationLapse).
func (m *Manager) renew() {
	m.reg.Lock()
	defer m.reg.Unlock()
	m.mu.Lock()
	path, off := m.registered, m.unregistered
	specs := m.specsLocked()
	m.mu.Unlock()
	if off {
		return
	}
	m.renewRecords(specs)
	now := time.Now()
	links, err := m.storeRoot("links")
	if err == nil {
		err = links.Chtimes(filepath.Base(path), now, now)
		links.Close()
	}
	if errors.Is(err, fs.ErrNotExist) {
		err = m.register()
	}
	if err != nil {
		m.log.Warn("plugin store: the link folder's registration not renewed", "registration", path, "error", err)
	}
}

// KeepRegistered renews the link folder's registration in the store
// every hour until ctx ends, for a manager that may go days without a
// Sync (no refresh interval): managers sharing the store that cannot see
// its link folder take a registration unrenewed for a week for one of a
// manager that ended, and remove the versions it serves.
func (m *Manager) KeepRegistered(ctx context.Context) {
	t := time.NewTicker(renewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.renew()
		}
	}
}

// Close removes the link folder's registration from the store: managers
// sharing the store may then remove what it links, wherever they are.
// Call it once its links are no longer served; the link folder is the
// caller's to remove. Close is idempotent; the manager removes no
// version after it, nor registers again.
func (m *Manager) Close() error {
	m.reg.Lock()
	defer m.reg.Unlock()
	m.mu.Lock()
	path, off := m.registered, m.unregistered
	m.unregistered = true
	m.mu.Unlock()
	if off {
		return nil
	}
	links, err := m.storeRoot("links")
	if err == nil {
		err = links.Remove(filepath.Base(path))
		links.Close()
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sources: unregister the link folder: %w", err)
	}
	return nil
}

// forget removes the stored blob sha, which a link of m no longer points
// at, unless something may still serve it: a link of any registered
// manager, a record of the index, or a fetch of m that stored it and has
// not linked it yet. A manager sharing the store that fetches sha at the
// moment it is forgotten finds it missing and fetches it again on its
// next Sync.
//
// Called without m.mu: reading the index and the link folders (a network
// file system, thousands of versions) under it held up Status, Lookup
// and Check, which every load of a plugin calls. What m itself may serve
// meanwhile is decided under m.mu, with the removal (keepsLocked): a
// fetch of m (of the same Sync, sources are fetched in parallel) marks
// sha pending before storing it, and links it and sets its status under
// m.mu, so one that stored or linked sha after the reading is seen then.
// The reading is for other managers' links and records, never guarded
// by m.mu.
func (m *Manager) forget(sha string) {
	m.mu.Lock()
	keep := m.keepsLocked(sha)
	m.mu.Unlock()
	if keep {
		return
	}
	named, unseen, said, err := m.users()
	if err != nil {
		m.log.Warn("plugin store: a version no longer served is kept: its users could not be read", "sha256", sha, "error", err)
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sayUnseenLocked(said)
	if unseen || named[sha] || m.keepsLocked(sha) {
		return
	}
	blobs, err := m.storeRoot(filepath.Join("blobs", "sha256"))
	if err == nil {
		err = blobs.Remove(sha)
		blobs.Close()
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("plugin store: a version no longer served not removed", "sha256", sha, "error", err)
		return
	}
	m.log.Debug("plugin store: a version no longer served removed", "sha256", sha)
}

// keepsLocked reports whether forget must keep sha whatever the store
// says: not a blob's name, removal off, or m's own (a fetch's, not
// linked yet, or the version a source of m serves). m.mu is held.
func (m *Manager) keepsLocked(sha string) bool {
	if !hexSHA(sha) || m.pending[sha] > 0 || m.unregistered {
		return true
	}
	for _, e := range m.ents {
		if e.status.SHA256 == sha {
			return true
		}
	}
	return false
}

// sweep removes every stored blob that nothing may serve, as forget
// does, and that is older than strayAge, with the temporary files of
// writes that old: what forget kept while removal was off (a live
// registration not seen from here), a fetch's version never linked (its
// source removed meanwhile) and the half-written blob of a crash, none of
// which any link's move would reconsider. Before that it removes the
// index's records of settings no source of m is configured with (a
// source removed from the configuration, or given another pin, key or
// source) unrenewed for recordLapse, and the temporary files a crash left
// of records and registrations (".record.*", ".link.*") older than
// strayAge.
//
// Called by Sync once its fetches are done, without m.mu: reading the
// store's folders (a network file system, thousands of versions) under
// it held up Status, Lookup and Check, which every load of a plugin
// calls. It needs none of it: Sync holds m.sync, so no fetch of m stores
// or links a version meanwhile (Restore holds m.sync too, Prune only
// removes links), and what m.mu guards that it reads (pending, which is
// empty then, unregistered, the sources' specs) is copied under it. A
// Close meanwhile, whose links are no longer served, lets the sweep go
// on as another manager's would. Another process's writes were never
// guarded by m.mu: strayAge is what keeps them.
func (m *Manager) sweep() {
	m.mu.Lock()
	off := m.unregistered
	pending := maps.Clone(m.pending)
	specs := m.specsLocked()
	m.mu.Unlock()
	if off {
		return
	}
	m.sweepTemps("index", ".record.")
	m.sweepTemps("links", ".link.")
	m.sweepRecords(recordKeys(specs))
	named, unseen, said, err := m.users()
	m.mu.Lock()
	m.sayUnseenLocked(said)
	m.mu.Unlock()
	if err != nil {
		m.log.Warn("plugin store: versions no longer served are kept: their users could not be read", "error", err)
		return
	}
	if unseen {
		return
	}
	blobs, err := m.storeRoot(filepath.Join("blobs", "sha256"))
	var ents []fs.DirEntry
	if err == nil {
		defer blobs.Close()
		ents, err = fs.ReadDir(blobs.FS(), ".")
	}
	if errors.Is(err, fs.ErrNotExist) {
		return // nothing stored yet (made by the first write)
	}
	if err != nil {
		m.log.Warn("plugin store: versions no longer served are kept: the store could not be read", "error", err)
		return
	}
	removed := 0
	for _, e := range ents {
		// store's temporary file of sha is ".SHA.RANDOM".
		sha, temp := e.Name(), strings.HasPrefix(e.Name(), ".")
		if temp {
			sha, _, _ = strings.Cut(sha[1:], ".")
		}
		if !hexSHA(sha) || pending[sha] > 0 || (!temp && named[sha]) {
			continue
		}
		if m.removeOld(blobs, e.Name(), strayAge) {
			removed++
		}
	}
	if removed > 0 {
		m.log.Info("plugin store: versions no longer served removed", "removed", removed, "olderThan", strayAge)
	}
}

// storeRoot opens the store's folder sub (a path under Dir) as a root
// that nothing read or removed through it can leave: whoever can write a
// store shared by several users could replace one of its folders with a
// symbolic link to a folder of the user a sweep runs as (~/.docker),
// whose files the sweep would remove. A link that stays inside the store
// is followed. The caller closes it.
func (m *Manager) storeRoot(sub string) (*os.Root, error) {
	store, err := os.OpenRoot(m.opts.Dir)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	return store.OpenRoot(sub)
}

// readStore reads the file name of the store's folder sub as plugin
// files are read (a regular file of at most max bytes), through the
// store's root (readIn).
func (m *Manager) readStore(sub, name string, max uint64) ([]byte, error) {
	dir, err := m.storeRoot(sub)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return readIn(dir, name, max)
}

// readIn reads the file name of dir, one of the store's folders, as
// plugin files are read, through dir's root: whoever can write a store
// shared by several users could replace a record, a registration or a
// blob with a symbolic link to a file elsewhere, which an offline start
// would serve, or whose contents the sweep would take for what keeps a
// version. A link that leads out of the store, or to no regular file, is
// fs.ErrNotExist: the store writes none (a link inside is followed, as
// its folders' are).
func readIn(dir *os.Root, name string, max uint64) ([]byte, error) {
	b, err := plugins.ReadFileIn(dir, name, max)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		if info, lerr := dir.Lstat(name); lerr == nil && info.Mode()&fs.ModeSymlink != 0 {
			return nil, fmt.Errorf("%s: not the store's (a link out of it, or to no regular file: %v): %w", filepath.Join(dir.Name(), name), err, fs.ErrNotExist)
		}
	}
	return b, err
}

// writeStore writes body to the file name of the store's folder sub
// (made if missing) through the store's root: whoever can write a store
// shared by several users could replace one of its folders with a
// symbolic link to a folder of the user the manager runs as, where a
// registration, a record or a blob would otherwise be written. It is
// written to a temporary file (temp and a random number, which the sweep
// removes if a crash leaves it) renamed over name, so that a reader never
// sees half of it.
func (m *Manager) writeStore(sub, name, temp string, body []byte) error {
	store, err := os.OpenRoot(m.opts.Dir)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.MkdirAll(sub, 0o755); err != nil {
		return err
	}
	dir, err := store.OpenRoot(sub)
	if err != nil {
		return err
	}
	defer dir.Close()
	var f *os.File
	var tmp string
	for range 10000 { // as os.CreateTemp
		tmp = temp + strconv.FormatUint(uint64(rand.Uint32()), 10)
		f, err = dir.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	_, werr := f.Write(body)
	if err := errors.Join(werr, f.Close()); err != nil {
		_ = dir.Remove(tmp)
		return err
	}
	if err := dir.Rename(tmp, name); err != nil {
		_ = dir.Remove(tmp)
		return err
	}
	return nil
}

// removeOld removes the regular file name of dir if it is older than
// age, and reports whether it did. The age is checked just before
// the removal: a blob stored again (a tag moved back), a record written
// again, is renamed over the old one, with a new time.
func (m *Manager) removeOld(dir *os.Root, name string, age time.Duration) bool {
	info, err := dir.Lstat(name)
	if err != nil || !info.Mode().IsRegular() || time.Since(info.ModTime()) < age {
		return false
	}
	if err := dir.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("plugin store: a file no longer used not removed", "file", filepath.Join(dir.Name(), name), "error", err)
		return false
	}
	return true
}

// sweepTemps removes the temporary files (named prefix + random) in the
// store's folder sub older than strayAge: a write a crash left half
// done, its rename never made. Nothing writes one for longer than
// moments.
func (m *Manager) sweepTemps(sub, prefix string) {
	dir, err := m.storeRoot(sub)
	if err != nil {
		return // no records or registrations yet; the blob sweep says the rest
	}
	defer dir.Close()
	ents, err := fs.ReadDir(dir.FS(), ".")
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) && m.removeOld(dir, e.Name(), strayAge) {
			m.log.Debug("plugin store: a write left half done removed", "file", filepath.Join(dir.Name(), e.Name()))
		}
	}
}

// sweepRecords removes the index's records whose settings (recordKey) no
// source of m is configured with, unrenewed for recordLapse. Managers
// sharing the store do not see one another's configurations: a record is
// renewed (its time) by every verified fetch that writes it and by renew,
// so that one of another live manager's sources is kept, and one that no
// manager has used for recordLapse goes, with it the hold it had on its
// version.
func (m *Manager) sweepRecords(configured map[string]bool) {
	dir, err := m.storeRoot("index")
	if err != nil {
		return
	}
	defer dir.Close()
	ents, err := fs.ReadDir(dir.FS(), ".")
	if err != nil {
		return
	}
	removed := 0
	for _, e := range ents {
		// A record's name is a recordKey: nothing else is the index's.
		key, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !hexSHA(key) || configured[key] {
			continue
		}
		if m.removeOld(dir, e.Name(), recordLapse) {
			removed++
		}
	}
	if removed > 0 {
		m.log.Info("plugin store: records of sources no longer configured removed", "removed", removed, "olderThan", recordLapse)
	}
}

// specsLocked returns the specs of m's sources. m.mu is held.
func (m *Manager) specsLocked() []Spec {
	specs := make([]Spec, 0, len(m.ents))
	for _, e := range m.ents {
		specs = append(specs, e.spec)
	}
	return specs
}

// recordKeys is the set of specs' record keys (recordKey reads each
// public key: not under m.mu).
func recordKeys(specs []Spec) map[string]bool {
	keys := map[string]bool{}
	for _, s := range specs {
		keys[recordKey(s)] = true
	}
	return keys
}

// renewRecords renews (the time of) the records of m's sources, so that
// managers sharing the store keep them (sweepRecords). Not under m.mu.
// Through the store's root, and only a regular file: a record replaced
// by a link to a file elsewhere (whoever can write a shared store) would
// have that file's time set.
func (m *Manager) renewRecords(specs []Spec) {
	index, err := m.storeRoot("index")
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("plugin store: the sources' records not renewed", "error", err)
		}
		return
	}
	defer index.Close()
	now := time.Now()
	for key := range recordKeys(specs) {
		name := key + ".json"
		if info, err := index.Lstat(name); err != nil || !info.Mode().IsRegular() {
			continue // none, or not one the store wrote
		}
		if err := index.Chtimes(name, now, now); err != nil && !errors.Is(err, fs.ErrNotExist) {
			m.log.Warn("plugin store: a source's record not renewed", "record", filepath.Join(index.Name(), name), "error", err)
		}
	}
}

// unpend ends a fetch's hold on sha (m.mu held).
func (m *Manager) unpend(sha string) {
	if m.pending[sha]--; m.pending[sha] <= 0 {
		delete(m.pending, sha)
	}
}

// users reads what may serve a version: the versions named by a record
// or by a link of a registered manager of this view, and whether a live
// registration's link folder cannot be seen from here (what it serves is
// unknown: unseen, so every version is kept). Registrations of managers
// that ended are removed: those unrenewed for registrationLapse, and those
// of this view whose folder is gone. The registrations not seen are
// returned for sayUnseen.
func (m *Manager) users() (named map[string]bool, unseen bool, said []unseenReg, err error) {
	named = map[string]bool{}
	index, err := m.storeRoot("index")
	var records []fs.DirEntry
	if err == nil {
		defer index.Close()
		records, err = fs.ReadDir(index.FS(), ".")
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, true, nil, err
	}
	for _, e := range records {
		key, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !hexSHA(key) {
			continue // not a record (recordKey): none is read from it
		}
		p := filepath.Join(index.Name(), e.Name())
		b, err := readIn(index, e.Name(), maxRecord)
		if errors.Is(err, fs.ErrNotExist) {
			continue // replaced meanwhile, or not the store's
		}
		var r record
		if err != nil || json.Unmarshal(b, &r) != nil {
			return nil, true, nil, fmt.Errorf("record %s: %v", p, err)
		}
		named[r.SHA256] = true
	}
	users := filepath.Join(m.opts.Dir, "links")
	// Registrations are removed through it: it must be the store's.
	usersRoot, err := m.storeRoot("links")
	if err != nil {
		return nil, true, nil, err
	}
	defer usersRoot.Close()
	regs, err := fs.ReadDir(usersRoot.FS(), ".")
	if err != nil {
		return nil, true, nil, err
	}
	for _, reg := range regs {
		if strings.HasPrefix(reg.Name(), ".") {
			continue
		}
		path := filepath.Join(users, reg.Name())
		info, err := reg.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, true, nil, err
		}
		if time.Since(info.ModTime()) > registrationLapse {
			_ = usersRoot.Remove(reg.Name())
			continue
		}
		b, err := readIn(usersRoot, reg.Name(), 4<<10)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile, or not the store's
		}
		if err != nil {
			return nil, true, nil, err
		}
		var r registration
		if json.Unmarshal(b, &r) != nil {
			r = registration{Dir: string(b)} // a path alone: no view named
		}
		var links []os.DirEntry
		if m.view != "" && r.View == m.view {
			links, err = os.ReadDir(r.Dir)
			if errors.Is(err, fs.ErrNotExist) {
				_ = usersRoot.Remove(reg.Name()) // a manager that ended
				continue
			}
		}
		if m.view == "" || r.View != m.view || err != nil {
			unseen = true
			said = append(said, unseenReg{path, r.Dir, err})
			continue
		}
		for _, l := range links {
			named[filepath.Base(linkTarget(filepath.Join(r.Dir, l.Name())))] = true
		}
	}
	return named, unseen, said, nil
}

// unseenReg is a registration whose link folder cannot be seen from here.
type unseenReg struct {
	path, dir string
	err       error
}

// sayUnseenLocked says in the log, once each, that regs' link folders cannot be
// seen from here. m.mu is held.
func (m *Manager) sayUnseenLocked(regs []unseenReg) {
	for _, r := range regs {
		if m.unseen[r.path] {
			continue
		}
		m.unseen[r.path] = true
		attrs := []any{"folder", r.dir, "registration", r.path}
		if r.err != nil {
			attrs = append(attrs, "error", r.err)
		}
		m.log.Warn("plugin store: versions no longer served are kept: another process's link folder cannot be seen from here (another container or file system view), so what it serves is unknown", attrs...)
	}
}
