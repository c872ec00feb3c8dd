package statestore

import (
	"context"
	"encoding/json"
	"maps"
	"testing"
	"time"
)

// nopWrites is a Memory whose versioned writes do nothing: what a sealed
// write allocates itself.
type nopWrites struct{ *Memory }

func (nopWrites) putVersioned(context.Context, string, string, []byte, []byte, uint64, uint64, time.Duration) error {
	return nil
}

// TestSealedPutAllocates: a sealed write of a record this process wrote
// last allocates its head (kept as the last write's), the head sealed,
// and the pool's pointer to the value's sealed memory: not its turn
// among the record's writes, nor the head's JSON, nor the additional data
// (21 allocations in all before; issue 27, item 4).
func TestSealedPutAllocates(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops what a sync.Pool holds now and then")
	}
	ctx := context.Background()
	s := Seal(nopWrites{NewMemory()}, []byte("a state key"))
	value := make([]byte, 40<<10)
	for _, f := range []string{"mcp", "b/notes", "p/notes"} {
		if err := s.Put(ctx, "id", f, value, 1, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() {
		if err := s.Put(ctx, "id", "p/notes", value, 1, time.Minute); err != nil {
			t.Fatal(err)
		}
	}); allocs > 4 {
		t.Errorf("a sealed write: %v allocations; want at most 4", allocs)
	}
}

// TestAppendHead: a head appended reads as the head, and a field name
// that JSON would escape is left to json.Marshal.
func TestAppendHead(t *testing.T) {
	h := head{Version: 1<<40 + 7, Fields: map[string]uint64{"mcp": 1, "p/notes": 1<<40 + 7, "b/notes": 0}}
	b, ok := appendHead([]byte("x"), h)
	if !ok || b[0] != 'x' {
		t.Fatalf("appendHead: ok %v, %q", ok, b)
	}
	var got head
	if err := json.Unmarshal(b[1:], &got); err != nil || got.Version != h.Version || !maps.Equal(got.Fields, h.Fields) {
		t.Errorf("appendHead wrote %s: reads as %+v, %v; want %+v", b[1:], got, err, h)
	}
	for _, f := range []string{`p/a"b`, `p/a\b`, "p/\x01", "p/é", "p/<"} {
		if b, ok := appendHead(nil, head{Fields: map[string]uint64{f: 1}}); ok || len(b) != 0 {
			t.Errorf("appendHead of field %q: ok %v, %q; want it left to json.Marshal", f, ok, b)
		}
	}
}
