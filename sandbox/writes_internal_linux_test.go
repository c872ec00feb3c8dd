package sandbox

import (
	"bytes"
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
	if _, tracked := m.scanWrites(mem, true); tracked {
		t.Fatal("the first scan of a mapping says what was written")
	}
	mem[5*pieceSize+7] = 99 // the instance's one write
	written, tracked := m.scanWrites(mem, true)
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
	if _, tracked := m.scanWrites(mem, true); tracked {
		t.Fatal("the first scan says what was written")
	}
	mem[5*pieceSize+1] = 7
	if written, tracked := m.scanWrites(mem, true); !tracked || ones(written) != 1 {
		t.Fatalf("tracked scan: %v, %d written, want 1", tracked, ones(written))
	}
	if _, tracked := m.scanWrites(mem, false); tracked || m.registeredForWrites() {
		t.Fatal("the scan of an instance that hashes tracked, or left the memory registered")
	}
	if got, want := ones(writtenPieces(mem)), size/pieceSize/2+1; got != want {
		t.Errorf("pagemap says %d pieces owned after tracking stopped, want %d (those written)", got, want)
	}
	if _, tracked := m.scanWrites(mem, true); tracked || !m.registeredForWrites() {
		t.Fatal("tracking again: the first scan says what was written, or did not register")
	}
	mem[7*pieceSize] = 9
	if written, tracked := m.scanWrites(mem, true); !tracked || ones(written) != 1 || written[0] != 1<<7 {
		t.Fatalf("tracked again: %v, written %b, want piece 7", tracked, written[0])
	}
}
