// Package grantstore keeps the run-time grant answers that outlive a
// session (issue 30): per subject, in a JSON file an operator names
// ([grants] remember_file), so that "always allow" and "deny" hold across
// sessions and restarts until revoked with `wasmtools grants revoke`.
//
// The file is the one copy: every lookup reads it again when it changed on
// disk (so a revocation by the command takes effect at the next lookup of
// a running server), and every change is a read-modify-write under an
// exclusive lock on FILE.lock, written to a temporary file and renamed
// over FILE (mode 0600), so a reader never sees half a file and two
// writers never lose each other's change.
package grantstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// MaxEntries bounds the answers a file keeps; past it, a new answer is
// refused (the session still remembers it).
const MaxEntries = 10000

// Key is what an answer is about: a subject's grant of one target to one
// plugin version.
type Key struct {
	Subject string `json:"subject"`
	Plugin  string `json:"plugin"`
	SHA256  string `json:"sha256"`
	Kind    string `json:"kind"`
	// Target is the host:port, "folder mode" or secret name.
	Target string `json:"target"`
}

// Entry is one answer.
type Entry struct {
	Key
	Allowed bool      `json:"allowed"`
	Time    time.Time `json:"time"`
}

// ErrFull is matched by the error of a Set past MaxEntries.
var ErrFull = errors.New("grantstore: the file holds the most answers it may")

// File is the answers file. Safe for concurrent use, also by several
// processes.
type File struct {
	path string

	mu      sync.Mutex
	entries map[Key]Entry
	stamp   stamp // of the file the entries were read from
}

type stamp struct {
	mod  time.Time
	size int64
	ok   bool
}

type fileFormat struct {
	Version int     `json:"version"`
	Grants  []Entry `json:"grants"`
}

// Open returns the answers file at path, reading it if it exists.
func Open(path string) (*File, error) {
	f := &File{path: path}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refresh(); err != nil {
		return nil, err
	}
	return f, nil
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// refresh reads the file again if it changed since it was read. The
// caller holds f.mu.
func (f *File) refresh() error {
	st, err := os.Stat(f.path)
	if errors.Is(err, fs.ErrNotExist) {
		f.entries, f.stamp = map[Key]Entry{}, stamp{}
		return nil
	}
	if err != nil {
		return fmt.Errorf("grantstore: %w", err)
	}
	now := stamp{mod: st.ModTime(), size: st.Size(), ok: true}
	if f.entries != nil && now == f.stamp {
		return nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("grantstore: %w", err)
	}
	var ff fileFormat
	if err := json.Unmarshal(b, &ff); err != nil {
		return fmt.Errorf("grantstore: %s: %v", f.path, err)
	}
	if ff.Version != 1 {
		return fmt.Errorf("grantstore: %s: unknown version %d", f.path, ff.Version)
	}
	f.entries = make(map[Key]Entry, len(ff.Grants))
	for _, e := range ff.Grants {
		f.entries[e.Key] = e
	}
	f.stamp = now
	return nil
}

// Lookup returns the answer for k, if the file has one.
func (f *File) Lookup(k Key) (allowed, known bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refresh(); err != nil {
		return false, false, err
	}
	e, ok := f.entries[k]
	return e.Allowed, ok, nil
}

// Set records e, replacing an answer for the same key.
func (f *File) Set(e Entry) error {
	_, err := f.change(func(m map[Key]Entry) (int, error) {
		if _, ok := m[e.Key]; !ok && len(m) >= MaxEntries {
			return 0, ErrFull
		}
		m[e.Key] = e
		return 1, nil
	})
	return err
}

// Revoke removes the answers match selects and returns how many.
func (f *File) Revoke(match func(Entry) bool) (int, error) {
	return f.change(func(m map[Key]Entry) (int, error) {
		n := 0
		for k, e := range m {
			if match(e) {
				delete(m, k)
				n++
			}
		}
		return n, nil
	})
}

// List returns every answer, sorted by subject, plugin, kind and target.
func (f *File) List() ([]Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refresh(); err != nil {
		return nil, err
	}
	return sorted(f.entries), nil
}

func sorted(m map[Key]Entry) []Entry {
	out := make([]Entry, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return strings.Compare(strings.Join([]string{a.Subject, a.Plugin, a.SHA256, a.Kind, a.Target}, "\x00"),
			strings.Join([]string{b.Subject, b.Plugin, b.SHA256, b.Kind, b.Target}, "\x00"))
	})
	return out
}

// change applies edit to the file's answers under the file lock, and
// writes them back when edit changed any.
func (f *File) change(edit func(map[Key]Entry) (int, error)) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	unlock, err := lockFile(f.path + ".lock")
	if err != nil {
		return 0, fmt.Errorf("grantstore: lock: %w", err)
	}
	defer unlock()
	f.entries = nil // read it afresh under the lock
	if err := f.refresh(); err != nil {
		return 0, err
	}
	n, err := edit(f.entries)
	if err != nil || n == 0 {
		return n, err
	}
	b, err := json.MarshalIndent(fileFormat{Version: 1, Grants: sorted(f.entries)}, "", "  ")
	if err != nil {
		return 0, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), filepath.Base(f.path)+".tmp*")
	if err != nil {
		return 0, fmt.Errorf("grantstore: %w", err)
	}
	_, werr := tmp.Write(append(b, '\n'))
	if err := errors.Join(werr, tmp.Chmod(0o600), tmp.Sync(), tmp.Close()); err != nil {
		os.Remove(tmp.Name())
		return 0, fmt.Errorf("grantstore: write: %w", err)
	}
	if err := os.Rename(tmp.Name(), f.path); err != nil {
		os.Remove(tmp.Name())
		return 0, fmt.Errorf("grantstore: %w", err)
	}
	f.entries = nil // the next lookup reads what was written, and its stamp
	return n, f.refresh()
}
