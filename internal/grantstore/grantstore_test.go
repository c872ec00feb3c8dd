package grantstore_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/grantstore"
)

func key(subject, target string) grantstore.Key {
	return grantstore.Key{Subject: subject, Plugin: "weather", SHA256: "ab", Kind: "network", Target: target}
}

func TestFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grants.json")
	a, err := grantstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, known, err := a.Lookup(key("alice", "x:443")); known || err != nil {
		t.Fatalf("empty file: known %v, %v", known, err)
	}
	if err := a.Set(grantstore.Entry{Key: key("alice", "x:443"), Allowed: true, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := a.Set(grantstore.Entry{Key: key("bob", "x:443"), Allowed: false, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("file mode: %v %v", st.Mode(), err)
	}
	// Another process's view (another File on the same path): it sees the
	// answers, and its revocation is seen by the first.
	b, err := grantstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if allowed, known, _ := b.Lookup(key("alice", "x:443")); !allowed || !known {
		t.Errorf("alice: allowed %v known %v, want allowed", allowed, known)
	}
	if allowed, known, _ := b.Lookup(key("bob", "x:443")); allowed || !known {
		t.Errorf("bob: allowed %v known %v, want denied", allowed, known)
	}
	if _, known, _ := b.Lookup(key("carol", "x:443")); known {
		t.Error("carol: known, want nothing (answers are per subject)")
	}
	n, err := b.Revoke(func(e grantstore.Entry) bool { return e.Subject == "alice" })
	if n != 1 || err != nil {
		t.Fatalf("revoke: %d, %v", n, err)
	}
	if _, known, _ := a.Lookup(key("alice", "x:443")); known {
		t.Error("alice's answer still known after the revocation")
	}
	list, _ := a.List()
	if len(list) != 1 || list[0].Subject != "bob" {
		t.Errorf("list: %+v", list)
	}
}

// TestConcurrentWriters: two Files (two processes' views) writing at once
// lose nothing.
func TestConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "grants.json")
	var wg sync.WaitGroup
	for w := range 2 {
		f, err := grantstore.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if err := f.Set(grantstore.Entry{Key: key("s", string(rune('a'+w))+string(rune('A'+i))), Allowed: true}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	f, _ := grantstore.Open(path)
	if list, _ := f.List(); len(list) != 100 {
		t.Errorf("%d answers, want 100", len(list))
	}
}

func TestFileRefuses(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	os.WriteFile(bad, []byte(`{"version":2}`), 0o600)
	if _, err := grantstore.Open(bad); err == nil {
		t.Error("opened a file of an unknown version")
	}
	garbled := filepath.Join(dir, "garbled.json")
	os.WriteFile(garbled, []byte(`{"version":1,"grants":[`), 0o600)
	if _, err := grantstore.Open(garbled); err == nil {
		t.Error("opened a garbled file")
	}
}
