package durable

import (
	"encoding/json"
	"testing"

	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A checkpoint's encoding allocates no more than it must (issue 27, item
// 4): what it allocates, the collector pays for at every call, and unlike
// time it can be pinned.

// splitWorld is a claim whose plugin "p" has a stored base of n frames,
// and a state of the same frames but the first changed ones.
func splitWorld(n, changed int) (*Claim, *plugins.State) {
	frame := func(seed, size int) []byte {
		b := make([]byte, size)
		for k := range b {
			b[k] = byte(seed*131 + k*7 + k>>8)
		}
		return b
	}
	base := make([][]byte, n)
	st := &plugins.State{Host: true, Data: []byte("head")}
	for k := range base {
		base[k] = frame(k, 256)
		f := base[k]
		if k < changed {
			f = frame(1000+k, 256)
		}
		st.Frames = append(st.Frames, sandbox.Frame{Bytes: f, Sum: sandbox.FrameSum(f)})
	}
	c := &Claim{bases: map[string]*storedBase{"p": newStoredBase(marshalBase(base), base, nil)}}
	return c, st
}

// TestEncodePluginAllocates: a split state's encoding, with its lists
// and its JSON's memory from their pools and its record's memory given
// back, allocates only the pool's pointer to the record's memory: not
// lists of its frames (four allocations of a few KiB each for a Go
// guest's 300 frames, before), nor json.Marshal's copy of its JSON (with
// a Go guest's 4 KiB of keys run, 5 KiB, and 8 allocations in all).
func TestEncodePluginAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops what a sync.Pool holds now and then")
	}
	c, st := splitWorld(300, 20)
	ran := make([]byte, maxRan*ranSize)
	pr := pluginRecord{Host: true, SHA256: "x", Data: st.Data, Ran: ran,
		Done: []Once{{Key: "r:1", Result: json.RawMessage(`{"content":[{"type":"text","text":"1"}]}`)}}}
	encode := func() {
		fs := takeFrameScratch()
		b, base, split, err := c.encodePlugin("p", pr, st, false, fs)
		if err != nil || !split || base != nil {
			t.Fatalf("encodePlugin: split %v, a base %v, %v; want split", split, base != nil, err)
		}
		giveRecordBuf(b, nil)
		giveFrameScratch(fs)
	}
	encode()
	if allocs := testing.AllocsPerRun(100, encode); allocs > 1 {
		t.Errorf("a split state's encoding: %v allocations; want at most 1 (the pool's pointer)", allocs)
	}
}
