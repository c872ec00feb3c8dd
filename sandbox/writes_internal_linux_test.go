package sandbox

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

// TestResetAfterTracking: a reservation whose writes were tracked goes
// back to its image's pool holding the image, and counted as keeping the
// one page its instance wrote. A page never touched since the tracking
// was armed holds a write-protect marker, which pagemap reports as a
// swapped page, so a reset that did not unregister the range first would
// count (and copy) every such page as the instance's own.
func TestResetAfterTracking(t *testing.T) {
	if pagemap() == nil || !TrackWritesAnyway(t) {
		t.Skip("this system does not track writes (userfaultfd with WP_ASYNC and PAGEMAP_SCAN)")
	}
	const size = 64 * pieceSize
	img := make([]byte, size)
	for p := 0; p < size; p += 3 * pieceSize {
		img[p] = byte(p/pieceSize + 1) // and holes between
	}
	f, err := newImageFile(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	m := reserveMemory(4 << 20)
	if m == nil {
		t.Skip("no reservation")
	}
	m.img, m.imgSize = f, size
	if err := m.mapImage(); err != nil {
		t.Fatal(err)
	}
	mem := m.mem[:size]
	if _, tracked, _ := m.scanWrites(mem, true, true); tracked {
		t.Fatal("the first scan of a mapping says what was written")
	}
	mem[5*pieceSize+7] = 99 // the instance's one write
	written, tracked, _ := m.scanWrites(mem, true, true)
	if !tracked || written[0] != 1<<5 {
		t.Fatalf("scan: tracked %v, written %b; want piece 5 alone", tracked, written)
	}
	m.mu.Lock()
	ok := f.recycle(m)
	m.mu.Unlock()
	if !ok || f.pooled() != 1 {
		t.Fatalf("not pooled (%v)", ok)
	}
	if f.poolKept != pieceSize {
		t.Errorf("the pooled reservation keeps %d bytes as its own, want %d (the page written)", f.poolKept, pieceSize)
	}
	r := f.take(4 << 20)
	if r == nil {
		t.Fatal("nothing to take from the pool")
	}
	defer release(r.mem)
	if !bytes.Equal(r.mem[:size], img) {
		t.Error("the pooled reservation is not the image")
	}
	if r.wpRegistered || r.wpArmed {
		t.Error("the pooled reservation says its writes are tracked")
	}
}

// TestTrackingCostMeasured: where the kernel can track writes, what a page
// written costs with tracking and hashed without is measured, and a new
// instance tracks (unless a test forces it) exactly when that pays; its
// own snapshots choose from then on (TestTrackChoice).
func TestTrackingCostMeasured(t *testing.T) {
	if writeTracker() < 0 {
		t.Skip("this system does not track writes (userfaultfd with WP_ASYNC and PAGEMAP_SCAN)")
	}
	c := trackingCost()
	if c.write <= 0 || c.hash <= 0 || c.write == time.Hour || c.hash == time.Hour {
		t.Fatalf("not measured: %+v", c)
	}
	if c.pays != (c.write <= trackingBreakEven*c.hash) {
		t.Fatalf("pays %v with %+v", c.pays, c)
	}
	if !TracksWrites() {
		t.Error("TracksWrites false where the kernel can and the cost was measured")
	}
	if !trackAnyway.Load() && trackingPaysByDefault() != c.pays {
		t.Errorf("a new instance tracks %v, but tracking pays: %v (%+v)", trackingPaysByDefault(), c.pays, c)
	}
	on, why := WriteTracking()
	t.Logf("write tracking %v: %s", on, why)
}

// TestHashAfterTracking: a reservation whose instance stops tracking its
// writes is unregistered by its next scan, after which pagemap tells the
// pieces the instance owns as before: the one piece written, not every
// never-touched page the tracking protected (which would read as
// swapped, and be hashed at every snapshot). It is registered afresh when
// tracking starts again, and that scan says nothing.
func TestHashAfterTracking(t *testing.T) {
	if pagemap() == nil || tracking() < 0 || !useOwnScan() {
		t.Skip("this system does not track writes (userfaultfd with WP_ASYNC and PAGEMAP_SCAN)")
	}
	m := reserveMemory(4 << 20)
	if m == nil {
		t.Skip("no reservation")
	}
	defer release(m.mem)
	const size = 64 * pieceSize
	mem := m.Reallocate(size)
	if mem == nil {
		t.Fatal("no memory")
	}
	for p := 0; p < size; p += 2 * pieceSize {
		mem[p] = 1 // half the pages populated
	}
	if _, tracked, _ := m.scanWrites(mem, true, true); tracked {
		t.Fatal("the first scan says what was written")
	}
	mem[5*pieceSize+1] = 7
	if written, tracked, _ := m.scanWrites(mem, true, true); !tracked || ones(written) != 1 {
		t.Fatalf("tracked scan: %v, %d written, want 1", tracked, ones(written))
	}
	if _, tracked, _ := m.scanWrites(mem, false, true); tracked || m.registeredForWrites() {
		t.Fatal("the scan of an instance that hashes tracked, or left the memory registered")
	}
	if got, want := ones(writtenPieces(mem)), size/pieceSize/2+1; got != want {
		t.Errorf("pagemap says %d pieces owned after tracking stopped, want %d (those written)", got, want)
	}
	if _, tracked, _ := m.scanWrites(mem, true, true); tracked || !m.registeredForWrites() {
		t.Fatal("tracking again: the first scan says what was written, or did not register")
	}
	mem[7*pieceSize] = 9
	if written, tracked, _ := m.scanWrites(mem, true, true); !tracked || ones(written) != 1 || written[0] != 1<<7 {
		t.Fatalf("tracked again: %v, written %b, want piece 7", tracked, written[0])
	}
}

// TestScanLeavingWritten: a scan that leaves the pages it finds written
// unprotected names, at every scan after it, every page written since the
// last scan that protected (those written before the scan before too),
// and the next protecting scan names them once more and starts afresh. A
// scan that arms the tracking protects, whatever it was asked.
func TestScanLeavingWritten(t *testing.T) {
	if pagemap() == nil || tracking() < 0 {
		t.Skip("this system does not track writes (userfaultfd with WP_ASYNC and PAGEMAP_SCAN)")
	}
	m := reserveMemory(4 << 20)
	if m == nil {
		t.Skip("no reservation")
	}
	defer release(m.mem)
	const size = 640 * pieceSize // 2.5 MiB: two page tables
	mem := m.Reallocate(size)
	if mem == nil {
		t.Fatal("no memory")
	}
	for p := 0; p < size; p += 3 * pieceSize {
		mem[p] = 1 // a third of the pages populated
	}
	piecesOf := func(w []uint64) []int {
		var ps []int
		for p := range size / pieceSize {
			if w[p/64]&(1<<(p%64)) != 0 {
				ps = append(ps, p)
			}
		}
		return ps
	}
	scan := func(protect bool, want ...int) {
		t.Helper()
		w, ok, protected := m.scanWrites(mem, true, protect)
		if !ok || protected != protect {
			t.Fatalf("scan (protect %v): tracked %v, protected %v", protect, ok, protected)
		}
		if got := piecesOf(w); !slices.Equal(got, want) {
			t.Fatalf("scan (protect %v): written %v, want %v", protect, got, want)
		}
	}
	if _, ok, protected := m.scanWrites(mem, true, false); ok || !protected {
		t.Fatalf("the scan that arms: tracked %v, protected %v; want false, true", ok, protected)
	}
	mem[3*pieceSize] = 1
	scan(false, 3)
	mem[9*pieceSize+5] = 1 // a page populated before
	mem[601*pieceSize] = 1 // past the first 2 MiB, never populated
	scan(false, 3, 9, 601)
	mem[3*pieceSize+1] = 2 // written again, unprotected
	scan(false, 3, 9, 601)
	scan(true, 3, 9, 601)
	scan(false)
	mem[9*pieceSize] = 3
	scan(true, 9)
	scan(true)
	// Unregistered, then registered again: the scan that arms protects.
	if _, ok, _ := m.scanWrites(mem, false, false); ok || m.registeredForWrites() {
		t.Fatal("the scan of an instance that hashes tracked, or left the memory registered")
	}
	mem[7*pieceSize] = 1
	if _, ok, protected := m.scanWrites(mem, true, false); ok || !protected {
		t.Fatalf("the scan that arms again: tracked %v, protected %v; want false, true", ok, protected)
	}
	scan(false)
	mem[7*pieceSize] = 2
	scan(false, 7)
}
