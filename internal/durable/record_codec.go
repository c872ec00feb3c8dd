package durable

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// A "p/NAME" field's bytes (docs/DESIGN.md, "Durable sessions across
// replicas"): recordMagic, the format version (1), the length (uvarint)
// and bytes of the pluginRecord as JSON without its Data, then Data raw,
// to the end. Before it the field was the whole pluginRecord as JSON, the
// saved state in base64 (a third larger, and dearer to write), which is
// still read: a JSON record starts with '{', never with the magic. A
// record of a later version is refused, saying so, and its session's
// plugin starts afresh with a stateReset, never from a misread state.
//
// Version 2 keeps a host snapshot's frames apart ("Checkpoints write what
// changed" in docs/DESIGN.md): after the JSON, the length and bytes of the
// snapshot's head (all of it before its frames), the base's digest
// (baseSumSize bytes: the SHA-256 of the "b/NAME" field its references
// are into, zeros for none), the number of frames, and each frame as a
// uvarint tag: 2*i+1 for the i-th frame of the base, 2*n for the n bytes
// of a frame that follow. A "b/NAME" field (baseMagic, its version, 1) is
// the count of its frames and each one's length and bytes.
const (
	recordMagic   = "wtpr"
	recordVersion = 1
	splitVersion  = 2
	baseMagic     = "wtpb"
	baseVersion   = 1
	baseSumSize   = 16
	// maxBaseFrames bounds the frames of a record or a base a reader
	// takes (none is empty): a snapshot of the largest memory (4 GiB) has
	// at most this many, of a piece each.
	maxBaseFrames = 1 << 20
)

// marshalRecord encodes pr as a "p/NAME" field, its state pr.Data and
// then the bytes of tail (a host snapshot's frames, after its head), in
// dst's memory when it has room (dst is given back by recordBufs).
func marshalRecord(dst []byte, pr pluginRecord, tail ...[]byte) ([]byte, error) {
	data := pr.Data
	pr.Data = nil
	jb := takeJSONBuf()
	defer giveJSONBuf(jb)
	head, err := recordJSON(jb, pr)
	if err != nil {
		return nil, err
	}
	size := len(recordMagic) + 1 + binary.MaxVarintLen64 + len(head) + len(data)
	for _, t := range tail {
		size += len(t)
	}
	b := room(dst, size)
	b = append(b, recordMagic...)
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(len(head)))
	b = append(b, head...)
	b = append(b, data...)
	for _, t := range tail {
		b = append(b, t...)
	}
	return b, nil
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
	v := rest[0]
	if v != recordVersion && v != splitVersion {
		return fmt.Errorf("record: format version %d, not %d (written by a later version of wasmtools)", v, splitVersion)
	}
	r := reader{b: rest[1:]}
	head := r.bytes()
	if r.err != nil {
		return r.err
	}
	var pr2 pluginRecord
	if err := json.Unmarshal(head, &pr2); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if pr2.Data != nil {
		return errors.New("record: its state given twice")
	}
	if v == recordVersion {
		if len(r.b) > 0 {
			pr2.Data = r.b
		}
		*pr = pr2
		return nil
	}
	sp := &splitState{head: r.bytes(), base: r.next(baseSumSize)}
	n := r.uvarint()
	if r.err == nil && (n > uint64(len(r.b)) || n > maxBaseFrames) {
		r.err = fmt.Errorf("record: %d frames", n)
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		tag := r.uvarint()
		if tag == 0 {
			return errors.New("record: an empty frame")
		}
		if tag&1 == 1 {
			if tag>>1 > maxBaseFrames {
				return fmt.Errorf("record: frame %d of its base, over %d", tag>>1, maxBaseFrames)
			}
			sp.frames = append(sp.frames, frameRef{base: int(tag >> 1)})
			continue
		}
		sp.frames = append(sp.frames, frameRef{base: -1, data: r.next(tag >> 1)})
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) > 0 {
		return errors.New("record: bytes after its last frame")
	}
	pr2.split = sp
	*pr = pr2
	return nil
}

// splitState is a version 2 record's state: a host snapshot whose frames
// are given one by one, each either here or the base's.
type splitState struct {
	head   []byte
	base   []byte // baseSumSize bytes; all zero: no frame is the base's
	frames []frameRef
}

// frameRef is a frame of a split state: the base's frame number base, or
// data (base -1).
type frameRef struct {
	base int
	data []byte
}

// refersToBase reports whether any of s's frames is in the base.
func (s *splitState) refersToBase() bool {
	for _, f := range s.frames {
		if f.base >= 0 {
			return true
		}
	}
	return false
}

// marshalSplit encodes pr (its Data nil) with its state split as s, in
// dst's memory when it has room.
func marshalSplit(dst []byte, pr pluginRecord, s *splitState) ([]byte, error) {
	pr.Data = nil
	jb := takeJSONBuf()
	defer giveJSONBuf(jb)
	head, err := recordJSON(jb, pr)
	if err != nil {
		return nil, err
	}
	size := len(recordMagic) + 1 + 3*binary.MaxVarintLen64 + len(head) + len(s.head) + baseSumSize
	for _, f := range s.frames {
		size += binary.MaxVarintLen64 + len(f.data)
	}
	b := room(dst, size)
	b = append(b, recordMagic...)
	b = append(b, splitVersion)
	b = appendBytes(b, head)
	b = appendBytes(b, s.head)
	b = append(b, s.base...)
	b = binary.AppendUvarint(b, uint64(len(s.frames)))
	for _, f := range s.frames {
		if f.base >= 0 {
			b = binary.AppendUvarint(b, uint64(f.base)<<1|1)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(f.data))<<1)
		b = append(b, f.data...)
	}
	return b, nil
}

// recordJSON returns pr's JSON (its Data nil), in jb's memory when
// appendRecordJSON can write it, else json.Marshal's.
func recordJSON(jb *[]byte, pr pluginRecord) ([]byte, error) {
	if b, ok := appendRecordJSON((*jb)[:0], &pr); ok {
		*jb = b
		return b, nil
	}
	return json.Marshal(pr)
}

// appendRecordJSON appends pr's JSON, its Data nil, as json.Marshal
// writes it, when none of its strings needs escaping (else ok is false,
// and nothing is appended): json.Marshal's reflection and its own buffer
// were most of a checkpoint's encoding, and its copy of the result a
// tenth of the checkpoint's garbage. Results are appended as they are,
// where json.Marshal compacts them and escapes HTML in them: each is one
// the host marshalled (a CallToolResult), one read back from a record, or
// tooLarge, all compact, and either is the same JSON value.
func appendRecordJSON(dst []byte, pr *pluginRecord) (_ []byte, ok bool) {
	if pr.Data != nil || !plainJSON(pr.SHA256) || !plainJSON(pr.Lost) || !plainJSON(pr.Reason) || !plainJSON(pr.Unsaid) {
		return dst, false
	}
	for _, o := range pr.Done {
		if !plainJSON(o.Key) || len(o.Result) == 0 {
			return dst, false // an empty result is json.Marshal's to refuse
		}
	}
	b := append(dst, '{')
	if pr.Host {
		b = append(b, `"host":true,`...)
	}
	b = appendJSONField(b, `"sha256":"`, pr.SHA256)
	if pr.Lost != "" {
		b = appendJSONField(append(b, ','), `"lost":"`, pr.Lost)
	}
	if pr.Reason != "" {
		b = appendJSONField(append(b, ','), `"reason":"`, pr.Reason)
	}
	if pr.Unsaid != "" {
		b = appendJSONField(append(b, ','), `"unsaid":"`, pr.Unsaid)
	}
	if len(pr.Done) > 0 {
		b = append(b, `,"done":[`...)
		for k, o := range pr.Done {
			if k > 0 {
				b = append(b, ',')
			}
			b = appendJSONField(append(b, '{'), `"key":"`, o.Key)
			b = append(append(append(b, `,"result":`...), o.Result...), '}')
		}
		b = append(b, ']')
	}
	if len(pr.Ran) > 0 {
		b = append(b, `,"ran":"`...)
		b = append(base64.StdEncoding.AppendEncode(b, pr.Ran), '"')
	}
	return append(b, '}'), true
}

// appendJSONField appends name (its opening quote and colon, and the
// value's quote) and v, a plainJSON string, closing its quote.
func appendJSONField(b []byte, name, v string) []byte {
	return append(append(append(b, name...), v...), '"')
}

// plainJSON reports whether v is written in JSON as it is, between
// quotes: printable ASCII, none of what json.Marshal escapes.
func plainJSON(v string) bool {
	for k := range len(v) {
		if c := v[k]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// jsonBufs holds memory for records' JSON, which their encoding copies.
var jsonBufs sync.Pool

func takeJSONBuf() *[]byte {
	if b, ok := jsonBufs.Get().(*[]byte); ok {
		return b
	}
	return new([]byte)
}

func giveJSONBuf(b *[]byte) {
	if cap(*b) <= maxPooled {
		jsonBufs.Put(b)
	}
}

// recordBufs holds the memory of "p/NAME" fields written and answered,
// for the next checkpoints to encode theirs in: a Go guest's field is
// tens of KiB a call, which was a quarter of a checkpoint's garbage. A
// pool rather than a buffer per claim: an idle session keeps nothing.
var recordBufs sync.Pool

// room returns dst emptied when it can hold size bytes, else new memory
// with room for a state that grows a little.
func room(dst []byte, size int) []byte {
	if cap(dst) >= size {
		return dst[:0]
	}
	return make([]byte, 0, size+size/8)
}

// takeRecordBuf returns memory from recordBufs, nil when it has none.
func takeRecordBuf() []byte {
	if b, ok := recordBufs.Get().(*[]byte); ok {
		return *b
	}
	return nil
}

// maxPooled is the largest memory the pools keep: a state written whole
// may be up to statestore.MaxValue, which is not to circulate through
// small records.
const maxPooled = 1 << 20

// giveRecordBuf gives b back to recordBufs unless its write (which ended
// in err) may still be reading it (reusable).
func giveRecordBuf(b []byte, err error) {
	if b == nil || cap(b) > maxPooled || !reusable(err) {
		return
	}
	b = b[:0]
	recordBufs.Put(&b)
}

// reusable reports whether the memory of a write that ended in err is
// free again: the write got an answer, or was never sent. One that may
// have landed may also still be sending it, as a Redis call whose caller
// gave up runs on (statestore.Redis).
func reusable(err error) bool { return !mayHaveLanded(err) }

// appendBytes appends v's length (uvarint) and v.
func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

// marshalBase encodes frames as a "b/NAME" field.
func marshalBase(frames [][]byte) []byte {
	size := len(baseMagic) + 1 + binary.MaxVarintLen64
	for _, f := range frames {
		size += binary.MaxVarintLen64 + len(f)
	}
	b := make([]byte, 0, size)
	b = append(b, baseMagic...)
	b = append(b, baseVersion)
	b = binary.AppendUvarint(b, uint64(len(frames)))
	for _, f := range frames {
		b = appendBytes(b, f)
	}
	return b
}

// unmarshalBase decodes a "b/NAME" field's frames (aliasing b).
func unmarshalBase(b []byte) ([][]byte, error) {
	rest, ok := bytes.CutPrefix(b, []byte(baseMagic))
	if !ok || len(rest) == 0 {
		return nil, errors.New("base: not a base of frames")
	}
	if rest[0] != baseVersion {
		return nil, fmt.Errorf("base: format version %d, not %d (written by a later version of wasmtools)", rest[0], baseVersion)
	}
	r := reader{b: rest[1:]}
	n := r.uvarint()
	if r.err == nil && (n > uint64(len(r.b)) || n > maxBaseFrames) {
		r.err = fmt.Errorf("base: %d frames", n)
	}
	frames := make([][]byte, 0, min(n, 1<<16))
	for i := uint64(0); i < n && r.err == nil; i++ {
		f := r.bytes()
		if r.err == nil && len(f) == 0 {
			return nil, errors.New("base: an empty frame")
		}
		frames = append(frames, f)
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) > 0 {
		return nil, errors.New("base: bytes after its last frame")
	}
	return frames, nil
}

// baseSum is the digest a split record names its base by.
func baseSum(field []byte) []byte {
	sum := sha256.Sum256(field)
	return sum[:baseSumSize]
}

// join puts s's snapshot back together, its base's frames from field (the
// "b/NAME" field, nil when the record has none).
func (s *splitState) join(field []byte) ([]byte, error) {
	var base [][]byte
	if s.refersToBase() {
		if field == nil {
			return nil, errors.New("record: its base of frames is missing")
		}
		if !bytes.Equal(baseSum(field), s.base) {
			return nil, errors.New("record: its base of frames is not the one it was written with")
		}
		var err error
		if base, err = unmarshalBase(field); err != nil {
			return nil, err
		}
	}
	size := len(s.head)
	for _, f := range s.frames {
		if f.base >= len(base) {
			return nil, fmt.Errorf("record: frame %d of a base of %d", f.base, len(base))
		}
		if f.base >= 0 {
			size += len(base[f.base])
		} else {
			size += len(f.data)
		}
		// A state joined is no larger than one written whole: a record
		// naming one large frame many times asks for no more.
		if size > statestore.MaxValue {
			return nil, fmt.Errorf("record: a state of over %d bytes", statestore.MaxValue)
		}
	}
	out := make([]byte, 0, size)
	out = append(out, s.head...)
	for _, f := range s.frames {
		if f.base >= 0 {
			out = append(out, base[f.base]...)
		} else {
			out = append(out, f.data...)
		}
	}
	return out, nil
}

// recordOf returns the name of the record in rec that stands for plugin
// name: its own, else the record of every plugin not named
// (sessions.AnyPlugin, "p/*/": the store lost the session's record), if
// any.
func recordOf(rec map[string][]byte, name string) string {
	if _, ok := rec["p/"+name]; !ok {
		if _, any := rec["p/"+sessions.AnyPlugin]; any {
			return sessions.AnyPlugin
		}
	}
	return name
}

// readPlugin returns plugin name's record in rec, its state whole: a
// split state is joined with the record's base of frames.
func readPlugin(rec map[string][]byte, name string) (pluginRecord, error) {
	var pr pluginRecord
	if err := unmarshalRecord(rec["p/"+name], &pr); err != nil {
		return pluginRecord{}, err
	}
	if pr.split != nil {
		data, err := pr.split.join(rec["b/"+name])
		if err != nil {
			return pluginRecord{}, err
		}
		pr.Data, pr.split = data, nil
	}
	return pr, nil
}

// reader reads a record's uvarints and byte strings, keeping its first
// error.
type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.b)
	if k <= 0 {
		r.err = errors.New("record: truncated")
		return 0
	}
	r.b = r.b[k:]
	return v
}

// next returns the next n bytes.
func (r *reader) next(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errors.New("record: truncated")
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// bytes returns a uvarint length and that many bytes.
func (r *reader) bytes() []byte { return r.next(r.uvarint()) }
