package sources

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// The store keeps the versions that are served or may be served, not
// every version fetched: a tag that moves on every refresh (a registry
// that churns, an author who signs a version a minute) would otherwise
// fill the disk at max_module_size a refresh. A version is kept while a
// link of any manager sharing the store points at it (each registers its
// link folder in Dir/links) or a record of the index names it (what an
// offline start would serve).

// register records m's link folder in Dir/links, so that managers
// sharing the store keep the versions it serves.
func (m *Manager) register() error {
	dir, err := filepath.Abs(m.opts.LinkDir)
	if err != nil {
		return err
	}
	users := filepath.Join(m.opts.Dir, "links")
	if err := os.MkdirAll(users, 0o755); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(dir))
	path := filepath.Join(users, hex.EncodeToString(sum[:16]))
	f, err := os.CreateTemp(users, ".link.*")
	if err != nil {
		return err
	}
	_, werr := f.WriteString(dir)
	if err := errors.Join(werr, f.Close()); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}

// forget removes the stored blob sha, which a link of m no longer points
// at, unless something may still serve it: a link of any registered
// manager, a record of the index, or a fetch of m that stored it and has
// not linked it yet. Called with m.mu held. A manager sharing the store
// that fetches sha at the moment it is forgotten finds it missing and
// fetches it again on its next Sync.
func (m *Manager) forget(sha string) {
	if !hexSHA(sha) || m.pending[sha] > 0 || m.unregistered {
		return
	}
	used, err := m.used(sha)
	if err != nil {
		m.log.Warn("plugin store: a version no longer served is kept: its users could not be read", "sha256", sha, "error", err)
		return
	}
	if used {
		return
	}
	if err := os.Remove(m.blob(sha)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		m.log.Warn("plugin store: a version no longer served not removed", "sha256", sha, "error", err)
		return
	}
	m.log.Debug("plugin store: a version no longer served removed", "sha256", sha)
}

// unpend ends a fetch's hold on sha (m.mu held).
func (m *Manager) unpend(sha string) {
	if m.pending[sha]--; m.pending[sha] <= 0 {
		delete(m.pending, sha)
	}
}

// used reports whether a record or a registered manager's link names sha.
// Registrations whose link folder is gone (a manager that ended) are
// removed.
func (m *Manager) used(sha string) (bool, error) {
	records, err := filepath.Glob(filepath.Join(m.opts.Dir, "index", "*.json"))
	if err != nil {
		return true, err
	}
	for _, p := range records {
		b, err := readBounded(p, 64<<10)
		if errors.Is(err, fs.ErrNotExist) {
			continue // replaced meanwhile
		}
		var r record
		if err != nil || json.Unmarshal(b, &r) != nil {
			return true, fmt.Errorf("record %s: %v", p, err)
		}
		if r.SHA256 == sha {
			return true, nil
		}
	}
	users := filepath.Join(m.opts.Dir, "links")
	regs, err := os.ReadDir(users)
	if err != nil {
		return true, err
	}
	for _, reg := range regs {
		if strings.HasPrefix(reg.Name(), ".") {
			continue
		}
		b, err := readBounded(filepath.Join(users, reg.Name()), 4<<10)
		if err != nil {
			return true, err
		}
		links, err := os.ReadDir(string(b))
		if errors.Is(err, fs.ErrNotExist) {
			_ = os.Remove(filepath.Join(users, reg.Name()))
			continue
		}
		if err != nil {
			return true, fmt.Errorf("link folder %s: %v", b, err)
		}
		for _, l := range links {
			if filepath.Base(linkTarget(filepath.Join(string(b), l.Name()))) == sha {
				return true, nil
			}
		}
	}
	return false, nil
}
