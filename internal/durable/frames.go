package durable

import (
	"hash/maphash"

	"github.com/wasmtools/wasmtools/plugins"
)

// A host snapshot ends with its compressed frames, and a frame whose
// pieces a call did not change comes out of the next snapshot byte for
// byte the same (sandbox.Instance.SnapshotFrames). So a plugin's state is
// kept in two fields: "b/NAME", the base, the frames of a state written
// whole now and then; and "p/NAME", written at every checkpoint, which
// gives its state as the snapshot's head and its frames in order, each
// either a frame of the base (by number) or its own bytes. A call then
// writes only what it changed, a few KiB, not the whole state (docs/
// DESIGN.md, "Checkpoints write what changed").
//
// The one rule that keeps every stored "p/NAME" readable: the base is
// written only when the stored "p/NAME" holds its state whole (refers to
// nothing in the base), that is, right after such a write was answered,
// under the claim's lock. A reference is only ever written against the
// base this claim wrote or read, and names the base's digest, so a record
// read with another base is refused (its plugin starts afresh, with a
// reset said), never restored from the wrong frames.
const (
	// splitMin is the least state worth splitting: below it a state is
	// written whole, as before.
	splitMin = 16 << 10
	// compactMin is the most a state's own frames (those not in the
	// base) may take before the state is written whole and the base
	// rewritten, unless half the base is more.
	compactMin = 32 << 10
)

// storedBase is what a claim knows of a plugin's stored base. A plugin
// with none is unknown: its next checkpoint writes its state whole, and
// then the base.
type storedBase struct {
	// at numbers the stored base's frames by their hash.
	at   map[frameKey]int
	sum  []byte // the stored base's baseSum
	size int    // its frames' bytes
}

// frameKey identifies a frame by its hash and length. The hash is not
// cryptographic, but its seed is random per process and no guest sees it
// (the same reasoning as the sandbox's page hashes).
type frameKey struct {
	hash uint64
	size int
}

var frameSeed = maphash.MakeSeed()

func keyOf(frame []byte) frameKey {
	return frameKey{maphash.Bytes(frameSeed, frame), len(frame)}
}

// frames splits st's snapshot into its head and frames: nil when st says
// nothing of its frames, or is too small to be worth splitting.
func frames(st *plugins.State) (head []byte, frames [][]byte) {
	if st == nil || !st.Host || len(st.Frames) == 0 || len(st.Data) < splitMin {
		return nil, nil
	}
	total := 0
	for _, n := range st.Frames {
		if n <= 0 || n > len(st.Data) {
			return nil, nil
		}
		total += n
	}
	if total > len(st.Data) {
		return nil, nil
	}
	at := len(st.Data) - total
	head = st.Data[:at]
	frames = make([][]byte, len(st.Frames))
	for k, n := range st.Frames {
		frames[k] = st.Data[at : at+n : at+n]
		at += n
	}
	return head, frames
}

// learnBase records what rec, a record just read, holds of plugin name's
// base. Not while a write of this claim may still land (dirty: it got no
// answer, and the fence is not bumped yet): a base written late, after the
// read, would make every state written against the one read unreadable.
// c.mu is held.
func (c *Claim) learnBase(name string, rec map[string][]byte) {
	field, ok := rec["b/"+name]
	if !ok || c.dirty {
		delete(c.bases, name)
		return
	}
	fs, err := unmarshalBase(field)
	if err != nil {
		delete(c.bases, name)
		return
	}
	sb := &storedBase{at: make(map[frameKey]int, len(fs)), sum: baseSum(field)}
	for k, f := range fs {
		sb.at[keyOf(f)] = k
		sb.size += len(f)
	}
	c.bases[name] = sb
}

// encodePlugin encodes pr, whose state is st, as plugin name's "p/NAME"
// field: its frames that the stored base holds by reference, when the
// base is known and still worth it; else whole. With a whole state worth
// splitting it also returns the base to write once that write is
// answered (nil: none). c.mu is held.
func (c *Claim) encodePlugin(name string, pr pluginRecord, st *plugins.State) (field []byte, base [][]byte, err error) {
	head, fs := frames(st)
	if fs == nil {
		b, err := marshalRecord(pr)
		if sb := c.bases[name]; sb != nil && sb.size > 0 {
			// A state no longer split: its base is emptied after it.
			return b, [][]byte{}, err
		}
		return b, nil, err
	}
	if sb := c.bases[name]; sb != nil && len(sb.at) > 0 {
		s := &splitState{head: head, base: sb.sum, frames: make([]frameRef, len(fs))}
		own, shared := 0, 0
		for k, f := range fs {
			if n, ok := sb.at[keyOf(f)]; ok {
				s.frames[k] = frameRef{base: n}
				shared += len(f)
				continue
			}
			s.frames[k] = frameRef{base: -1, data: f}
			own += len(f)
		}
		// Worth it while the state's own frames are small beside the
		// base, and most of the base is still the state's (what is not
		// is kept for nothing).
		if own <= max(compactMin, sb.size/2) && 2*shared >= sb.size {
			b, err := marshalSplit(pr, s)
			return b, nil, err
		}
	}
	b, err := marshalRecord(pr)
	return b, fs, err
}

// wrotePlugin notes that plugin name's "p/NAME" field, as encodePlugin
// returned it, was written or not (err). One that got no answer (it may
// land yet, or not: dirty) leaves what the store holds unknown until it
// is written whole again; one refused left it as it was. c.mu is held.
func (c *Claim) wrotePlugin(name string, err error) {
	if err != nil && c.dirty {
		delete(c.bases, name)
	}
}

// wroteBase notes that plugin name's base was written as field (err nil,
// frames fs), right after its state was written whole, or not. c.mu is
// held.
func (c *Claim) wroteBase(name string, field []byte, fs [][]byte, err error) {
	if err != nil {
		delete(c.bases, name) // the state is whole: nothing refers to it
		return
	}
	sb := &storedBase{at: make(map[frameKey]int, len(fs)), sum: baseSum(field)}
	for k, f := range fs {
		sb.at[keyOf(f)] = k
		sb.size += len(f)
	}
	c.bases[name] = sb
}
