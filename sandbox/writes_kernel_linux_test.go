package sandbox_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// bit reports whether piece p is set in a scan's bitmap.
func bit(w []uint64, p int) bool { return w[p/64]&(1<<(p%64)) != 0 }

// TestTrackOtherWriters: writes by other routes than the instance's own
// stores (process_vm_writev, /proc/self/mem, after a real fork) are
// reported by the next scan; reads are not.
func TestTrackOtherWriters(t *testing.T) {
	needTracking(t)
	img := make([]byte, 64<<10)
	for i := range img {
		img[i] = byte(i*7 + 1)
	}
	mem, scan, free, err := sandbox.TrackedReservation(img, 4<<20, 256<<10)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	_, ok := scan()
	t.Logf("first scan ok=%v", ok)
	w, ok := scan()
	t.Logf("second scan ok=%v", ok)
	count := func(w []uint64) (n int) {
		for p := range len(mem) / 4096 {
			if bit(w, p) {
				n++
			}
		}
		return
	}
	t.Logf("nothing: %d written", count(w))
	// reads
	var s byte
	for i := 0; i < len(mem); i += 4096 {
		s += mem[i]
	}
	w, _ = scan()
	if count(w) != 0 {
		t.Logf("after reads: %d reported (conservative)", count(w))
	}
	w, _ = scan()
	t.Logf("after nothing: %d written", count(w))
	// process_vm_writev
	buf := []byte{42}
	local := []unix.Iovec{{Base: &buf[0], Len: 1}}
	remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&mem[5*4096+3])), Len: 1}}
	if _, err := unix.ProcessVMWritev(os.Getpid(), local, remote, 0); err != nil {
		t.Log("process_vm_writev:", err)
	}
	w, _ = scan()
	if !bit(w, 5) || count(w) != 1 {
		t.Errorf("process_vm_writev piece 5: %v (%d)", bit(w, 5), count(w))
	}
	// /proc/self/mem
	f, _ := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if _, err := f.WriteAt([]byte{7}, int64(uintptr(unsafe.Pointer(&mem[40*4096])))); err != nil {
		t.Log(err)
	}
	f.Close()
	w, _ = scan()
	if !bit(w, 40) || count(w) != 1 {
		t.Errorf("/proc/self/mem piece 40: %v (%d)", bit(w, 40), count(w))
	}
	// fork: a child process
	mem[3*4096] = 1
	mem[50*4096] = 1
	scan()
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &unix.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER}
	if err := cmd.Run(); err != nil {
		t.Log("fork:", err)
	}
	mem[3*4096] = 2
	mem[50*4096] = 2
	w, _ = scan()
	if !bit(w, 3) || !bit(w, 50) || count(w) != 2 {
		t.Errorf("after fork, writes 3 and 50: %v %v (%d)", bit(w, 3), bit(w, 50), count(w))
	}
	_ = s
}

// TestTrackManyRegions: a scan of more written regions than one ioctl
// returns (256) reports each, and nothing else.
func TestTrackManyRegions(t *testing.T) {
	needTracking(t)
	img := make([]byte, 64<<10)
	mem, scan, free, err := sandbox.TrackedReservation(img, 64<<20, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	scan()
	scan()
	for round := range 3 {
		want := 0
		for p := round; p < len(mem)/4096; p += 2 + round {
			mem[p*4096+round] = byte(round + 1)
			want++
		}
		w, ok := scan()
		n := 0
		for p := range len(mem) / 4096 {
			if bit(w, p) {
				n++
				if (p-round)%(2+round) != 0 || p < round {
					t.Errorf("round %d: piece %d reported", round, p)
				}
			}
		}
		if !ok || n != want {
			t.Errorf("round %d: ok %v, %d written, want %d", round, ok, n, want)
		}
	}
}

// TestTrackHugePages: writes to transparent huge pages are reported.
func TestTrackHugePages(t *testing.T) {
	needTracking(t)
	mem, scan, free, err := sandbox.TrackedReservation(nil, 64<<20, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	base := uintptr(unsafe.Pointer(&mem[0]))
	off := int((2<<20 - base%(2<<20)) % (2 << 20))
	huge := mem[off : off+8<<20]
	if err := unix.Madvise(huge, unix.MADV_HUGEPAGE); err != nil {
		t.Fatal(err)
	}
	scan()
	scan()
	huge[0] = 1 // a THP fault, perhaps
	huge[4<<20+5] = 1
	w, _ := scan()
	t.Logf("first: %v %v", bit(w, off/4096), bit(w, (off+4<<20)/4096))
	huge[3*4096] = 9
	w, _ = scan()
	n := 0
	for p := range len(mem) / 4096 {
		if bit(w, p) {
			n++
		}
	}
	t.Logf("second: piece 3 %v, %d written", bit(w, off/4096+3), n)
	if !bit(w, off/4096+3) {
		t.Error("missed")
	}
	err = unix.Madvise(huge[:2<<20], 25) // MADV_COLLAPSE
	t.Logf("collapse: %v", err)
	huge[7*4096] = 9
	w, _ = scan()
	t.Logf("after collapse: piece 7 %v", bit(w, off/4096+7))
	if !bit(w, off/4096+7) {
		t.Error("missed after collapse")
	}
	huge[2<<20+5*4096] = 1
	for i := 0; i < 512; i++ {
		huge[2<<20+i*4096] = 1
	}
	w, _ = scan()
	err = unix.Madvise(huge[2<<20:4<<20], 25)
	t.Logf("collapse 2: %v", err)
	huge[2<<20+9*4096] = 3
	w, _ = scan()
	t.Logf("after collapse 2: piece %v", bit(w, (off+2<<20)/4096+9))
	if !bit(w, (off+2<<20)/4096+9) {
		t.Error("missed after collapse 2")
	}
}

// TestTrackRestoreAndRecycle: restores and recycling after tracked
// snapshots of memory written whole and grown.
func TestTrackRestoreAndRecycle(t *testing.T) {
	ctx := context.Background()
	for _, tools := range [][]string{{"touch_all"}, {"touch_all", "grow", "touch_all"}, {"grow"}} {
		c := compile(t, newRuntime(t), testplugins.Test(t, "hostileimage"), sandbox.NewPolicy().WithMemoryLimit(64<<20))
		instantiate(t, c).Close(ctx)
		img := c.ImageBytes()
		a := instantiate(t, c)
		if _, err := a.Snapshot(ctx); err != nil {
			t.Fatal(err)
		}
		var snap []byte
		for _, tool := range tools {
			if _, err := callServlet(t, a, tool, `{}`); err != nil {
				t.Fatal(err)
			}
			var err error
			if snap, err = a.Snapshot(ctx); err != nil {
				t.Fatal(err)
			}
		}
		r, err := c.Restore(ctx, snap)
		if err != nil {
			t.Fatal(err)
		}
		if d := sandbox.DifferingBytes(r.MemoryCopy(), a.MemoryCopy()); d != 0 {
			t.Errorf("%v: restored differs %d", tools, d)
		}
		a.Close(ctx)
		t.Logf("%v: pooled %d kept %d", tools, c.Pooled(), c.PoolKept())
		r.Close(ctx)
		t.Logf("%v: pooled %d kept %d", tools, c.Pooled(), c.PoolKept())
		for k := 0; k < 2; k++ {
			b := instantiate(t, c)
			if got := b.MemoryCopy(); !bytes.Equal(got, img) {
				t.Errorf("%v: reused %v memory differs %d", tools, b.Reused(), sandbox.DifferingBytes(got, img))
			}
		}
	}
}

// TestTrackKeptAfterRecycle: tracked snapshots leave the recycled
// reservation holding the image, its kept bytes the page written only
// (no uffd-wp marker counted as a page of its own).
func TestTrackKeptAfterRecycle(t *testing.T) {
	needRecycling(t)
	ctx := context.Background()
	for _, snaps := range []int{0, 1, 2} {
		c := compile(t, newRuntime(t), testplugins.Test(t, "servlet"), sandbox.NewPolicy())
		instantiate(t, c).Close(ctx)
		img := c.ImageBytes()
		a := instantiate(t, c)
		for range snaps {
			if _, err := a.Snapshot(ctx); err != nil {
				t.Fatal(err)
			}
		}
		a.WriteMemory(func(mem []byte) { mem[8192]++ })
		a.Close(ctx)
		if c.Pooled() != 1 || c.PoolKept() != 4096 {
			t.Errorf("%d snapshots: %d pooled keeping %d bytes, want 1 keeping 4096", snaps, c.Pooled(), c.PoolKept())
		}
		b := instantiate(t, c)
		if got := b.MemoryCopy(); !b.Reused() || !bytes.Equal(got, img) {
			t.Errorf("%d snapshots: reused %v, %d bytes differ from the image", snaps, b.Reused(), sandbox.DifferingBytes(got, img))
		}
	}
}
