package sandbox

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	experimentalsys "github.com/tetratelabs/wazero/experimental/sys"
)

// Until stop 64 (a red team; issue 30): an ask mount's folder is opened without asking
// (WASI pre-opens it at instantiation), and the handle it gives is a
// rootFile whose Utimens changes times on the host through the Root: no
// grant is checked, and not even the mount's ReadOnly. A guest calling
// fd_filestat_set_times on its pre-opened descriptor changes the host
// folder's times with no question asked, in a read-only ceiling.
func TestAskMountTopUtimensRefused(t *testing.T) {
	dir := t.TempDir()
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(dir, old, old); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	m := Mount{HostPath: dir, GuestPath: "/docs", ReadOnly: true}
	inst := &Instance{fileGrants: make([]fileGrant, 1)} // no call: no one to ask, nothing granted
	g := &gatedFS{rootFS: rootFS{root: root, readOnly: true}, inst: inst, idx: 0, m: m}
	// What wazero does to pre-open the mount.
	f, e := g.OpenFile(".", experimentalsys.O_RDONLY, 0)
	if e != 0 {
		t.Fatalf("pre-open: %v", e)
	}
	defer f.Close()
	e = f.Utimens(0, 0) // fd_filestat_set_times(3, 0, 0, ATIM|MTIM)
	st, _ := os.Stat(dir)
	if e == 0 || !st.ModTime().Equal(old) {
		t.Errorf("Utimens on the ungranted, read-only ask mount's folder: errno %v, mtime now %v (was %v): want refused (EROFS/EACCES) and unchanged", e, st.ModTime().UTC(), old)
	}
}

// Until stop 64 (a red team): a file the guest was granted to read (and even in a read-only
// mount) has its times changed through the read-only descriptor: "read"
// is not a grant to change anything.
func TestReadOnlyFileUtimensRefused(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.txt")
	os.WriteFile(p, []byte("x"), 0o644)
	old := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	os.Chtimes(p, old, old)
	root, _ := os.OpenRoot(dir)
	defer root.Close()
	r := rootFS{root: root, readOnly: true} // a read-only mount (WithMounts), or an ask mount granted "read"
	f, e := r.OpenFile("a.txt", experimentalsys.O_RDONLY, 0)
	if e != 0 {
		t.Fatal(e)
	}
	defer f.Close()
	e = f.Utimens(0, 0)
	st, _ := os.Stat(p)
	if e == 0 || !st.ModTime().Equal(old) {
		t.Errorf("Utimens through a read-only descriptor of a read-only mount: errno %v, mtime now %v: want refused and unchanged", e, st.ModTime().UTC())
	}
}
