package sources

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// record is what the store remembers of a source's last verified fetch,
// under the settings it was verified with (Dir/index/KEY.json, KEY the
// sha256 of recordKey): what [Manager.Restore] serves without the network.
type record struct {
	Source   string `json:"source"`
	Digest   string `json:"digest,omitempty"`
	SHA256   string `json:"sha256"`
	Verified string `json:"verified"`
}

// recordKey names the settings a fetch was verified under: the source,
// the pin, each public key (its path and the sha256 of its contents) and
// the signature switch. A record made under other settings is not used.
func recordKey(s Spec) string {
	type key struct {
		Source, Pin string
		Keys        []string
		Insecure    bool
	}
	k := key{Source: s.Source, Pin: s.SHA256, Insecure: s.InsecureSkipSignature}
	for _, p := range s.PublicKeys {
		b, err := os.ReadFile(p)
		sum := sha256.Sum256(b)
		if err != nil {
			sum = [32]byte{}
		}
		k.Keys = append(k.Keys, p+"\x00"+hex.EncodeToString(sum[:]))
	}
	b, _ := json.Marshal(k)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// maxRecord is the most of a record that is read (one is a few hundred
// bytes).
const maxRecord = 64 << 10

// remember writes st as s's last verified fetch (written to a temporary
// file and renamed). A failure is logged: it costs only an offline start.
func (m *Manager) remember(s Spec, st Status) {
	if ref, err := Parse(s.Source); err != nil || ref.File != "" {
		return
	}
	b, _ := json.Marshal(record{Source: s.Source, Digest: st.Digest, SHA256: st.SHA256, Verified: st.Verified})
	err := m.writeStore("index", recordKey(s)+".json", ".record.", b)
	if err != nil {
		m.log.Warn("plugin source: the store's record not written (the next start fetches it again)", "plugin", s.Name, "error", err)
	}
}

// recall reads s's record, if any.
func (m *Manager) recall(s Spec) (record, bool) {
	b, err := m.readStore("index", recordKey(s)+".json", maxRecord)
	if err != nil {
		return record{}, false
	}
	var r record
	if json.Unmarshal(b, &r) != nil || r.Source != s.Source || !hexSHA(r.SHA256) {
		return record{}, false
	}
	return r, true
}

// Restore links, without asking any registry or server, each source whose
// verified bytes the store holds, so that they are served at once while
// [Manager.Sync] fetches in the background:
//
//   - an OCI digest pin (@sha256:) or an HTTPS source with a sha256 pin:
//     always, and Sync does not fetch it again;
//   - an OCI tag, or an HTTPS source without a pin: the last version
//     verified under the same settings, with a warning and Status.Stored
//     until the source answers;
//   - a file:// source: read and stored as Sync would (no network).
//
// A stored blob that no longer hashes to its name (the store was changed
// on disk) is refused and reported, in the log and as one of the errors
// returned, and left for Sync to fetch again. Restore reports the names
// it linked.
func (m *Manager) Restore(ctx context.Context, specs []Spec) ([]string, []error) {
	m.sync.Lock()
	defer m.sync.Unlock()
	var names []string
	var errs []error
	for _, s := range specs {
		if s.MaxSize == 0 {
			s.MaxSize = DefaultMaxSize
		}
		ref, err := Parse(s.Source)
		if err != nil {
			continue // Sync reports it
		}
		if ref.File != "" {
			if _, err := m.syncOne(ctx, s); err == nil {
				names = append(names, s.Name)
			}
			continue
		}
		st := Status{Name: s.Name, Source: s.Source}
		var sha string
		if ref.URL != nil && s.SHA256 != "" {
			sha, st.Verified = s.SHA256, "sha256 pin"
		} else {
			r, ok := m.recall(s)
			if !ok || (ref.Digest != "" && r.Digest != ref.Digest) || (s.SHA256 != "" && r.SHA256 != s.SHA256) {
				continue
			}
			sha, st.Digest, st.Verified = r.SHA256, r.Digest, r.Verified
			st.Stored = ref.Digest == "" && s.SHA256 == ""
		}
		if !m.holds(sha) {
			continue
		}
		if !m.intact(sha, s.MaxSize) {
			err := fmt.Errorf("plugin %q (%s): %w: the stored bytes of sha256 %s no longer hash to it; refused, and fetched again", s.Name, s.Source, ErrStoreChanged, sha)
			m.log.Error("plugin store entry changed on disk: refused", "plugin", s.Name, "source", s.Source, "sha256", sha)
			errs = append(errs, err)
			m.mu.Lock()
			m.ents[s.Name] = &entry{spec: s, status: Status{Name: s.Name, Source: s.Source, Error: err.Error(), Checked: time.Now()}}
			m.mu.Unlock()
			continue
		}
		st.SHA256, st.Checked = sha, time.Now()
		if err := m.relink(s.Name, sha); err != nil {
			errs = append(errs, err)
			continue
		}
		m.mu.Lock()
		m.ents[s.Name] = &entry{spec: s, status: st, verifiedUnder: recordKey(s)}
		m.mu.Unlock()
		names = append(names, s.Name)
		if st.Stored {
			m.log.Warn("plugin served from the store: its last verified version, until the source answers", "plugin", s.Name, "source", s.Source, "digest", st.Digest, "sha256", sha)
		} else {
			m.log.Info("plugin served from the store", "plugin", s.Name, "source", s.Source, "sha256", sha)
		}
	}
	return names, errs
}

// holds reports whether the store has a blob named sha (through its
// root: a link of its folders out of it is not followed).
func (m *Manager) holds(sha string) bool {
	blobs, err := m.storeRoot(filepath.Join("blobs", "sha256"))
	if err != nil {
		return false
	}
	defer blobs.Close()
	_, err = blobs.Lstat(sha)
	return err == nil
}

// ErrStoreChanged: a stored blob no longer hashes to its name (the store
// was changed on disk). It is refused, reported and fetched again.
var ErrStoreChanged = errors.New("store entry changed")
