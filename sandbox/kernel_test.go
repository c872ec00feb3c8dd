package sandbox

import (
	"runtime"
	"testing"
)

func TestKernelBlocks(t *testing.T) {
	k := kernel{mem: make([]byte, blockAlign), limit: 1 << 10, maxOutput: 1 << 10}
	if err := k.reset([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if k.inputOff == 0 || k.length(k.inputOff) != 5 {
		t.Fatalf("input block: off %d len %d", k.inputOff, k.length(k.inputOff))
	}
	a := k.alloc(3)
	b := k.alloc(16)
	if a == 0 || b == 0 || b <= a || a%blockAlign != 0 || b%blockAlign != 0 {
		t.Fatalf("alloc gave %d, %d: want aligned increasing offsets", a, b)
	}
	if got := k.length(a + 1); got != 0 {
		t.Errorf("length inside a block = %d, want 0", got)
	}
	k.free(a)
	if got := k.length(a); got != 0 {
		t.Errorf("length of freed block = %d, want 0", got)
	}
	k.free(b) // the last block: its bytes come back
	if c := k.alloc(8); c != b {
		t.Errorf("alloc after freeing the last block = %d, want %d", c, b)
	}
	if off := k.alloc(2 << 10); off != 0 {
		t.Errorf("alloc over the limit = %d, want 0", off)
	}
	if err := k.span("x", 0, 1); err == nil {
		t.Error("span at offset 0 passed")
	}
	if err := k.span("x", ^uint64(0)-2, 8); err == nil {
		t.Error("span that wraps around passed")
	}
	if err := k.reset(make([]byte, 2<<10)); err == nil {
		t.Error("input over the limit was accepted")
	}
}

// TestVarOverhead checks varOverhead against what vars really cost the
// host: vars of a 4-byte key and a 1-byte value, as many as fit, must
// cost no more than varCost says (with 5% for the heap's noise).
func TestVarOverhead(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes what allocations cost")
	}
	for _, n := range []int{1000, 2000, maxVars} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		k := &kernel{}
		key := make([]byte, 4)
		for i := range n {
			key[0], key[1] = byte(i), byte(i>>8)
			k.setVar(key, []byte{1})
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perVar := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		t.Logf("%d vars: %.0f bytes each, counted as %d", n, perVar, varCost(4, 1))
		if perVar > 1.05*float64(varCost(4, 1)) {
			t.Errorf("%d vars cost %.0f bytes each, over the %d counted", n, perVar, varCost(4, 1))
		}
		if k.varBytes != uint64(n)*varCost(4, 1) {
			t.Errorf("varBytes = %d, want %d", k.varBytes, uint64(n)*varCost(4, 1))
		}
		runtime.KeepAlive(k)
	}
}
