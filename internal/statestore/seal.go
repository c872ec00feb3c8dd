package statestore

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// SealOverhead is what sealing adds to a value: a version byte, the
// 12-byte nonce and the 16-byte GCM tag. A value is refused with
// [ErrTooLarge] when its sealed form would exceed [MaxValue].
const SealOverhead = 1 + 12 + 16

// Seal formats, the first byte of a sealed value.
const (
	// sealV1: additional data (ID, field). Opened, never written: values
	// of a store written before versioned seals.
	sealV1 = 1
	// sealV2: additional data (ID, field, the record's write version).
	sealV2 = 2
)

// ErrSeal matches a [*SealError].
var ErrSeal = errors.New("statestore: sealed value does not open")

// errVersion is a versioned write refused because the record's write
// version is not the one the write replaces.
var errVersion = errors.New("statestore: the record's version is not the one the write replaces")

// resentWrite reports whether a versioned write that replaces version
// prev with head is the write that made version and head (the record's
// now, or when its holder last changed): the same write, sent again after
// it landed (a lost reply). Heads are sealed with nonces of their own, so
// no two writes have the same one.
func resentWrite(version uint64, recHead []byte, prev uint64, head []byte) bool {
	return len(head) > 0 && version == prev+1 && bytes.Equal(recHead, head)
}

// SealError is a stored value that does not open: it was changed, moved
// to another session or field, replayed from an older write, or sealed
// with another state key. A caller treats the session's state as lost.
type SealError struct {
	ID, Field string
	// Reason says what failed, when more is known than that the value
	// does not open.
	Reason string
}

func (e *SealError) Error() string {
	why := e.Reason
	if why == "" {
		why = "sealed value does not open (changed, moved, replayed, or sealed with another state key)"
	}
	return fmt.Sprintf("statestore: session %s field %s: %s", IDLabel(e.ID), e.Field, why)
}
func (e *SealError) Is(target error) bool { return target == ErrSeal }

// versioned is what [Seal] needs of a backend beyond [Store]: each record
// has a write version (0 for none), and a sealed head beside its fields,
// both kept apart from the fields ([Store.Get] does not return them).
// Every backend of this package implements it.
type versioned interface {
	// readHead returns id's record version, head and field names in one
	// atomic read; a record that is not there has version 0, no head
	// and no fields.
	readHead(ctx context.Context, id string) (version uint64, head []byte, fields []string, err error)
	// getVersioned is Get, with the record's version and head read in
	// the same atomic step.
	getVersioned(ctx context.Context, id string) (fields map[string][]byte, version uint64, head []byte, err error)
	// putVersioned is Put, which also sets the record's head, if the
	// record's version is prev: the version becomes prev+1, in the same
	// atomic step as the fence's check. It fails with errVersion if the
	// version is not prev (after the fence's check, so a stale fence is
	// ErrFenced). The same write sent again after it was applied (the
	// version is prev+1 and the head is this one, which a random nonce
	// makes unique) succeeds without writing: a client that resends a
	// request whose reply was lost must not read its own write as a
	// rollback.
	putVersioned(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration) error
}

// Seal returns s with every value sealed: AES-256-GCM under a key derived
// from stateKey (HKDF-SHA256, info "wasmtools statestore v1"), a random
// nonce per value, and as additional data the record's ID, the field and
// the record's write version at the write, so a value opens only where
// and as of when it was written. Get fails with a *SealError for a value
// that does not open. Names, fences and owners are not sealed. Closing
// the result closes s. stateKey must not be empty (Seal panics: [Open]
// checks it first), and s must be one of this package's backends (Seal
// panics otherwise).
//
// Versions. Every write of a field is a conditional write: it names the
// record's write version it replaces and makes the next one, in the same
// atomic step that checks the writer's fence (Redis: one Lua script; the
// file: one bbolt transaction). With the field it writes the record's
// head, sealed too: the record's version and the version each field was
// written at. Get opens the head, checks that its version is the
// record's, that it names exactly the record's fields, and opens each
// field under the version the head gives it. This process's writes of
// one record take turns; its first write of a record under a fence reads
// the record's head first (one more exchange with the store), the next
// ones start from the head it wrote. Protected, against someone
// who can write to the store but has not the state key:
//
//   - A value replayed into its field (an older value of the same field,
//     from a backup or an earlier read), with or without the record's
//     plain version rolled back with it: Get fails with a *SealError.
//   - A value and the head both replayed, while any other field was
//     written since that head (the head names its version): Get fails.
//   - A whole record rolled back in step (every field, the head and the
//     version, as of one earlier write) under a fence the holder still
//     holds: the holder's next write names the version it wrote last
//     (kept in this process, per session, with the fence it wrote under)
//     and is refused with a *SealError; the holder does not write over it
//     until the session is claimed again.
//   - A write reported failed never lands after a later write of the same
//     record: that write replaced the version the failed one named.
//
// Not protected: a whole record rolled back in step as above, read by a
// replica that is not its holder (a takeover, or the holder after a
// restart or after another claim: it keeps no version to compare), or
// with the fence rolled back too (the holder's next write is then fenced
// and it reads the record again); a record deleted (a session then ends,
// as an expired one does); the whole store rolled back with its epoch.
// Those need a version kept outside the store. Records written before
// versioned seals (format 1, no head) still open, as a whole: a field of
// one is listed in the next head with version 0 and opens without a
// version until it is written again, so an older format-1 value of such
// a field can be replayed until then, and a record whose head is removed
// can be replaced whole by one of its format-1 backups.
func Seal(s Store, stateKey []byte) Store {
	if len(stateKey) == 0 {
		panic("statestore: Seal with an empty state key")
	}
	vs, ok := s.(versioned)
	if !ok {
		panic(fmt.Sprintf("statestore: Seal of a %T, not a store of this package", s))
	}
	key, err := hkdf.Key(sha256.New, stateKey, nil, "wasmtools statestore v1", 32)
	if err != nil {
		panic(err) // only for a key length HKDF cannot give
	}
	block, _ := aes.NewCipher(key) // 32 bytes: AES-256
	aead, _ := cipher.NewGCM(block)
	return &sealed{Store: s, vs: vs, aead: aead, last: map[string]written{}, writing: map[string]*writeTurn{}}
}

type sealed struct {
	Store
	vs   versioned
	aead cipher.AEAD

	mu      sync.Mutex
	last    map[string]written    // by record ID: this process's last write
	writing map[string]*writeTurn // by record ID: its writes in this process take turns
}

// writeTurn serialises one record's writes in this process, so that its
// last write is known when the next one starts.
type writeTurn struct {
	token   chan struct{} // holds one token while a write runs
	waiters int           // guarded by sealed.mu
}

// writeTurns holds writeTurns no record uses: every write of a record no
// other write of it waits for made one, and two closures to end it.
var writeTurns = sync.Pool{New: func() any { return &writeTurn{token: make(chan struct{}, 1)} }}

// turn waits for id's turn to write (or for ctx's end); the caller ends
// the turn with endTurn.
func (s *sealed) turn(ctx context.Context, id string) (*writeTurn, error) {
	s.mu.Lock()
	t := s.writing[id]
	if t == nil {
		t = writeTurns.Get().(*writeTurn)
		s.writing[id] = t
	}
	t.waiters++
	s.mu.Unlock()
	select {
	case t.token <- struct{}{}:
		return t, nil
	case <-ctx.Done():
		s.leave(id, t)
		return nil, ctx.Err()
	}
}

// endTurn ends the turn t of id that turn gave.
func (s *sealed) endTurn(id string, t *writeTurn) {
	<-t.token
	s.leave(id, t)
}

// leave counts a waiter of t out; the last gives t back, its token
// empty: each waiter took back the token it put, or put none.
func (s *sealed) leave(id string, t *writeTurn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.waiters--; t.waiters == 0 {
		delete(s.writing, id)
		writeTurns.Put(t)
	}
}

// written is this process's last write of a record: the fence it wrote
// under and the head it wrote.
type written struct {
	fence uint64
	head  head
}

// maxLast bounds sealed.last; past it an entry is forgotten (its record's
// next write reads the head first, and cannot detect a rollback before).
const maxLast = 1 << 16

// head is a record's version and the version each field was written at
// (0: a format-1 value, sealed without one).
type head struct {
	Version uint64            `json:"v"`
	Fields  map[string]uint64 `json:"f"`
}

// headField is the head's name in its additional data: not a field name
// (those are printable).
const headField = "\x01head"

func sealAD(id, field string) []byte { return []byte(id + "\x00" + field) }

func sealAD2(id, field string, version uint64) []byte {
	return appendAD2(nil, id, field, version)
}

// appendAD2 appends sealAD2's bytes to dst.
func appendAD2(dst []byte, id, field string, version uint64) []byte {
	dst = append(append(append(append(dst, id...), 0), field...), 0)
	return binary.BigEndian.AppendUint64(dst, version)
}

// appendHead appends h as JSON, as json.Marshal writes it but for the
// order of the fields, which no reader depends on; ok is false, and
// nothing appended, when a field's name would need escaping (none of
// this package's callers' does).
func appendHead(dst []byte, h head) (_ []byte, ok bool) {
	out := append(dst, `{"v":`...)
	out = strconv.AppendUint(out, h.Version, 10)
	out = append(out, `,"f":{`...)
	first := true
	for f, v := range h.Fields {
		for k := range len(f) {
			if c := f[k]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return dst, false
			}
		}
		if !first {
			out = append(out, ',')
		}
		first = false
		out = append(append(append(out, '"'), f...), `":`...)
		out = strconv.AppendUint(out, v, 10)
	}
	return append(out, "}}"...), true
}

// putScratch is a write's memory for its additional data and its head
// before sealing, which sealing has read when it returns: kept in
// putScratches for the next writes.
type putScratch struct{ ad, head []byte }

var putScratches = sync.Pool{New: func() any { return new(putScratch) }}

func (s *sealed) seal(value, ad []byte) []byte { return s.sealInto(nil, value, ad) }

// sealInto seals value as seal does, in dst's memory when it has room.
func (s *sealed) sealInto(dst, value, ad []byte) []byte {
	out := dst[:0]
	if n := 1 + 12 + len(value) + 16; cap(out) < n {
		out = make([]byte, 0, n+n/8)
	}
	out = out[:1+12]
	out[0] = sealV2
	rand.Read(out[1:13])
	return s.aead.Seal(out, out[1:13], value, ad)
}

// sealBufs holds the memory of sealed values whose writes were answered,
// for the next writes to seal theirs in: a Go guest's checkpoint seals
// tens of KiB, which was a quarter of its garbage.
var sealBufs sync.Pool

func takeSealBuf() []byte {
	if b, ok := sealBufs.Get().(*[]byte); ok {
		return *b
	}
	return nil
}

func giveSealBuf(b []byte) {
	if cap(b) > maxPooled {
		return // a whole state of megabytes is not to circulate
	}
	b = b[:0]
	sealBufs.Put(&b)
}

// maxPooled is the largest memory sealBufs keeps.
const maxPooled = 1 << 20

// open opens v, sealed in format 2 with ad, or, when v1 is set, in
// format 1 with (id, field).
func (s *sealed) open(v []byte, id, field string, ad []byte, v1 bool) ([]byte, bool) {
	if len(v) < SealOverhead {
		return nil, false
	}
	switch {
	case v[0] == sealV2 && !v1:
	case v[0] == sealV1 && v1:
		ad = sealAD(id, field)
	default:
		return nil, false
	}
	plain, err := s.aead.Open(nil, v[1:13], v[13:], ad)
	return plain, err == nil
}

// openHead checks a record's head against its version and field names.
// A record with neither head nor version is of format 1 (or empty): its
// fields are given version 0.
func (s *sealed) openHead(id string, version uint64, sealedHead []byte, fields []string) (head, error) {
	if sealedHead == nil {
		if version != 0 {
			return head{}, &SealError{ID: id, Field: headField[1:], Reason: "the record's head is gone"}
		}
		h := head{Fields: map[string]uint64{}}
		for _, f := range fields {
			h.Fields[f] = 0
		}
		return h, nil
	}
	plain, ok := s.open(sealedHead, id, headField, sealAD2(id, headField, 0), false)
	var h head
	if !ok || json.Unmarshal(plain, &h) != nil || h.Fields == nil {
		return head{}, &SealError{ID: id, Field: headField[1:], Reason: "the record's head does not open"}
	}
	if h.Version != version {
		return head{}, &SealError{ID: id, Field: headField[1:],
			Reason: fmt.Sprintf("the record's head is of version %d, the record of version %d (replayed)", h.Version, version)}
	}
	if len(h.Fields) != len(fields) {
		return head{}, &SealError{ID: id, Field: headField[1:], Reason: "the record's fields are not the ones its head names"}
	}
	for _, f := range fields {
		if v, ok := h.Fields[f]; !ok || v > h.Version {
			return head{}, &SealError{ID: id, Field: f, Reason: "the field is not in the record's head (replayed or added)"}
		}
	}
	return h, nil
}

func (s *sealed) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	if len(value) > MaxValue-SealOverhead {
		return ErrTooLarge
	}
	t, err := s.turn(ctx, id)
	if err != nil {
		return err
	}
	defer s.endTurn(id, t)
	ps := putScratches.Get().(*putScratch)
	defer putScratches.Put(ps)
	h, known := s.lastHead(id, fence)
	for range 2 {
		if !known {
			version, sealedHead, fields, err := s.vs.readHead(ctx, id)
			if err != nil {
				s.forget(id)
				return err
			}
			if h, err = s.openHead(id, version, sealedHead, fields); err != nil {
				s.forget(id)
				return err
			}
		}
		next := head{Version: h.Version + 1, Fields: make(map[string]uint64, len(h.Fields)+1)}
		for f, v := range h.Fields {
			next.Fields[f] = v
		}
		next.Fields[field] = next.Version
		hb, ok := appendHead(ps.head[:0], next)
		if !ok {
			hb, _ = json.Marshal(next)
		}
		ps.head = hb[:0]
		ps.ad = appendAD2(ps.ad[:0], id, field, next.Version)
		sv := s.sealInto(takeSealBuf(), value, ps.ad)
		ps.ad = appendAD2(ps.ad[:0], id, headField, 0)
		sh := s.seal(hb, ps.ad)
		err := s.vs.putVersioned(ctx, id, field, sv, sh, fence, h.Version, ttl)
		if err == nil || errors.Is(err, errVersion) {
			// Answered: the store is done with sv (one that got no
			// answer may still be sending it: a Redis call whose
			// caller gave up runs on).
			giveSealBuf(sv)
		}
		switch {
		case err == nil:
			s.remember(id, written{fence: fence, head: next})
			return nil
		case !errors.Is(err, errVersion):
			s.forget(id)
			return err
		}
		if known {
			// This process wrote the record last under this fence, and
			// no one else writes under it: the record was rolled back.
			// Kept in last: the holder does not write over it.
			return &SealError{ID: id, Field: field, Reason: fmt.Sprintf(
				"the record is not at the version this replica wrote last (%d): rolled back", h.Version)}
		}
		// Written between the read and the write, under this fence: a
		// write of this process that was reported failed, landing late.
		// Read again.
		known = false
	}
	s.forget(id)
	return fmt.Errorf("statestore: session %s: the record changed while being written", IDLabel(id))
}

// lastHead returns the head this process wrote last for id under fence.
func (s *sealed) lastHead(id string, fence uint64) (head, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ok := s.last[id]
	return w.head, ok && w.fence == fence
}

// remember records w as this process's last write of id.
func (s *sealed) remember(id string, w written) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.last[id]; !ok && len(s.last) >= maxLast {
		for k := range s.last {
			delete(s.last, k)
			break
		}
	}
	s.last[id] = w
}

func (s *sealed) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.last, id)
}

func (s *sealed) Get(ctx context.Context, id string) (map[string][]byte, error) {
	fields, version, sealedHead, err := s.vs.getVersioned(ctx, id)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(fields))
	for f := range fields {
		names = append(names, f)
	}
	h, err := s.openHead(id, version, sealedHead, names)
	if err != nil {
		return nil, err
	}
	for field, v := range fields {
		fv := h.Fields[field]
		plain, ok := s.open(v, id, field, sealAD2(id, field, fv), fv == 0)
		if !ok {
			return nil, &SealError{ID: id, Field: field}
		}
		fields[field] = plain
	}
	return fields, nil
}

func (s *sealed) Release(ctx context.Context, id string, fence uint64) error {
	s.forget(id)
	return s.Store.Release(ctx, id, fence)
}

func (s *sealed) Delete(ctx context.Context, id string, fence uint64) error {
	s.forget(id)
	return s.Store.Delete(ctx, id, fence)
}
