package durable

import (
	"context"
	"errors"
	"fmt"
	"sync"

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

// newStoredBase is what a base field holds, its frames fs with their
// keys (nil: taken here; a snapshot gives them with its frames).
func newStoredBase(field []byte, fs [][]byte, keys []frameKey) *storedBase {
	sb := &storedBase{at: make(map[frameKey]int, len(fs)), sum: baseSum(field)}
	for k, f := range fs {
		if keys != nil {
			sb.at[keys[k]] = k
		} else {
			sb.at[keyOf(f)] = k
		}
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

// frameScratch holds a checkpoint's lists of its state's frames (a Go
// guest's snapshot has hundreds), kept in frameScratches for the next
// checkpoints: made anew at each they were a fifth of a checkpoint's
// garbage. A pool rather than lists per claim: an idle session keeps
// nothing.
type frameScratch struct {
	frames [][]byte
	keys   []frameKey
	split  splitState
}

var frameScratches sync.Pool

func takeFrameScratch() *frameScratch {
	if fs, ok := frameScratches.Get().(*frameScratch); ok {
		return fs
	}
	return new(frameScratch)
}

// giveFrameScratch gives fs back, holding no frame: its lists alias an
// instance's snapshot.
func giveFrameScratch(fs *frameScratch) {
	clear(fs.frames)
	clear(fs.split.frames)
	fs.frames, fs.keys, fs.split.frames = fs.frames[:0], fs.keys[:0], fs.split.frames[:0]
	fs.split.head, fs.split.base = nil, nil
	frameScratches.Put(fs)
}

// frames lists st's frames (its Data is the snapshot's head) in fs, with
// their keys as the snapshot gave them, none when it has none; and says
// whether st is worth splitting: a state too small, or with an empty
// frame (which no record nor base holds), is written whole.
func (fs *frameScratch) list(st *plugins.State) (split bool) {
	fs.frames, fs.keys = fs.frames[:0], fs.keys[:0]
	if st == nil || !st.Host || len(st.Frames) == 0 {
		return false
	}
	size := len(st.Data)
	split = true
	for _, f := range st.Frames {
		fs.frames = append(fs.frames, f.Bytes[:len(f.Bytes):len(f.Bytes)])
		fs.keys = append(fs.keys, frameKey{f.Sum, len(f.Bytes)})
		size += len(f.Bytes)
		split = split && len(f.Bytes) > 0
	}
	return split && size >= splitMin
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
	c.bases[name] = newStoredBase(field, fs, nil)
}

// writeState writes plugin name's record pr, whose state is st, into c's
// record: split against the stored base when that is worth it, else whole
// and then a new base. It returns the bytes written, and the error of the
// state's write. c.mu is held.
func (d *Keeper) writeState(ctx context.Context, c *Claim, name string, pr pluginRecord, st *plugins.State) (int, error) {
	fs := takeFrameScratch()
	defer giveFrameScratch(fs)
	b, base, split, err := c.encodePlugin(name, pr, st, false, fs)
	if err != nil {
		return 0, err
	}
	written, err := d.putState(ctx, c, name, b, base, fs.keys)
	if statestore.Lost(err) {
		if err = d.relost(ctx, c.key, c); err != nil {
			return written, err
		}
		// Encoded again: the base went with the record.
		if b, base, split, err = c.encodePlugin(name, pr, st, false, fs); err != nil {
			return written, err
		}
		written, err = d.putState(ctx, c, name, b, base, fs.keys)
	}
	if split && refused(err) {
		// Refused split (the byte budgets: its own frames beside the
		// base), the state may fit whole, the base replaced.
		if b, base, _, err = c.encodePlugin(name, pr, st, true, fs); err != nil {
			return written, err
		}
		written, err = d.putState(ctx, c, name, b, base, fs.keys)
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
// base, if any (nil: none), once that write is answered; keys are the
// base's frames' (nil: taken from them). It returns the bytes written and
// the error of b's write: a base not written costs only size, as the
// state is whole. c.mu is held.
func (d *Keeper) putState(ctx context.Context, c *Claim, name string, b []byte, base [][]byte, keys []frameKey) (int, error) {
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
		base, keys, bf = [][]byte{}, nil, marshalBase(nil)
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
	c.wroteBase(name, bf, base, keys, berr)
	if berr == nil {
		written += len(bf)
	}
	return written, nil
}

// encodePlugin encodes pr, whose state is st, as plugin name's "p/NAME"
// field: its frames that the stored base holds by reference, when the
// base is known and still worth it (and whole is false); else whole
// (split false). With a whole state worth splitting it also returns the
// base to write once that write is answered (nil: none), whose keys are
// fs.keys. The lists are fs's (nil: lists of its own). c.mu is held.
func (c *Claim) encodePlugin(name string, pr pluginRecord, st *plugins.State, whole bool, fs *frameScratch) (field []byte, base [][]byte, split bool, err error) {
	if fs == nil {
		fs = new(frameScratch)
	}
	worth := fs.list(st)
	if !worth {
		b, err := marshalRecord(takeRecordBuf(), pr, fs.frames...)
		if sb := c.bases[name]; sb != nil && sb.size > 0 {
			// A state no longer split: its base is emptied after it.
			return b, [][]byte{}, false, err
		}
		return b, nil, false, err
	}
	if sb := c.bases[name]; sb != nil && len(sb.at) > 0 && !whole {
		s := &fs.split
		s.head, s.base, s.frames = pr.Data, sb.sum, s.frames[:0]
		own, shared := 0, 0
		for k, f := range fs.frames {
			if n, ok := sb.at[fs.keys[k]]; ok {
				s.frames = append(s.frames, frameRef{base: n})
				shared += len(f)
				continue
			}
			s.frames = append(s.frames, frameRef{base: -1, data: f})
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
	b, err := marshalRecord(takeRecordBuf(), pr, fs.frames...)
	return b, fs.frames, false, err
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
// frames fs, their keys keys: nil, taken from them), right after its
// state was written whole, or not. c.mu is held.
func (c *Claim) wroteBase(name string, field []byte, fs [][]byte, keys []frameKey, err error) {
	if err != nil {
		delete(c.bases, name) // the state is whole: nothing refers to it
		return
	}
	c.bases[name] = newStoredBase(field, fs, keys)
}
