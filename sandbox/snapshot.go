package sandbox

import (
	"bytes"
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/tetratelabs/wazero/api"
	"github.com/zeebo/xxh3"

	"github.com/wasmtools/wasmtools/abi"
)

// Host-side snapshots (docs/DESIGN.md, "sandbox: snapshots"): the state of
// an instance between calls, saved by the host without the guest's help,
// and restored into a fresh instance of the same code.
//
// What survives a call, and so what a snapshot holds: the linear memory
// (only the pages that differ from the module's initial image), every
// mutable global (non-exported ones through the exports exportGlobals
// adds), the Extism vars, and the guest's two fake clocks. What does not
// survive a call, and is not saved: the kernel's arena (reset before each
// call), the last HTTP response's status and headers (read by guests in
// the call that made the request), the log rate limit. What the host
// cannot save makes the module refused (snapModule.refusal): tables
// changed at run time, dropped data segments, mutable reference or v128
// globals, imported mutable globals, files the guest may hold open.

var (
	// ErrSnapshotRefused is matched by the error of a snapshot the host
	// cannot take faithfully; the error is a [*SnapshotError] naming why.
	ErrSnapshotRefused = errors.New("sandbox: the host cannot snapshot this module")
	// ErrSnapshotMismatch is matched by a restore of a snapshot taken of
	// other code (another module, or another version of the host's
	// snapshot format).
	ErrSnapshotMismatch = errors.New("sandbox: the snapshot is of other code")
	// ErrBadSnapshot is matched by a restore of bytes that are not a
	// whole, valid snapshot, or that hold more than the policy allows.
	ErrBadSnapshot = errors.New("sandbox: not a valid snapshot")
)

// SnapshotError says why the host cannot snapshot a module's instances. It
// matches [ErrSnapshotRefused].
type SnapshotError struct {
	Reason string
}

func (e *SnapshotError) Error() string {
	return "the host cannot snapshot this module: " + e.Reason
}

func (e *SnapshotError) Is(target error) bool { return target == ErrSnapshotRefused }

const (
	pageSize = 65536
	// snapshotMagic starts every snapshot, followed by the format version
	// byte and the sha256 of the module it was taken of.
	snapshotMagic  = "wtsn"
	snapshotHeader = len(snapshotMagic) + 1 + 32
	// snapshotVersion is the format snapshots are taken in: after the
	// header, the length and bytes of the index, an S2 block and its
	// CRC-32C (a zstd frame before version 5), of the globals, clocks,
	// vars, memory size (in 64 KiB pages) and the frames: for each, how
	// many 4 KiB pieces it holds (1 to framePieces), the first piece's
	// index and the gap to each next one, and the frame's length; then
	// the frames, each its pieces' bytes in order, compressed: an S2
	// block and the CRC-32C of its bytes (little-endian), or, kept from a
	// snapshot of version 4 restored, one zstd frame (which starts with
	// zstd's magic number, an S2 block of whole pieces never does).
	// Restores still read versions 1 (one frame of it all, the 64 KiB
	// pages raw), 2 (a frame per 64 KiB page), 3 (a frame per piece) and 4
	// (the frames zstd only).
	snapshotVersion  = 5
	snapshotVersion4 = 4
	snapshotVersion3 = 3
	snapshotVersion2 = 2
	snapshotVersion1 = 1
	// pieceSize is the unit versions 3 and 4 save: the system's page,
	// the unit a guest's write makes an instance's own.
	pieceSize     = osPage
	piecesPerPage = pageSize / pieceSize
	// maxFrameOver is the most a unit's frame takes over the unit: a raw
	// block, header and checksum (zstd), or literal tags and the CRC
	// (S2).
	maxFrameOver = 64
)

// snapModule is what a Compiled knows about snapshotting its instances.
type snapModule struct {
	// refusal says why the host cannot snapshot the module; "" when it
	// can.
	refusal string
	// globals names the export of each mutable global, in index order.
	globals []string

	// images says whether new instances start from a pre-initialised
	// image, noImages why not (image.go).
	images   bool
	noImages string
	// hasStart: the module runs code while instantiated, so its data
	// segments must land in memory that reads as the spec says.
	hasStart bool
	// scratch holds buffers of *[]byte in which wazero applies the data
	// segments of an instance starting from the image, which then
	// replaces them (see reservedMemory.Reallocate).
	scratch sync.Pool

	mu         sync.Mutex
	base       *baseImage // nil until a snapshot needs it
	diff       *imageDiff // nil until a restore onto the image needs it
	image      *image     // nil until the first instance is initialised
	imageTried bool
	imageUsed  bool // an instance started from image
}

// baseImage is the module's linear memory as instantiation leaves it,
// before its initialisation export runs: what a restore starts from, and
// what snapshots are the difference to.
type baseImage struct {
	hashes []uint64 // of each 4 KiB piece (hashPage)
}

func (c *checker) snapModule() *snapModule {
	if c.snap.refusal != "" {
		return &snapModule{refusal: c.snap.refusal}
	}
	names, err := c.snapGlobals()
	if err != nil {
		return &snapModule{refusal: err.Error()}
	}
	return &snapModule{globals: names, hasStart: c.snap.hasStart}
}

// policyRefusal refuses what the policy makes uncapturable: files a guest
// opens in a mounted folder stay open across calls as WASI descriptors,
// which live in wazero, outside the instance's memory.
func (s *snapModule) policyRefusal(c *Compiled) {
	if s.refusal == "" && (c.fsConfig != nil || len(c.asks) > 0) && c.ImportsFunc(abi.WASIModule, "path_open") {
		s.refusal = "it may keep files open in its mounted folders, and open files are not captured"
	}
}

// CanSnapshot reports whether the host can snapshot the module's
// instances: nil, or a [*SnapshotError] naming the first cause found.
// Safe for concurrent use.
func (c *Compiled) CanSnapshot() error {
	if c.snap.refusal != "" {
		return &SnapshotError{Reason: c.snap.refusal}
	}
	return nil
}

// SHA256 returns the hex sha256 of the module's bytes as given to
// [Runtime.Compile]: the code a snapshot names.
func (c *Compiled) SHA256() string { return hex.EncodeToString(c.sha256[:]) }

// baseImage returns the module's initial memory image, making it with a
// throwaway instance the first time.
func (c *Compiled) baseImage(ctx context.Context) (*baseImage, error) {
	c.snap.mu.Lock()
	defer c.snap.mu.Unlock()
	if c.snap.base != nil {
		return c.snap.base, nil
	}
	inst, err := c.instantiate(ctx, false, nil)
	if err != nil {
		return nil, err
	}
	defer inst.Close(context.Background())
	b := &baseImage{}
	err = inst.withMemory(func(mem []byte) error {
		for p := 0; p+pieceSize <= len(mem); p += pieceSize {
			b.hashes = append(b.hashes, hashPage(mem[p:p+pieceSize]))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.snap.base = b
	return b, nil
}

// withMemory runs f with the instance's linear memory (nil for none),
// which stays mapped while f runs.
func (i *Instance) withMemory(f func(mem []byte) error) error {
	if !i.mem.enterLive() {
		return fmt.Errorf("%w: its module was closed", ErrClosed)
	}
	defer i.mem.exit()
	var mem []byte
	if m := moduleMemory(i.mod); m != nil {
		mem, _ = m.Read(0, m.Size())
	}
	return f(mem)
}

var zeroPage [pageSize]byte

func isZero(page []byte) bool { return bytes.Equal(page, zeroPage[:len(page)]) }

// Snapshot saves the instance's state between calls: its linear memory
// (the 4 KiB pieces that differ from the module's initial image), its
// mutable globals, its Extism vars and its clocks, compressed (S2).
// The snapshot names the module's sha256, and [Compiled.Restore] restores
// it only into a Compiled of the same bytes. It contains everything the
// guest keeps, secrets included: store it as the guest's memory.
//
// Pieces are compressed in frames of up to 16, and the instance keeps the
// last snapshot's frames (at most that snapshot's size, freed by Close),
// so that a snapshot compresses only the pieces written since the one
// before, together, and the unchanged pieces of the frames those broke;
// it is still whole, and restores without them. Where the system says
// which pieces of the memory were never written (Linux's pagemap), those
// are not even read.
//
// It fails with a [*SnapshotError] (matching [ErrSnapshotRefused]) when
// the module's state cannot be captured ([Compiled.CanSnapshot]), and with
// [ErrClosed] when the instance is closed. It must not run during a call
// of the instance. The first snapshot of a module makes its initial image
// with a throwaway instance, under ctx and the call timeout.
func (i *Instance) Snapshot(ctx context.Context) ([]byte, error) {
	head, frames, err := i.SnapshotParts(ctx)
	if err != nil {
		return nil, err
	}
	size := len(head)
	for _, f := range frames {
		size += len(f.Bytes)
	}
	out := append(make([]byte, 0, size), head...)
	for _, f := range frames {
		out = append(out, f.Bytes...)
	}
	return out, nil
}

// SnapshotParts is [Instance.Snapshot] in parts: the snapshot's head, all
// of it before its compressed frames, and the frames, whose bytes follow
// the head in order. A frame whose pieces the next snapshot finds
// unchanged comes out of it byte for byte the same (the same memory), so
// a store can keep the frames a state shares with the one before apart
// and write only the new ones (internal/durable does); and a caller that
// copies the parts into a record of its own saves the copy into one
// snapshot, which a Go guest's checkpoint spent 28 µs on when it had
// grown. The frames' bytes are the instance's: the caller must not write
// to them. Joined, the parts restore without knowing their frames.
func (i *Instance) SnapshotParts(ctx context.Context) (head []byte, frames []Frame, err error) {
	if i.err != nil {
		return nil, nil, fmt.Errorf("snapshot: %w: %v", ErrClosed, i.err)
	}
	if i.deadline != nil {
		return nil, nil, errors.New("snapshot: a call of the instance is running")
	}
	c := i.compiled
	if err := c.CanSnapshot(); err != nil {
		return nil, nil, err
	}
	base, err := c.baseImage(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: initial image: %w", err)
	}
	meta := binary.AppendUvarint(i.snapSort.meta[:0], uint64(len(c.snap.globals)))
	for _, name := range c.snap.globals {
		meta = binary.LittleEndian.AppendUint64(meta, i.mod.ExportedGlobal(name).Get())
	}
	meta = binary.LittleEndian.AppendUint64(meta, uint64(i.wall.Load()))
	meta = binary.LittleEndian.AppendUint64(meta, uint64(i.mono.Load()))
	keys := make([]string, 0, len(i.kernel.vars))
	for k := range i.kernel.vars {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	meta = binary.AppendUvarint(meta, uint64(len(keys)))
	for _, k := range keys {
		meta = appendBytes(appendBytes(meta, []byte(k)), i.kernel.vars[k])
	}
	var (
		pages      uint32
		saved      []cachedFrame
		compressed int
	)
	err = i.withMemory(func(mem []byte) error {
		pages = uint32(len(mem) / pageSize)
		pieces := pages * piecesPerPage
		// The pieces not written since the last snapshot are as they
		// were then (snapFrames describes them whole, up to
		// snapPieces): written is nil when that is unknown. The kernel
		// says which pieces were written since the last scan, which
		// the last snapshot (or the restore) made, where it tracks
		// writes (writes_linux.go); else pagemap says which were ever
		// written since the memory was mapped. The scan runs whatever
		// snapPieces, as it arms the tracking for the next snapshot.
		//
		// Pagemap is read before a scan that may register the memory
		// (after it, its never-written pages read as swapped), and its
		// answer then counts the pieces the instance owns
		// (trackChoice); a registered memory's answer over-counts, which
		// costs only hashing.
		var written, owned []uint64
		var ownScanTime time.Duration
		if i.snapPieces > 0 && i.mem != nil && !i.mem.registeredForWrites() {
			ownStart := time.Now()
			owned = writtenPieces(mem)
			ownScanTime = time.Since(ownStart)
		}
		scanStart := time.Now()
		scanned, tracked, protected := i.mem.scanWrites(mem, i.track.want(), i.track.protect())
		scanTime := time.Since(scanStart)
		i.snapTracked = tracked && i.snapPieces > 0
		switch {
		case i.snapPieces == 0 || i.mem == nil:
		case tracked:
			written = scanned
		case owned != nil:
			written = owned
		default:
			written = writtenPieces(mem)
		}
		var fresh, stale []pieceHash
		hashedPieces, start := 0, time.Now()
		saved, fresh, stale = i.snapFrames.sort(pieces, written, i.snapPieces, &i.snapSort, func(p uint32) (look, uint64) {
			hashedPieces++
			h := hashPage(mem[p*pieceSize : (p+1)*pieceSize])
			if h == base.hash(p) {
				return initial, 0
			}
			return hashed, h
		})
		took := time.Since(start)
		// What changed is compressed apart from what did not but lost
		// its frame, so that the next snapshot, where much the same
		// pieces change, finds the others' frames whole.
		kept := len(saved)
		for _, group := range [][]pieceHash{fresh, stale} {
			for len(group) > 0 {
				n := min(len(group), framePieces)
				saved = append(saved, encodeFrame(mem, group[:n]))
				compressed += n
				group = group[n:]
			}
		}
		if written != nil {
			i.track.update(snapshotFigures{
				tracked: i.snapTracked, ownedKnown: !i.snapTracked && owned != nil,
				written: written, protected: protected, scanTime: scanTime,
				changed: len(fresh), grew: pieces > i.snapPieces, hashed: hashedPieces, hashTime: took,
				ownScanTime: ownScanTime,
			})
		}
		mergeFrames(saved, kept)
		i.snapPieces = pieces
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("snapshot: %w", err)
	}
	i.snapFrames, i.snapCompressed = saved, compressed
	meta = binary.AppendUvarint(meta, uint64(pages))
	meta = binary.AppendUvarint(meta, uint64(len(saved)))
	for _, f := range saved {
		meta = binary.AppendUvarint(meta, uint64(len(f.pieces)))
		prev := uint32(0)
		for k, p := range f.pieces {
			if k == 0 {
				meta = binary.AppendUvarint(meta, uint64(p))
			} else {
				meta = binary.AppendUvarint(meta, uint64(p-prev))
			}
			prev = p
		}
		meta = binary.AppendUvarint(meta, uint64(len(f.frame)))
	}
	metaFrame := encodeS2(i.snapSort.metaFrame, meta)
	i.snapSort.meta, i.snapSort.metaFrame = meta, metaFrame
	head = make([]byte, 0, snapshotHeader+binary.MaxVarintLen64+len(metaFrame))
	head = append(head, snapshotMagic...)
	head = append(head, snapshotVersion)
	head = append(head, c.sha256[:]...)
	head = appendBytes(head, metaFrame)
	frames = make([]Frame, len(saved))
	for k, f := range saved {
		frames[k] = Frame{f.frame, f.sum}
	}
	return head, frames, nil
}

// frameScratch holds buffers of *[]byte in which snapshots encode pages.
var frameScratch = sync.Pool{New: func() any {
	b := make([]byte, 0, s2.MaxEncodedLen(pageSize))
	return &b
}}

// encodeFrame compresses the pieces ps of mem into one frame: an S2
// block and its bytes' CRC-32C. S2 (klauspost/compress, beside zstd)
// compresses a Go heap's pieces three times as fast as zstd's fastest
// level, to about a quarter more bytes (64 KiB: 57 µs against 177 µs,
// 17 KiB against 13 KiB), and a checkpoint compresses the pieces every
// call writes; the CRC is what zstd's frame checksum was.
func encodeFrame(mem []byte, ps []pieceHash) cachedFrame {
	in, out := frameScratch.Get().(*[]byte), frameScratch.Get().(*[]byte)
	defer frameScratch.Put(in)
	defer frameScratch.Put(out)
	f := cachedFrame{pieces: make([]uint32, len(ps)), hashes: make([]uint64, len(ps))}
	*in = (*in)[:0]
	for k, p := range ps {
		f.pieces[k], f.hashes[k] = p.index, p.hash
		*in = append(*in, mem[p.index*pieceSize:(p.index+1)*pieceSize]...)
	}
	*out = s2.Encode((*out)[:cap(*out)], *in)
	f.frame = make([]byte, len(*out), len(*out)+4)
	copy(f.frame, *out)
	f.frame = binary.LittleEndian.AppendUint32(f.frame, crc32.Checksum(*in, castagnoli))
	f.sum = FrameSum(f.frame)
	return f
}

// Frame is a compressed frame a snapshot ends with ([Instance.SnapshotParts]).
type Frame struct {
	Bytes []byte // the instance's: not to be written to
	Sum   uint64 // FrameSum of them
}

// FrameSum is what a snapshot says of each of its frames' bytes, for a
// store to tell the frames it keeps already without reading them: a hash
// (XXH3) with a seed random per process, so that two frames with the same
// sum and length are the same bytes, but for a chance of 1 in 2^64 that no
// guest can aim for (it sees no sum, nor the seed; pageSeed says more).
// Taken once per frame, as it is compressed or restored, where a store
// hashing a Go guest's whole state at every checkpoint took 13 µs of it.
func FrameSum(frame []byte) uint64 { return xxh3.HashSeed(frame, frameSeed) }

// frameSeed seeds FrameSum, apart from the pieces' pageSeed.
var frameSeed = randomSeed()

// randomSeed is a seed for a hash no guest sees, random per process.
func randomSeed() uint64 {
	var b [8]byte
	if _, err := crand.Read(b[:]); err != nil {
		panic(err) // crypto/rand does not fail on supported systems
	}
	return binary.LittleEndian.Uint64(b[:])
}

// encodeS2 is b as an S2 block and b's CRC-32C, in dst's memory when it
// has room: a version 5 snapshot's index of its frames (zstd's fastest
// level took 35 µs a checkpoint for it, building entropy tables for a few
// KiB).
func encodeS2(dst, b []byte) []byte {
	if n := s2.MaxEncodedLen(len(b)) + 4; cap(dst) < n {
		dst = make([]byte, n)
	}
	out := s2.Encode(dst[:cap(dst)], b)
	return binary.LittleEndian.AppendUint32(out, crc32.Checksum(b, castagnoli))
}

// decodeS2Bounded decodes an S2 block and its CRC-32C that says it holds
// at most max bytes.
func decodeS2Bounded(frame []byte, max uint64) ([]byte, error) {
	if len(frame) < 5 {
		return nil, fmt.Errorf("%w: a frame of %d bytes", ErrBadSnapshot, len(frame))
	}
	n, err := s2.DecodedLen(frame[:len(frame)-4])
	if err != nil || uint64(n) > max || n == 0 {
		return nil, fmt.Errorf("%w: compressed body missing or over %d bytes", ErrBadSnapshot, max)
	}
	body := make([]byte, n)
	if err := decodeS2(frame, body); err != nil {
		return nil, err
	}
	return body, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// zstdMagic starts every zstd frame; an S2 block of whole pieces starts
// with its length, a multiple of 4096 as a uvarint, whose first byte is
// 0x80.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// framePieces is the most 4 KiB pieces a version 4 frame holds: 64 KiB,
// a frame scratch buffer's size. One zstd frame of 16 pieces takes about
// a third of the time of 16 frames of one (each builds its own entropy
// tables), and comes out smaller.
const framePieces = pageSize / pieceSize

// cachedFrame is a frame of an instance's last snapshot: the pieces it
// holds, in increasing order, the hash of each piece's contents, and the
// compressed frame of their bytes, one after the other.
type cachedFrame struct {
	pieces []uint32
	hashes []uint64
	frame  []byte
	sum    uint64 // FrameSum(frame)
}

// pieceHash is a piece to compress and the hash of its contents.
type pieceHash struct {
	index uint32
	hash  uint64
}

// cachedFrames is an instance's last snapshot, frame by frame, ordered by
// each frame's first piece.
type cachedFrames []cachedFrame

// byFirstPiece orders frames by their first piece.
func byFirstPiece(a, b cachedFrame) int { return cmp.Compare(a.pieces[0], b.pieces[0]) }

// mergeFrames orders fs by first piece, fs[:kept] being so ordered and
// the rest a snapshot's new frames, a few. Sorting the whole list cost a
// Go guest's snapshot 20 µs at 300 frames: each comparison reads a
// frame's pieces, elsewhere in memory, and a list with a few frames out
// of place at its end is pdqsort's slow case. Here the new frames are
// sorted among themselves, and each finds its place among the kept by a
// binary search, the kept frames after it moving up in one copy.
func mergeFrames(fs []cachedFrame, kept int) {
	added := fs[kept:]
	if len(added) == 0 {
		return
	}
	slices.SortFunc(added, byFirstPiece)
	var buf [8]cachedFrame
	news := append(buf[:0], added...)
	end, hi := len(fs), kept // fs[end:] is placed; fs[:hi] the kept not yet moved
	for j := len(news) - 1; j >= 0; j-- {
		first := news[j].pieces[0]
		at, _ := slices.BinarySearchFunc(fs[:hi], first, func(f cachedFrame, p uint32) int { return cmp.Compare(f.pieces[0], p) })
		n := copy(fs[end-(hi-at):end], fs[at:hi])
		end -= n + 1
		fs[end] = news[j]
		hi = at
	}
}

// sortScratch is the memory cachedFrames.sort works in, kept by an
// instance from one snapshot to the next; the zero value is ready.
type sortScratch struct {
	slot []uint64
	brk  []bool
	// lists are the two lists of frames that snapshots take turns to
	// fill: the one the last snapshot made is the instance's snapFrames,
	// the other is garbage (a Go guest's snapshot holds hundreds of
	// frames, and growing a new list at each was 30 µs of a checkpoint
	// once the guest's heap had spread).
	lists [2][]cachedFrame
	// meta and metaFrame hold the last snapshot's index of its frames,
	// before and after compression (SnapshotParts), for the next to be
	// written over: an aged Go guest's is about 10 KiB, grown by appends.
	meta, metaFrame []byte
}

// frameList returns an empty list of room for n frames that is not fs's.
func (s *sortScratch) frameList(fs cachedFrames, n int) []cachedFrame {
	if s == nil {
		return make([]cachedFrame, 0, n)
	}
	k := 0
	if holds(s.lists[0], fs) {
		k = 1
	}
	l := s.lists[k]
	if cap(l) < n || holds(l, fs) {
		l = make([]cachedFrame, 0, n+n/4)
	}
	clear(l[:cap(l)]) // nothing kept alive from the snapshot before last
	s.lists[k] = l[:0]
	return l[:0]
}

// holds reports whether fs lies in l's memory.
func holds(l []cachedFrame, fs cachedFrames) bool {
	if cap(l) == 0 || len(fs) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(l)))
	at := uintptr(unsafe.Pointer(&fs[0]))
	return at >= start && at < start+uintptr(cap(l))*unsafe.Sizeof(l[0])
}

// slots returns n zeroed slots.
func (s *sortScratch) slots(n uint32) []uint64 {
	if s == nil {
		return make([]uint64, n)
	}
	if uint32(cap(s.slot)) < n {
		s.slot = make([]uint64, n)
	}
	s.slot = s.slot[:n]
	clear(s.slot)
	return s.slot
}

// broken returns n cleared flags.
func (s *sortScratch) broken(n int) []bool {
	if s == nil {
		return make([]bool, n)
	}
	if cap(s.brk) < n {
		s.brk = make([]bool, n)
	}
	s.brk = s.brk[:n]
	clear(s.brk)
	return s.brk
}

// look says how a piece stands against the last snapshot.
type look uint8

const (
	unwritten look = iota // not written since the last snapshot: as it was
	initial               // as in the initial image: left out
	hashed                // to compare with the last snapshot by its hash
)

// sort sorts the pieces of a memory of pieces pieces for the next
// snapshot against the last (fs): see reports a piece's standing and,
// when hashed, the hash of its contents. A piece below below whose bit
// in written is clear is unwritten without asking see (written nil: ask
// of every piece). It returns the frames to keep (none of their pieces
// changed or went back to the initial image), the pieces that changed
// (fresh), and the unchanged pieces of the frames not kept (stale), each
// in increasing order. scratch is memory to reuse between calls (of one
// instance's snapshots: a Go guest's memory has thousands of pieces).
func (fs cachedFrames) sort(pieces uint32, written []uint64, below uint32, scratch *sortScratch, see func(p uint32) (look, uint64)) (keep []cachedFrame, fresh, stale []pieceHash) {
	// slot[p]: the frame holding piece p, plus one, and its position in
	// it (frame+1)<<32 | position; 0 for none.
	slot := scratch.slots(pieces)
	broken := scratch.broken(len(fs))
	for f, fr := range fs {
		for k, p := range fr.pieces {
			if p >= pieces {
				broken[f] = true // never, as a memory does not shrink
				continue
			}
			slot[p] = uint64(f+1)<<32 | uint64(k)
		}
	}
	below = min(below, pieces)
	if written == nil {
		below = 0
	}
	for p := uint32(0); p < pieces; p++ {
		if p < below && written[p/64]&(1<<(p%64)) == 0 {
			if written[p/64]>>(p%64) == 0 && p|63 < below {
				// Nothing more written in this word: on to the next.
				p |= 63
			}
			continue
		}
		f, k := int(slot[p]>>32)-1, uint32(slot[p])
		st, h := see(p)
		switch {
		case st == unwritten:
		case st == hashed && f >= 0 && fs[f].hashes[k] == h:
		default:
			if st == hashed {
				fresh = append(fresh, pieceHash{p, h})
			}
			if f >= 0 {
				broken[f] = true
				slot[p] = 0
			}
		}
	}
	// Room for the frames the snapshot adds, too (SnapshotParts).
	keep = scratch.frameList(fs, len(fs)+len(fresh)/framePieces+8)
	for f, fr := range fs {
		if !broken[f] {
			keep = append(keep, fr)
			continue
		}
		for k, p := range fr.pieces {
			if p < pieces && slot[p] == uint64(f+1)<<32|uint64(k) {
				stale = append(stale, pieceHash{p, fr.hashes[k]})
			}
		}
	}
	slices.SortFunc(stale, func(a, b pieceHash) int { return cmp.Compare(a.index, b.index) })
	return keep, fresh, stale
}

// pageSeed seeds the page hashes. A snapshot trusts them: a page whose
// hash is its initial image's is left out, one whose hash is the last
// snapshot's keeps that snapshot's frame. XXH3 (zeebo/xxh3, which go-redis
// already brings in) is not cryptographic, but its seed is random per
// process and no guest sees a hash, so a guest has nothing to aim a
// collision with; a chance one is 1 in 2^64; and any collision costs only
// the instance whose own pages collide (its own snapshot misses a
// change), never another session's state. It hashes 4 KiB pages at
// 45 GB/s where maphash (AES rounds) ran at 9.8 GB/s on the same machine,
// and a Go guest's snapshot hashes every page it ever wrote: 3 MiB, 320
// µs of each checkpoint with maphash, 70 µs with XXH3.
var pageSeed = randomSeed()

func hashPage(page []byte) uint64 { return xxh3.HashSeed(page, pageSeed) }

var zeroPageHash = sync.OnceValue(func() uint64 { return hashPage(zeroPage[:]) })

// hash returns the hash of page p of the initial image (of zeros past
// its end).
func (b *baseImage) hash(p uint32) uint64 {
	if p < uint32(len(b.hashes)) {
		return b.hashes[p]
	}
	return zeroPageHash()
}

func appendBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

// Restore starts a new instance of the module with the state saved in
// snapshot, instead of running its initialisation. It fails with
// [ErrSnapshotMismatch] when the snapshot is of other bytes than c's, with
// [ErrBadSnapshot] when it is not a valid snapshot or holds more than c's
// policy allows (memory, vars), and with [ErrSnapshotRefused] when the
// host cannot snapshot c's instances (a policy that mounts folders, say).
// Snapshots come from the host, but the bytes are checked as untrusted:
// a corrupt one fails, it never holds more than the limits. Once c is
// closed, or when it is closed under the restore, it fails with
// [ErrClosed].
func (c *Compiled) Restore(ctx context.Context, snapshot []byte) (inst *Instance, err error) {
	defer func() { err = c.closedErr(err) }()
	if err := c.CanSnapshot(); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	s, err := c.decodeSnapshot(snapshot)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if img := c.imageFor(); img != nil {
		inst, ok, err := c.restoreOnImage(ctx, img, s)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		if ok {
			return inst, nil
		}
	}
	inst, err = c.instantiate(ctx, false, nil)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := inst.restore(s); err != nil {
		_ = inst.Close(context.Background())
		return nil, fmt.Errorf("restore: %w", err)
	}
	return inst, nil
}

// snapshotState is a decoded snapshot.
type snapshotState struct {
	globals    []uint64
	wall, mono int64
	vars       map[string][]byte
	varBytes   uint64
	pages      uint32
	// unit is the size of what data holds: 64 KiB pages (versions 1
	// and 2), or 4 KiB pieces (versions 3 and 4, in frames).
	unit   uint32
	data   []savedPage
	frames []savedFrame
}

// savedFrame is a frame of a version 3 or 4 snapshot: the pieces it
// holds, in increasing order, and its zstd frame of their bytes.
type savedFrame struct {
	pieces []uint32
	frame  []byte
}

// savedPage is a 64 KiB page of a version 1 or 2 snapshot: its index,
// and its bytes (version 1) or its zstd frame (version 2).
type savedPage struct {
	index uint32
	data  []byte
	frame []byte
}

func (inst *Instance) restore(s *snapshotState) error {
	mem := moduleMemory(inst.mod)
	if mem == nil && s.pages > 0 || mem != nil && s.pages < mem.Size()/pageSize {
		return fmt.Errorf("%w: %d pages of memory, but the module starts with more", ErrBadSnapshot, s.pages)
	}
	if mem != nil {
		if grow := s.pages - mem.Size()/pageSize; grow > 0 {
			if _, ok := mem.Grow(grow); !ok {
				return fmt.Errorf("%w: %d pages of memory, over the memory limit", ErrBadSnapshot, s.pages)
			}
		}
		var cache cachedFrames
		err := inst.withMemory(func(b []byte) error {
			u := s.unit
			for _, p := range s.data {
				unit := b[p.index*u : (p.index+1)*u]
				if p.frame == nil {
					copy(unit, p.data)
					continue
				}
				if err := decodePage(p.frame, unit); err != nil {
					return fmt.Errorf("page %d: %w", p.index, err)
				}
			}
			var err error
			cache, err = s.eachFrame(func(p uint32, piece []byte) []byte {
				dst := b[p*pieceSize : (p+1)*pieceSize]
				copy(dst, piece)
				return dst
			})
			return err
		})
		if err != nil {
			return err
		}
		inst.snapFrames, inst.snapPieces = cache, 0
		if s.unit == pieceSize {
			// The memory is the base's but for the cached pieces.
			inst.snapPieces = s.pages * piecesPerPage
		}
		inst.armWrites()
	}
	return inst.setState(s, s.vars)
}

// armWrites arms the write tracking of the instance's memory (a scan
// whose answer is dropped), once the memory is what snapFrames
// describes: the next snapshot then reads only the pieces written since.
func (i *Instance) armWrites() {
	if i.snapPieces == 0 {
		return
	}
	_ = i.withMemory(func(mem []byte) error {
		i.mem.scanWrites(mem, i.track.want(), true)
		return nil
	})
}

// eachFrame decodes each frame of s (versions 3 and 4) and calls put with
// each of its pieces, which returns where the piece now is in memory. It
// returns the frames, to be the next snapshot's for the pieces the guest
// does not write meanwhile.
func (s *snapshotState) eachFrame(put func(p uint32, piece []byte) []byte) (cachedFrames, error) {
	if len(s.frames) == 0 {
		return nil, nil
	}
	scratch := frameScratch.Get().(*[]byte)
	defer frameScratch.Put(scratch)
	cache := make(cachedFrames, 0, len(s.frames))
	for _, f := range s.frames {
		buf := slices.Grow((*scratch)[:0], len(f.pieces)*pieceSize)[:len(f.pieces)*pieceSize]
		*scratch = buf[:0]
		if err := decodePage(f.frame, buf); err != nil {
			return nil, fmt.Errorf("frame of piece %d: %w", f.pieces[0], err)
		}
		cf := cachedFrame{pieces: slices.Clone(f.pieces), hashes: make([]uint64, len(f.pieces)), frame: slices.Clone(f.frame), sum: FrameSum(f.frame)}
		for k, p := range f.pieces {
			cf.hashes[k] = hashPage(put(p, buf[k*pieceSize:(k+1)*pieceSize]))
		}
		cache = append(cache, cf)
	}
	slices.SortFunc(cache, byFirstPiece)
	return cache, nil
}

// decodePage decodes a frame into page, of the frame's whole size (a
// 64 KiB page, or a version 3, 4 or 5 frame's pieces): a zstd frame, or an
// S2 block and its CRC-32C.
func decodePage(frame, page []byte) error {
	if !bytes.HasPrefix(frame, zstdMagic) {
		return decodeS2(frame, page)
	}
	var h zstd.Header
	if err := h.Decode(frame); err != nil || !h.HasFCS || h.FrameContentSize != uint64(len(page)) {
		return fmt.Errorf("%w: a frame is not of one %d-byte unit", ErrBadSnapshot, len(page))
	}
	got, err := decoder().DecodeAll(frame, page[:0:len(page)])
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if len(got) != len(page) {
		return fmt.Errorf("%w: a frame holds %d bytes", ErrBadSnapshot, len(got))
	}
	if &got[0] != &page[0] {
		copy(page, got)
	}
	return nil
}

// decodeS2 decodes an S2 block and its CRC-32C into page, which it must
// fill exactly.
func decodeS2(frame, page []byte) error {
	if len(frame) < 5 {
		return fmt.Errorf("%w: a frame of %d bytes", ErrBadSnapshot, len(frame))
	}
	block, sum := frame[:len(frame)-4], binary.LittleEndian.Uint32(frame[len(frame)-4:])
	if n, err := s2.DecodedLen(block); err != nil || n != len(page) {
		return fmt.Errorf("%w: a frame is not of one %d-byte unit", ErrBadSnapshot, len(page))
	}
	got, err := s2.Decode(page, block)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if len(got) != len(page) || &got[0] != &page[0] {
		return fmt.Errorf("%w: a frame holds %d bytes", ErrBadSnapshot, len(got))
	}
	if crc32.Checksum(page, castagnoli) != sum {
		return fmt.Errorf("%w: a frame's checksum does not match", ErrBadSnapshot)
	}
	return nil
}

// setState sets the instance's globals, clocks and vars (vars, of
// s.varBytes) to s's.
func (inst *Instance) setState(s *snapshotState, vars map[string][]byte) error {
	for k, name := range inst.compiled.snap.globals {
		g, ok := inst.mod.ExportedGlobal(name).(api.MutableGlobal)
		if !ok {
			return fmt.Errorf("global export %q is missing or not mutable", name)
		}
		g.Set(s.globals[k])
	}
	inst.wall.Store(s.wall)
	inst.mono.Store(s.mono)
	inst.kernel.vars, inst.kernel.varBytes = vars, s.varBytes
	return nil
}

// decodeSnapshot parses snapshot for c, within c's limits. The pages of a
// version 2 snapshot stay compressed: restore decodes each into place.
func (c *Compiled) decodeSnapshot(snapshot []byte) (*snapshotState, error) {
	if len(snapshot) < snapshotHeader || string(snapshot[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: no snapshot header", ErrBadSnapshot)
	}
	v := snapshot[len(snapshotMagic)]
	if v < snapshotVersion1 || v > snapshotVersion {
		return nil, fmt.Errorf("%w: format version %d, not %d", ErrSnapshotMismatch, v, snapshotVersion)
	}
	if sum := snapshot[len(snapshotMagic)+1 : snapshotHeader]; !bytes.Equal(sum, c.sha256[:]) {
		return nil, fmt.Errorf("%w: taken of module %x, not %x", ErrSnapshotMismatch, sum, c.sha256)
	}
	maxPages := c.policy.memoryLimitPages()
	switch v {
	case snapshotVersion1:
		return parseSnapshotV1(snapshot[snapshotHeader:], len(c.snap.globals), maxPages)
	case snapshotVersion2:
		return parseSnapshot(snapshot[snapshotHeader:], v, pageSize, len(c.snap.globals), maxPages)
	}
	return parseSnapshot(snapshot[snapshotHeader:], v, pieceSize, len(c.snap.globals), maxPages)
}

// maxHead is the most the globals, clocks and vars of a valid snapshot
// take.
func maxHead(globals int) uint64 {
	return 10 + 8*uint64(globals) + 16 + 10 + maxVarBytes + 10*maxVars
}

// parseSnapshotV1 reads a version 1 snapshot after its header: one zstd
// frame of the whole body, the pages raw.
func parseSnapshotV1(frame []byte, globals int, maxPages uint32) (*snapshotState, error) {
	// The most a valid body holds: every page once with its index.
	maxBody := uint64(maxPages)*(pageSize+5) + maxHead(globals) + 20
	body, err := decodeFrame(frame, maxBody)
	if err != nil {
		return nil, err
	}
	return parseSnapshotBody(body, snapshotVersion1, 0, nil, globals, maxPages)
}

// parseSnapshot reads a version 2 (unit: pageSize), 3 or 4 (pieceSize)
// snapshot after its header: the length and bytes of the frame of the
// rest, then the frames, which it splits but does not decode.
func parseSnapshot(b []byte, version byte, unit uint32, globals int, maxPages uint32) (*snapshotState, error) {
	r := snapReader{b: b}
	frame := r.bytes()
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, r.err)
	}
	// Each unit once with its index (or gap) and a frame length, and a
	// count per frame.
	maxMeta := uint64(maxPages)*(pageSize/uint64(unit))*(5+3+3) + maxHead(globals) + 20
	decode := decodeFrame
	if version >= snapshotVersion {
		decode = decodeS2Bounded
	}
	meta, err := decode(frame, maxMeta)
	if err != nil {
		return nil, err
	}
	return parseSnapshotBody(meta, version, unit, r.b, globals, maxPages)
}

// decodeFrame decodes one zstd frame whose declared size is at most max.
func decodeFrame(frame []byte, max uint64) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(frame); err != nil || !h.HasFCS || h.FrameContentSize > max {
		return nil, fmt.Errorf("%w: compressed body missing, unsized or over %d bytes", ErrBadSnapshot, max)
	}
	body, err := decoder().DecodeAll(frame, make([]byte, 0, h.FrameContentSize))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	return body, nil
}

// parseSnapshotBody reads a decompressed snapshot body of a module with
// globals mutable globals and at most maxPages pages of memory: of
// version 1 (unit 0), its pages raw, or of version 2, 3 or 4 (unit: the
// size of what a frame holds one or more of), where frames holds the
// frames, as many bytes as the body says.
func parseSnapshotBody(body []byte, version byte, unit uint32, frames []byte, globals int, maxPages uint32) (*snapshotState, error) {
	r := snapReader{b: body}
	s := &snapshotState{unit: cmp.Or(unit, pageSize)}
	perPage := uint64(pageSize / s.unit)
	if n := r.uvarint(); n != uint64(globals) {
		return nil, fmt.Errorf("%w: %d globals, but the module has %d", ErrBadSnapshot, n, globals)
	}
	for range globals {
		s.globals = append(s.globals, r.u64())
	}
	s.wall, s.mono = int64(r.u64()), int64(r.u64())
	nvars := r.uvarint()
	if nvars > maxVars {
		return nil, fmt.Errorf("%w: %d vars, over the limit of %d", ErrBadSnapshot, nvars, maxVars)
	}
	if nvars > 0 {
		s.vars = make(map[string][]byte, nvars)
	}
	for range nvars {
		k, v := r.bytes(), r.bytes()
		if r.err != nil {
			break
		}
		if len(k) == 0 || len(v) == 0 {
			return nil, fmt.Errorf("%w: an empty var key or value", ErrBadSnapshot)
		}
		if _, dup := s.vars[string(k)]; dup {
			return nil, fmt.Errorf("%w: var %q twice", ErrBadSnapshot, k)
		}
		s.vars[string(k)] = slices.Clone(v)
		if s.varBytes += varCost(len(k), len(v)); s.varBytes > maxVarBytes {
			return nil, fmt.Errorf("%w: vars over the %d-byte limit", ErrBadSnapshot, maxVarBytes)
		}
	}
	pages := r.uvarint()
	if pages > uint64(maxPages) {
		return nil, fmt.Errorf("%w: %d pages of memory, over the limit of %d", ErrBadSnapshot, pages, maxPages)
	}
	s.pages = uint32(pages)
	units := pages * perPage
	n := r.uvarint()
	if n > units {
		return nil, fmt.Errorf("%w: %d saved units of %d", ErrBadSnapshot, n, units)
	}
	fr := snapReader{b: frames}
	switch version {
	case snapshotVersion1, snapshotVersion2:
		next := uint64(0)
		for range n {
			p := r.uvarint()
			var page savedPage
			if unit == 0 {
				page.data = r.take(pageSize)
			} else if size := r.uvarint(); r.err == nil && (size == 0 || size > uint64(unit)+maxFrameOver) {
				r.err = fmt.Errorf("a frame of %d bytes", size)
			} else {
				page.frame = fr.take(size)
			}
			if r.err != nil || fr.err != nil {
				break
			}
			if p < next || p >= units {
				return nil, fmt.Errorf("%w: unit %d out of order or past the memory's %d", ErrBadSnapshot, p, units)
			}
			next = p + 1
			page.index = uint32(p)
			s.data = append(s.data, page)
		}
	default:
		if err := s.parseFrames(&r, &fr, version, n, units); err != nil {
			return nil, err
		}
	}
	if r.err == nil && len(r.b) > 0 {
		r.err = fmt.Errorf("%d bytes left over", len(r.b))
	}
	if r.err == nil && fr.err == nil && len(fr.b) > 0 {
		r.err = fmt.Errorf("%d bytes of frames left over", len(fr.b))
	}
	if r.err == nil {
		r.err = fr.err
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadSnapshot, r.err)
	}
	return s, nil
}

// parseFrames reads the n frames of a version 3 (a piece each) or 4
// snapshot of a memory of units pieces: a piece may be saved once only,
// and a frame holds at most framePieces.
func (s *snapshotState) parseFrames(r, fr *snapReader, version byte, n, units uint64) error {
	seen := make([]uint64, (units+63)/64)
	next := uint64(0) // version 3: the pieces in increasing order
	for range n {
		count := uint64(1)
		if version != snapshotVersion3 {
			count = r.uvarint()
		}
		if r.err == nil && (count == 0 || count > framePieces) {
			return fmt.Errorf("%w: a frame of %d pieces", ErrBadSnapshot, count)
		}
		f := savedFrame{pieces: make([]uint32, 0, min(count, framePieces))}
		p := uint64(0)
		for k := range count {
			d := r.uvarint()
			switch {
			case r.err != nil:
			case k == 0:
				p = d
			case d == 0 || d >= units:
				return fmt.Errorf("%w: a gap of %d pieces in a frame", ErrBadSnapshot, d)
			default:
				p += d
			}
			if r.err != nil {
				break
			}
			if p >= units || seen[p/64]&(1<<(p%64)) != 0 || version == snapshotVersion3 && p < next {
				return fmt.Errorf("%w: piece %d twice, out of order or past the memory's %d", ErrBadSnapshot, p, units)
			}
			seen[p/64] |= 1 << (p % 64)
			next = p + 1
			f.pieces = append(f.pieces, uint32(p))
		}
		if size := r.uvarint(); r.err == nil && (size == 0 || size > count*pieceSize+maxFrameOver) {
			r.err = fmt.Errorf("a frame of %d bytes", size)
		} else {
			f.frame = fr.take(size)
		}
		if r.err != nil || fr.err != nil {
			return nil
		}
		s.frames = append(s.frames, f)
	}
	return nil
}

// snapReader reads a snapshot body; its error is sticky.
type snapReader struct {
	b   []byte
	err error
}

func (r *snapReader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errors.New("truncated")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *snapReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("truncated or overlong integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *snapReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *snapReader) bytes() []byte { return r.take(r.uvarint()) }

// The zstd encoder and decoder are shared: EncodeAll and DecodeAll are
// safe for concurrent use. The fastest level: snapshots are mostly Go heap
// and zero runs, where it compresses nearly as well as the default at a
// fraction of the time. Every frame is a single segment, which declares
// its size (else small ones do not). DecodeAll is held to the capacity it
// is given (the frame's declared size, checked first), so a lying frame
// fails rather than allocating.
var (
	zstdOnce sync.Once
	zstdEnc  *zstd.Encoder
	zstdDec  *zstd.Decoder
)

func initZstd() {
	var err error
	zstdEnc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithSingleSegment(true))
	if err != nil {
		panic(err) // only for invalid options
	}
	zstdDec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecodeAllCapLimit(true))
	if err != nil {
		panic(err)
	}
}

func encoder() *zstd.Encoder { zstdOnce.Do(initZstd); return zstdEnc }
func decoder() *zstd.Decoder { zstdOnce.Do(initZstd); return zstdDec }
