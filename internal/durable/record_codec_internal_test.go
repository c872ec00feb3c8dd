package durable

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

func recordSamples() []pluginRecord {
	return []pluginRecord{
		{Host: true, SHA256: strings.Repeat("ab", 32), Data: []byte("wtsn\x03 a snapshot\x00\xff"), Done: []Once{{Key: "k1", Result: json.RawMessage(`{"content":[]}`)}}},
		{SHA256: "cd", Lost: "plugin x cannot be snapshotted: why"},
		{SHA256: "ef", Data: []byte("{")}, // a guest's own state, not JSON
	}
}

// TestRecordRoundTrip: a record reads back as written, in this format and
// in the JSON one before it (records written by older replicas).
func TestRecordRoundTrip(t *testing.T) {
	for _, pr := range recordSamples() {
		b, err := marshalRecord(nil, pr)
		if err != nil {
			t.Fatal(err)
		}
		old, err := json.Marshal(pr)
		if err != nil {
			t.Fatal(err)
		}
		if len(pr.Data) > 0 && !bytes.Contains(b, pr.Data) {
			t.Errorf("the state is not raw in the record: %q", b)
		}
		for name, enc := range map[string][]byte{"binary": b, "json": old} {
			var got pluginRecord
			if err := unmarshalRecord(enc, &got); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if diff := cmp.Diff(pr, got, cmp.AllowUnexported(pluginRecord{})); diff != "" {
				t.Errorf("%s: record (-want +got):\n%s", name, diff)
			}
		}
	}
}

// TestRecordRefused: a truncated or corrupt record, or one of a later
// format, is refused, never misread.
func TestRecordRefused(t *testing.T) {
	b, err := marshalRecord(nil, recordSamples()[0])
	if err != nil {
		t.Fatal(err)
	}
	head := len(recordMagic) + 1
	later := bytes.Clone(b)
	later[len(recordMagic)] = splitVersion + 1
	corrupt := bytes.Clone(b)
	corrupt[head+1] = 'x' // the JSON's first byte
	twice, _ := json.Marshal(pluginRecord{SHA256: "ab", Data: []byte("x")})
	for name, bad := range map[string][]byte{
		"magic only":     []byte(recordMagic),
		"no length":      b[:head],
		"truncated head": b[:head+5],
		"later version":  later,
		"corrupt head":   corrupt,
		"data twice":     append(append(append([]byte(recordMagic), recordVersion, byte(len(twice))), twice...), 'y'),
		"json cut":       []byte(`{"sha256":"ab","data":"eA`),
	} {
		var pr pluginRecord
		if err := unmarshalRecord(bad, &pr); err == nil {
			t.Errorf("%s: accepted as %+v", name, pr)
		}
	}
}

// FuzzRecord feeds unmarshalRecord arbitrary bytes, as a store could
// hand back: it never panics, and what it accepts in this format reads
// back the same once written again.
func FuzzRecord(f *testing.F) {
	for _, pr := range recordSamples() {
		b, _ := marshalRecord(nil, pr)
		f.Add(b)
		old, _ := json.Marshal(pr)
		f.Add(old)
	}
	for _, s := range splitSamples() {
		b, _ := marshalSplit(nil, s.pr, s.split)
		f.Add(b)
	}
	for _, s := range splitSamples() {
		if s.base != nil {
			f.Add(marshalBase(s.base))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// As a base of frames too, and joined with a record that names
		// it: never a panic, nor a state larger than a field holds.
		if fs, err := unmarshalBase(b); err == nil {
			refs := make([]frameRef, len(fs))
			for k := range refs {
				refs[k].base = k
			}
			split, _ := marshalSplit(nil, pluginRecord{Host: true}, &splitState{head: []byte("h"), base: baseSum(b), frames: refs})
			pr, err := readPlugin(map[string][]byte{"p/x": split, "b/x": b}, "x")
			if err == nil && len(pr.Data) != 1+len(bytes.Join(fs, nil)) {
				t.Fatalf("a base of %d frames joined into %d bytes", len(fs), len(pr.Data))
			}
		}
		var pr pluginRecord
		if unmarshalRecord(b, &pr) != nil || !bytes.HasPrefix(b, []byte(recordMagic)) {
			return
		}
		if pr.split != nil {
			again, err := marshalSplit(nil, pr, pr.split)
			if err != nil {
				t.Fatal(err)
			}
			var pr2 pluginRecord
			if err := unmarshalRecord(again, &pr2); err != nil {
				t.Fatalf("a split record read back does not read again: %v", err)
			}
			if third, _ := marshalSplit(nil, pr2, pr2.split); !bytes.Equal(third, again) {
				t.Fatalf("split record changed: %q, then %q", again, third)
			}
			return
		}
		again, err := marshalRecord(nil, pr)
		if err != nil {
			t.Fatal(err)
		}
		var pr2 pluginRecord
		if err := unmarshalRecord(again, &pr2); err != nil {
			t.Fatalf("a record read back does not read again: %v", err)
		}
		// JSON's own normalisation aside (a nil result is null), what
		// was read is what is written.
		third, err := marshalRecord(nil, pr2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(third, again) || !bytes.Equal(pr.Data, pr2.Data) {
			t.Fatalf("record changed: %q, then %q", again, third)
		}
	})
}

// splitSample is a split record and the base it was written against.
type splitSample struct {
	pr    pluginRecord
	split *splitState
	base  [][]byte
}

func splitSamples() []splitSample {
	base := [][]byte{[]byte("frame zero"), []byte("frame one, longer"), []byte("two")}
	sum := baseSum(marshalBase(base))
	return []splitSample{
		{
			pr:    pluginRecord{Host: true, SHA256: "ab", Done: []Once{{Key: "k", Result: json.RawMessage(`{}`)}}, Ran: []byte("12345678")},
			split: &splitState{head: []byte("wtsn\x04head"), base: sum, frames: []frameRef{{base: 1}, {base: -1, data: []byte("own")}, {base: 0}, {base: 1}}},
			base:  base,
		},
		{ // every frame its own: no base needed
			pr:    pluginRecord{Host: true, SHA256: "cd"},
			split: &splitState{head: []byte("h"), base: make([]byte, baseSumSize), frames: []frameRef{{base: -1, data: []byte("a")}, {base: -1, data: []byte("bc")}}},
		},
	}
}

// want is the snapshot s's record stands for.
func (s splitSample) want() []byte {
	out := bytes.Clone(s.split.head)
	for _, f := range s.split.frames {
		if f.base >= 0 {
			out = append(out, s.base[f.base]...)
		} else {
			out = append(out, f.data...)
		}
	}
	return out
}

// TestSplitRecordRoundTrip: a state kept apart from the frames of its
// base reads back whole, the base's frames put back in their places.
func TestSplitRecordRoundTrip(t *testing.T) {
	for k, s := range splitSamples() {
		b, err := marshalSplit(nil, s.pr, s.split)
		if err != nil {
			t.Fatal(err)
		}
		rec := map[string][]byte{"p/x": b}
		if s.base != nil {
			rec["b/x"] = marshalBase(s.base)
		}
		got, err := readPlugin(rec, "x")
		if err != nil {
			t.Fatalf("sample %d: %v", k, err)
		}
		want := s.pr
		want.Data = s.want()
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(pluginRecord{})); diff != "" {
			t.Errorf("sample %d: record (-want +got):\n%s", k, diff)
		}
	}
}

// TestSplitRecordRefused: a split state whose base is missing, another
// than the one it was written against, or short of a frame it names is
// refused (its plugin starts afresh, saying so), never joined from the
// wrong frames.
func TestSplitRecordRefused(t *testing.T) {
	s := splitSamples()[0]
	b, err := marshalSplit(nil, s.pr, s.split)
	if err != nil {
		t.Fatal(err)
	}
	other := marshalBase([][]byte{[]byte("frame zero"), []byte("frame one, longer"), []byte("TWO")})
	short := marshalBase(s.base[:1])
	// A record naming the short base, so that only the count is wrong.
	shortSplit := *s.split
	shortSplit.base = baseSum(short)
	bs, err := marshalSplit(nil, s.pr, &shortSplit)
	if err != nil {
		t.Fatal(err)
	}
	for name, rec := range map[string]map[string][]byte{
		"no base":        {"p/x": b},
		"another base":   {"p/x": b, "b/x": other},
		"frame past end": {"p/x": bs, "b/x": short},
		"corrupt base":   {"p/x": b, "b/x": []byte("wtpb\x01\x05")},
		"truncated":      {"p/x": b[:len(b)-1], "b/x": marshalBase(s.base)},
	} {
		if pr, err := readPlugin(rec, "x"); err == nil {
			t.Errorf("%s: accepted as %q", name, pr.Data)
		}
	}
}

// TestRecordIntoUsedMemory: a field encoded into memory given back by an
// earlier write (recordBufs) is the same bytes as one encoded afresh,
// whatever that memory held.
func TestRecordIntoUsedMemory(t *testing.T) {
	used := func(n int) []byte { return bytes.Repeat([]byte{0xa5}, n)[:0] }
	for _, pr := range recordSamples() {
		want, err := marshalRecord(nil, pr)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, len(want) / 2, len(want), 4 * len(want)} {
			got, err := marshalRecord(used(n), pr)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("record into %d bytes of used memory: %x (%v), want %x", n, got, err, want)
			}
		}
	}
	for _, s := range splitSamples() {
		want, err := marshalSplit(nil, s.pr, s.split)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, len(want) / 2, len(want), 4 * len(want)} {
			got, err := marshalSplit(used(n), s.pr, s.split)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("split record into %d bytes of used memory: %x (%v), want %x", n, got, err, want)
			}
		}
	}
	// Given back only when the write cannot be reading it any more: it
	// was answered, or never sent.
	for _, tc := range []struct {
		err  error
		back bool
	}{
		{nil, true},
		{statestore.ErrFenced, true},
		{fmt.Errorf("%w: over the tenant's bytes", errRefused), true},
		{errStoreDown, true},
		{context.DeadlineExceeded, false},
		{errors.New("connection reset"), false},
	} {
		if back := reusable(tc.err); back != tc.back {
			t.Errorf("after a write ending in %v: reusable %v, want %v", tc.err, back, tc.back)
		}
	}
}

// TestRecordOfPluginNamedStar: the record of a plugin named "*" (a file
// "*.wasm") stands for that plugin only; the record of every plugin not
// named is "p/*/" (sessions.AnyPlugin), a name no plugin can have.
func TestRecordOfPluginNamedStar(t *testing.T) {
	star := map[string][]byte{"p/*": []byte("{}")}
	if got := recordOf(star, "q"); got != "q" {
		t.Errorf("with a plugin named \"*\" saved, q's record is %q, want its own", got)
	}
	lost := map[string][]byte{"p/" + sessions.AnyPlugin: []byte("{}"), "p/r": []byte("{}")}
	if got := recordOf(lost, "q"); got != sessions.AnyPlugin {
		t.Errorf("after a loss, q's record is %q, want %q", got, sessions.AnyPlugin)
	}
	if got := recordOf(lost, "r"); got != "r" {
		t.Errorf("after a loss, r (saved since) reads %q, want its own", got)
	}
}

// TestRecordJSONAsMarshal: a record's JSON appended is json.Marshal's,
// byte for byte, for records whose strings need no escaping and whose
// results are compact without HTML's characters (the host's); a string
// JSON would escape, or an empty result, is left to json.Marshal.
func TestRecordJSONAsMarshal(t *testing.T) {
	ran := make([]byte, maxRan*ranSize)
	for k := range ran {
		ran[k] = byte(k * 7)
	}
	samples := append(recordSamples(),
		pluginRecord{SHA256: "x"},
		pluginRecord{Host: true, SHA256: strings.Repeat("ab", 32), Unsaid: "evicted", Ran: ran,
			Done: []Once{{Key: "r:1", Result: json.RawMessage(`{"content":[{"type":"text","text":"1"}]}`)}, {Key: "k", Result: tooLarge}}},
		pluginRecord{Lost: "plugin p cannot be snapshotted: no", Reason: ReasonStoreLost, Ran: ran[:8]},
	)
	for _, pr := range samples {
		pr.Data = nil
		want, err := json.Marshal(pr)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := appendRecordJSON([]byte("x"), &pr)
		if !ok || !bytes.Equal(got[1:], want) || got[0] != 'x' {
			t.Errorf("appendRecordJSON(%+v): ok %v,\n%s\nwant\n%s", pr, ok, got, want)
		}
	}
	for _, pr := range []pluginRecord{
		{SHA256: "x", Lost: `a "quoted" reason`},
		{SHA256: "x", Reason: "a\\b"},
		{SHA256: "x", Unsaid: "é"},
		{SHA256: "x<"},
		{SHA256: "x", Done: []Once{{Key: "k\n", Result: json.RawMessage(`1`)}}},
		{SHA256: "x", Done: []Once{{Key: "k"}}},
	} {
		if b, ok := appendRecordJSON(nil, &pr); ok || len(b) != 0 {
			t.Errorf("appendRecordJSON(%+v): ok %v, %q; want it left to json.Marshal", pr, ok, b)
		}
	}
}
