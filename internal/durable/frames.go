package durable

import (
	"context"
	"errors"
	"fmt"

	"github.com/wasmtools/wasmtools/internal/statestore"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// A host snapshot ends with its compressed frames, and a frame whose
// pieces a call did not change comes out of the next snapshot byte for
// byte the same (sandbox.Instance.SnapshotParts). So a plugin's state is
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
	// compactShare: past this share of the base (and compactMin), a
	// state's own frames have the base rewritten too, once the split
	// writes against it have carried as many bytes as a rewrite costs
	// (the state whole, and the base: twice the base). A Go guest's
	// state grows as its heap spreads, and its own frames with it: at
	// half the base only, the Go servlet's checkpoint wrote 53 KB on
	// average over 3,000 calls (98 KB by the end) and 91 KB over 6,000;
	// at an eighth, 32 KB and 43 KB, and took 10% less time over 3,000
	// (three rounds of each in turn; at a sixteenth the whole writes,
	// 300 KB and the base after them, cost more than they saved). The
	// carried bytes keep a state that changes more than an eighth of
	// itself a call from being written whole at every call: it is
	// rewritten at most once per twice its base's bytes written split.
	compactShare = 8
)

// storedBase is what a claim knows of a plugin's stored base. A plugin
// with none is unknown: its next checkpoint writes its state whole, and
// then the base.
type storedBase struct {
	// at numbers the stored base's frames by their hash.
	at   map[frameKey]int
	sum  []byte // the stored base's baseSum
	size int    // its frames' bytes
	// carried is the bytes of own frames the claim's split states
	// have carried beside this base since it knew it (compactShare).
	carried int
}

// newStoredBase is what a base field holds, its frames fs.
func newStoredBase(field []byte, fs [][]byte) *storedBase {
	sb := &storedBase{at: make(map[frameKey]int, len(fs)), sum: baseSum(field)}
	for k, f := range fs {
		sb.at[keyOf(f)] = k
		sb.size += len(f)
	}
	return sb
}

// frameKey identifies a frame by its sum (sandbox.FrameSum, the one a
// snapshot gives of each of its frames) and length. The sum is not
// cryptographic, but its seed is random per process and no guest sees it
// (the same reasoning as the sandbox's page hashes).
type frameKey struct {
	hash uint64
	size int
}

func keyOf(frame []byte) frameKey {
	return frameKey{sandbox.FrameSum(frame), len(frame)}
}

// frames returns st's frames (its Data is the snapshot's head), with
// their keys as the snapshot gave them, nil when it has none; and whether
// st is worth splitting: a state too small, or with an empty frame (which
// no record nor base holds), is written whole.
func frames(st *plugins.State) (frames [][]byte, keys []frameKey, split bool) {
	if st == nil || !st.Host || len(st.Frames) == 0 {
		return nil, nil, false
	}
	size := len(st.Data)
	frames = make([][]byte, len(st.Frames))
	keys = make([]frameKey, len(st.Frames))
	split = true
	for k, f := range st.Frames {
		frames[k] = f.Bytes[:len(f.Bytes):len(f.Bytes)]
		keys[k] = frameKey{f.Sum, len(f.Bytes)}
		size += len(f.Bytes)
		split = split && len(f.Bytes) > 0
	}
	return frames, keys, split && size >= splitMin
}

// learnBase records what rec, a record just read, holds of plugin name's
// base. Not while a write of this claim may still land (dirty: it got no
// answer, and the fence is not bumped yet): a base written late, after the
// read, would make every state written against the one read unreadable.
// c.mu is held.
func (c *Claim) learnBase(name string, rec map[string][]byte) {
	field, ok := rec["b/"+name]
	c.baseBytes[name] = len(field)
	if !ok || c.dirty {
		delete(c.bases, name)
		return
	}
	fs, err := unmarshalBase(field)
	if err != nil {
		delete(c.bases, name)
		return
	}
	c.bases[name] = newStoredBase(field, fs)
}

// writeState writes plugin name's record pr, whose state is st, into c's
// record: split against the stored base when that is worth it, else whole
// and then a new base. It returns the bytes written, and the error of the
// state's write. c.mu is held.
func (d *Keeper) writeState(ctx context.Context, c *Claim, name string, pr pluginRecord, st *plugins.State) (int, error) {
	b, base, split, err := c.encodePlugin(name, pr, st, false)
	if err != nil {
		return 0, err
	}
	written, err := d.putState(ctx, c, name, b, base)
	if statestore.Lost(err) {
		if err = d.relost(ctx, c.key, c); err != nil {
			return written, err
		}
		// Encoded again: the base went with the record.
		if b, base, split, err = c.encodePlugin(name, pr, st, false); err != nil {
			return written, err
		}
		written, err = d.putState(ctx, c, name, b, base)
	}
	if split && refused(err) {
		// Refused split (the byte budgets: its own frames beside the
		// base), the state may fit whole, the base replaced.
		if b, base, _, err = c.encodePlugin(name, pr, st, true); err != nil {
			return written, err
		}
		written, err = d.putState(ctx, c, name, b, base)
	}
	return written, err
}

// refused reports whether err refused a write before it was sent (the
// byte budgets), so that the store is as it was and the write may
// succeed in another form. c.mu is held.
func refused(err error) bool { return errors.Is(err, errRefused) }

// mayHaveLanded reports whether a write that failed with err was sent and
// got no answer: it may be in the store, or not.
func mayHaveLanded(err error) bool {
	return err != nil && !refused(err) && !errors.Is(err, errStoreDown) && unanswered(err)
}

// putState writes a "p/NAME" field b as encodePlugin made it, and then
// base, if any (nil: none), once that write is answered. It returns the
// bytes written and the error of b's write: a base not written costs
// only size, as the state is whole. c.mu is held.
func (d *Keeper) putState(ctx context.Context, c *Claim, name string, b []byte, base [][]byte) (int, error) {
	field := "b/" + name
	var undoBase func()
	if base != nil {
		// The state is written whole, and a new base after it: the old
		// base, which the whole state no longer needs, is not counted
		// against the byte budgets meanwhile (a record over its budget
		// by its old base for the moment between the two writes), or a
		// state that grew past half the budget could never be written
		// whole, and so never saved again. (A size of 0 fits any budget.)
		var rerr error
		if undoBase, rerr = d.reserve(c.id, field, 0, d.ttl()); rerr != nil {
			undoBase = func() {}
		}
	}
	pctx := ctx
	if base != nil {
		pctx = statestore.Replacing(ctx, field) // and in the store's count
	}
	err := d.putLocked(pctx, c, "p/"+name, b)
	c.wrotePlugin(name, err)
	giveRecordBuf(b, err) // only its length is used after this
	if base == nil {
		return len(b), err
	}
	if err != nil {
		undoBase()
		return 0, err
	}
	written := len(b)
	old := c.baseBytes[name]
	bf := marshalBase(base)
	berr := d.putLocked(ctx, c, field, bf)
	if berr == nil {
		// Counted again: a write skipped as unchanged reserved nothing.
		if _, rerr := d.reserve(c.id, field, len(bf), d.ttl()); rerr != nil {
			berr = fmt.Errorf("%w: %w", errRefused, rerr)
		}
	}
	maybe := old // what the store may hold of the base now
	if mayHaveLanded(berr) {
		maybe = max(old, len(bf)) // either
	}
	if berr != nil && !mayHaveLanded(berr) && len(base) > 0 {
		// A base that does not fit (the budgets) is not kept, nor the
		// old one, which nothing refers to now.
		base, bf = [][]byte{}, marshalBase(nil)
		berr = d.putLocked(ctx, c, field, bf)
		if mayHaveLanded(berr) {
			maybe = max(maybe, len(bf))
		}
	}
	if berr == nil {
		c.baseBytes[name] = len(bf)
	} else {
		// Counted as what the store may hold, whatever the budgets: the
		// old base was counted as nothing while the state was written
		// whole.
		d.count(c.id, field, maybe, d.ttl())
		c.baseBytes[name] = maybe
	}
	c.wroteBase(name, bf, base, berr)
	if berr == nil {
		written += len(bf)
	}
	return written, nil
}

// encodePlugin encodes pr, whose state is st, as plugin name's "p/NAME"
// field: its frames that the stored base holds by reference, when the
// base is known and still worth it (and whole is false); else whole
// (split false). With a whole state worth splitting it also returns the
// base to write once that write is answered (nil: none). c.mu is held.
func (c *Claim) encodePlugin(name string, pr pluginRecord, st *plugins.State, whole bool) (field []byte, base [][]byte, split bool, err error) {
	fs, keys, worth := frames(st)
	if !worth {
		b, err := marshalRecord(takeRecordBuf(), pr, fs...)
		if sb := c.bases[name]; sb != nil && sb.size > 0 {
			// A state no longer split: its base is emptied after it.
			return b, [][]byte{}, false, err
		}
		return b, nil, false, err
	}
	if sb := c.bases[name]; sb != nil && len(sb.at) > 0 && !whole {
		s := &splitState{head: pr.Data, base: sb.sum, frames: make([]frameRef, len(fs))}
		own, shared := 0, 0
		for k, f := range fs {
			if n, ok := sb.at[keys[k]]; ok {
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
		rebase := own > max(compactMin, sb.size/2) ||
			own > max(compactMin, sb.size/compactShare) && sb.carried >= 2*sb.size
		if !rebase && 2*shared >= sb.size {
			sb.carried += own
			b, err := marshalSplit(takeRecordBuf(), pr, s)
			return b, nil, true, err
		}
	}
	b, err := marshalRecord(takeRecordBuf(), pr, fs...)
	return b, fs, false, err
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
	c.bases[name] = newStoredBase(field, fs)
}
