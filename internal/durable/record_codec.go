package durable

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
)

// A "p/NAME" field's bytes (docs/DESIGN.md, "Durable sessions across
// replicas"): recordMagic, the format version (1), the length (uvarint)
// and bytes of the pluginRecord as JSON without its Data, then Data raw,
// to the end. Before it the field was the whole pluginRecord as JSON, the
// saved state in base64 (a third larger, and dearer to write), which is
// still read: a JSON record starts with '{', never with the magic. A
// record of a later version is refused, saying so, and its session's
// plugin starts afresh with a stateReset, never from a misread state.
const (
	recordMagic   = "wtpr"
	recordVersion = 1
)

// marshalRecord encodes pr as a "p/NAME" field.
func marshalRecord(pr pluginRecord) ([]byte, error) {
	data := pr.Data
	pr.Data = nil
	head, err := json.Marshal(pr)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(recordMagic)+1+binary.MaxVarintLen64+len(head)+len(data))
	b = append(b, recordMagic...)
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(len(head)))
	b = append(b, head...)
	return append(b, data...), nil
}

// unmarshalRecord decodes a "p/NAME" field, of this format or the JSON
// one before it, into pr. pr.Data aliases b.
func unmarshalRecord(b []byte, pr *pluginRecord) error {
	rest, ok := bytes.CutPrefix(b, []byte(recordMagic))
	if !ok {
		return json.Unmarshal(b, pr)
	}
	if len(rest) == 0 {
		return errors.New("record: truncated")
	}
	if v := rest[0]; v != recordVersion {
		return fmt.Errorf("record: format version %d, not %d (written by a later version of wasmtools)", v, recordVersion)
	}
	rest = rest[1:]
	n, k := binary.Uvarint(rest)
	if k <= 0 || n > uint64(len(rest)-k) {
		return errors.New("record: truncated")
	}
	head := rest[k : k+int(n)]
	var r pluginRecord
	if err := json.Unmarshal(head, &r); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if r.Data != nil {
		return errors.New("record: its state given twice")
	}
	if data := rest[k+int(n):]; len(data) > 0 {
		r.Data = data
	}
	*pr = r
	return nil
}
