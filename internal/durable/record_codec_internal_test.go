package durable

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
		b, err := marshalRecord(pr)
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
			if diff := cmp.Diff(pr, got); diff != "" {
				t.Errorf("%s: record (-want +got):\n%s", name, diff)
			}
		}
	}
}

// TestRecordRefused: a truncated or corrupt record, or one of a later
// format, is refused, never misread.
func TestRecordRefused(t *testing.T) {
	b, err := marshalRecord(recordSamples()[0])
	if err != nil {
		t.Fatal(err)
	}
	head := len(recordMagic) + 1
	later := bytes.Clone(b)
	later[len(recordMagic)] = recordVersion + 1
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
		b, _ := marshalRecord(pr)
		f.Add(b)
		old, _ := json.Marshal(pr)
		f.Add(old)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var pr pluginRecord
		if unmarshalRecord(b, &pr) != nil || !bytes.HasPrefix(b, []byte(recordMagic)) {
			return
		}
		again, err := marshalRecord(pr)
		if err != nil {
			t.Fatal(err)
		}
		var pr2 pluginRecord
		if err := unmarshalRecord(again, &pr2); err != nil {
			t.Fatalf("a record read back does not read again: %v", err)
		}
		// JSON's own normalisation aside (a nil result is null), what
		// was read is what is written.
		third, err := marshalRecord(pr2)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(third, again) || !bytes.Equal(pr.Data, pr2.Data) {
			t.Fatalf("record changed: %q, then %q", again, third)
		}
	})
}
