package statestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// File is a Store in one file (bbolt), for replicas that restart on one
// machine: records and fences survive a restart; heartbeats are kept in
// memory, so every owner of a previous process is dead to a new one (its
// claims are taken over at once, as a new boot's would be).
//
// One process opens the file at a time (an flock; a second open fails
// after 1 s). Every write is fsynced before it returns; writes take turns.
// A call returns when its ctx ends, even while it waits for its turn. Expired records
// are dropped when next read, and by a sweep every [SweepEvery] (a
// goroutine that Close stops). Fences outlive their record by at least
// [FenceTTL], as in [Redis].
type File struct {
	now  func() time.Time
	path string

	mu     sync.RWMutex // held for reading by calls, for writing by Close
	closed bool
	db     *bolt.DB
	stop   chan struct{}
	swept  chan struct{}

	amu   sync.Mutex
	alive map[Owner]time.Time // heartbeat expiry
}

// steadyClock is the wall clock at the call, advanced by the monotonic
// clock since: expiry times written to the file are wall-clock times (a
// restarted process reads them), but while a process runs, a step of the
// system clock (NTP, an operator) neither expires every record at once
// nor keeps them past their TTL.
func steadyClock() func() time.Time {
	start := time.Now()
	wall := start.Round(0) // the wall reading alone
	return func() time.Time { return wall.Add(time.Since(start)) }
}

// SweepEvery is how often [File] drops expired records.
const SweepEvery = time.Minute

var (
	bucketRecords = []byte("records") // id → sub-bucket: metaKey → fileMeta, field → value
	bucketFences  = []byte("fences")  // id → fence (8 bytes), expiry (8 bytes, Unix ns)
	bucketStore   = []byte("store")   // "epoch" → the store's epoch (4 bytes)
	metaKey       = []byte{0}         // not a field name: those are printable
	headKey       = []byte{1}         // the sealed head ([versioned]), nor is this
)

type fileMeta struct {
	Owner   Owner  `json:"owner"`
	Held    bool   `json:"held"`
	Expires int64  `json:"expires"`           // Unix ns
	Version uint64 `json:"version,omitempty"` // the write version ([versioned])
	Bumped  uint64 `json:"bumped,omitempty"`  // the fence the holder's last bump replaced; 0 after a claim
	Taken   uint64 `json:"taken,omitempty"`   // the fence of the claim that made the holder (Claim.Taken)
	// The version and head when the holder last changed (resentWrite).
	ClaimedVersion uint64 `json:"cv,omitempty"`
	ClaimedHead    []byte `json:"ch,omitempty"`
}

// NewFile opens (or creates, mode 0600) the store at path. The caller
// closes it.
func NewFile(path string) (*File, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolt.ErrTimeout) {
		return nil, fmt.Errorf("statestore: state file %s is in use by another wasmtools", path)
	}
	if err != nil {
		return nil, fmt.Errorf("statestore: state file %s: %v", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRecords, bucketFences, bucketStore} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if tx.Bucket(bucketStore).Get([]byte("epoch")) == nil {
			return tx.Bucket(bucketStore).Put([]byte("epoch"), binary.BigEndian.AppendUint32(nil, newEpoch()))
		}
		return nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("statestore: state file %s: %v", path, err), db.Close())
	}
	f := &File{now: steadyClock(), path: path, db: db, stop: make(chan struct{}), swept: make(chan struct{}),
		alive: map[Owner]time.Time{}}
	go f.sweeper()
	return f, nil
}

func (f *File) sweeper() {
	defer close(f.swept)
	t := time.NewTicker(SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			f.sweep()
		}
	}
}

// sweep drops expired records and fences.
func (f *File) sweep() {
	now := f.now().UnixNano()
	f.db.Update(func(tx *bolt.Tx) error {
		var dead [][]byte
		recs := tx.Bucket(bucketRecords)
		recs.ForEachBucket(func(id []byte) error {
			if m, ok := readMeta(recs.Bucket(id)); !ok || now >= m.Expires {
				dead = append(dead, id)
			}
			return nil
		})
		for _, id := range dead {
			recs.DeleteBucket(id)
		}
		dead = dead[:0]
		fences := tx.Bucket(bucketFences)
		fences.ForEach(func(id, v []byte) error {
			if _, exp := decodeFence(v); now >= exp {
				dead = append(dead, id)
			}
			return nil
		})
		for _, id := range dead {
			fences.Delete(id)
		}
		return nil
	})
}

// do runs fn in a transaction, after checking ctx and the store's state.
// It returns when ctx ends, leaving the transaction (waiting for the one
// writer, or syncing) to end in the background: fn must not write what
// its caller reads after an error.
func (f *File) do(ctx context.Context, write bool, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() {
		f.mu.RLock()
		defer f.mu.RUnlock()
		switch {
		case f.closed:
			done <- ErrClosed
		case write:
			done <- f.db.Update(fn)
		default:
			done <- f.db.View(fn)
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func readMeta(b *bolt.Bucket) (fileMeta, bool) {
	var m fileMeta
	if b == nil {
		return m, false
	}
	v := b.Get(metaKey)
	return m, v != nil && json.Unmarshal(v, &m) == nil
}

func putMeta(b *bolt.Bucket, m fileMeta) error {
	v, _ := json.Marshal(m)
	return b.Put(metaKey, v)
}

func decodeFence(v []byte) (fence uint64, expires int64) {
	if len(v) != 16 {
		return 0, 0
	}
	return binary.BigEndian.Uint64(v), int64(binary.BigEndian.Uint64(v[8:]))
}

// epoch is the file's epoch, made when the file was.
func (f *File) epoch(tx *bolt.Tx) uint32 {
	v := tx.Bucket(bucketStore).Get([]byte("epoch"))
	if len(v) != 4 {
		return 0
	}
	return binary.BigEndian.Uint32(v)
}

// Epoch returns the file's epoch. It records no loss: the one process
// that holds the file cannot see it come back empty.
func (f *File) Epoch(ctx context.Context, seen uint32, window time.Duration) (epoch uint32, lost Loss, err error) {
	err = f.do(ctx, false, func(tx *bolt.Tx) error {
		epoch = f.epoch(tx)
		return nil
	})
	return epoch, Loss{}, err
}

// check returns id's record if fence may write it.
func (f *File) check(tx *bolt.Tx, id string, fence uint64) (*bolt.Bucket, fileMeta, error) {
	if Epoch(fence) != f.epoch(tx) {
		return nil, fileMeta{}, ErrStoreLost
	}
	b, m := f.record(tx, id)
	switch {
	case b == nil:
		return nil, m, ErrRecordLost
	case !m.Held || f.fence(tx, id) != fence:
		return nil, m, ErrFenced
	}
	return b, m, nil
}

func (f *File) fence(tx *bolt.Tx, id string) uint64 {
	n, _ := decodeFence(tx.Bucket(bucketFences).Get([]byte(id)))
	return n
}

// setFence stores id's fence, to expire FenceTTL (or ttl) from now.
func (f *File) setFence(tx *bolt.Tx, id string, fence uint64, ttl time.Duration) error {
	v := make([]byte, 16)
	binary.BigEndian.PutUint64(v, fence)
	binary.BigEndian.PutUint64(v[8:], uint64(f.now().Add(max(ttl, FenceTTL)).UnixNano()))
	return tx.Bucket(bucketFences).Put([]byte(id), v)
}

// record returns id's live record bucket and meta; an expired record is
// dropped (in a write transaction) or ignored.
func (f *File) record(tx *bolt.Tx, id string) (*bolt.Bucket, fileMeta) {
	recs := tx.Bucket(bucketRecords)
	b := recs.Bucket([]byte(id))
	m, ok := readMeta(b)
	if b != nil && (!ok || f.now().UnixNano() >= m.Expires) {
		if tx.Writable() {
			recs.DeleteBucket([]byte(id))
		}
		return nil, fileMeta{}
	}
	return b, m
}

func (f *File) isAlive(o Owner) bool {
	f.amu.Lock()
	defer f.amu.Unlock()
	t, ok := f.alive[o]
	return ok && f.now().Before(t)
}

func (f *File) Heartbeat(ctx context.Context, owner Owner, ttl time.Duration) error {
	return f.do(ctx, false, func(*bolt.Tx) error {
		f.amu.Lock()
		defer f.amu.Unlock()
		f.alive[owner] = f.now().Add(ttl)
		return nil
	})
}

func (f *File) Leave(ctx context.Context, owner Owner) error {
	return f.do(ctx, false, func(*bolt.Tx) error {
		f.amu.Lock()
		defer f.amu.Unlock()
		delete(f.alive, owner)
		return nil
	})
}

func (f *File) Claim(ctx context.Context, id string, owner Owner, ttl time.Duration, steal bool) (Claim, error) {
	var (
		c    Claim
		held *HeldError
	)
	err := f.do(ctx, true, func(tx *bolt.Tx) error {
		c, held = Claim{}, nil
		b, m := f.record(tx, id)
		if b == nil {
			var err error
			if b, err = tx.Bucket(bucketRecords).CreateBucket([]byte(id)); err != nil {
				return err
			}
		}
		m.Expires = f.now().Add(ttl).UnixNano() // as Memory: even a refused claim renews
		fence := f.fence(tx, id)
		switch {
		case m.Held && m.Owner == owner && Epoch(fence) == f.epoch(tx):
			c.Fence, c.Taken, c.Held, m.Bumped = fence, m.Taken, true, 0
			return errors.Join(putMeta(b, m), f.setFence(tx, id, fence, ttl))
		case m.Held:
			alive := f.isAlive(m.Owner)
			if alive && !steal {
				held = &HeldError{Holder: m.Owner}
				return putMeta(b, m)
			}
			c.Previous, c.PreviousAlive = m.Owner, alive
		}
		m.Owner, m.Held, m.Bumped = owner, true, 0
		m.ClaimedVersion, m.ClaimedHead = m.Version, bytes.Clone(b.Get(headKey))
		n := uint32(fence) + 1
		if fence == 0 {
			n = firstFence()
		}
		c.Fence = uint64(f.epoch(tx))<<32 | uint64(n)
		c.Taken, m.Taken = c.Fence, c.Fence
		return errors.Join(putMeta(b, m), f.setFence(tx, id, c.Fence, ttl))
	})
	switch {
	case err != nil:
		return Claim{}, fileErr(err)
	case held != nil:
		return Claim{}, held
	}
	return c, nil
}

func (f *File) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	return f.write(ctx, id, field, value, nil, fence, 0, ttl, false)
}

func (f *File) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	next := fence
	err := f.do(ctx, true, func(tx *bolt.Tx) error {
		next = fence
		if b, m := f.record(tx, id); bump && b != nil && m.Held && m.Bumped == fence && fence != 0 {
			// The same bump, sent again.
			next = f.fence(tx, id)
			m.Expires = f.now().Add(ttl).UnixNano()
			return errors.Join(putMeta(b, m), f.setFence(tx, id, next, ttl))
		}
		b, m, err := f.check(tx, id, fence)
		if err != nil {
			return err
		}
		if bump {
			m.Bumped = fence
			next++
		}
		m.Expires = f.now().Add(ttl).UnixNano()
		return errors.Join(putMeta(b, m), f.setFence(tx, id, next, ttl))
	})
	if err != nil {
		return 0, fileErr(err)
	}
	return next, nil
}

func (f *File) Get(ctx context.Context, id string) (map[string][]byte, error) {
	fields, _, _, err := f.getVersioned(ctx, id)
	return fields, err
}

// isField tells a field's key in a record's bucket from the meta and head.
func isField(k []byte) bool { return string(k) != string(metaKey) && string(k) != string(headKey) }

func (f *File) readHead(ctx context.Context, id string) (uint64, []byte, []string, error) {
	fields, version, head, err := f.read(ctx, id, false)
	if err != nil {
		return 0, nil, nil, err
	}
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	return version, head, names, nil
}

func (f *File) getVersioned(ctx context.Context, id string) (map[string][]byte, uint64, []byte, error) {
	fields, version, head, err := f.read(ctx, id, true)
	if err == nil && len(fields) == 0 {
		err = ErrNotFound
	}
	if err != nil {
		return nil, 0, nil, err
	}
	return fields, version, head, nil
}

// read returns id's fields (their values too if values is set), version
// and head, in one transaction. Its results are the transaction's own
// variables, returned only once it ended: do returns early when ctx ends,
// leaving the transaction to finish on its own.
func (f *File) read(ctx context.Context, id string, values bool) (map[string][]byte, uint64, []byte, error) {
	var (
		fields  map[string][]byte
		version uint64
		head    []byte
	)
	err := f.do(ctx, false, func(tx *bolt.Tx) error {
		fields, version, head = map[string][]byte{}, 0, nil
		b, m := f.record(tx, id)
		if b == nil {
			return nil
		}
		version, head = m.Version, bytes.Clone(b.Get(headKey))
		return b.ForEach(func(k, v []byte) error {
			if v != nil && isField(k) {
				fields[string(k)] = nil
				if values {
					fields[string(k)] = bytes.Clone(v)
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, 0, nil, fileErr(err)
	}
	return fields, version, head, nil
}

func (f *File) putVersioned(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration) error {
	return f.write(ctx, id, field, value, head, fence, prev, ttl, true)
}

// write is Put, and with versioned putVersioned.
func (f *File) write(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration, versioned bool) error {
	if len(value) > MaxValue {
		return ErrTooLarge
	}
	err := f.do(ctx, true, func(tx *bolt.Tx) error {
		if versioned && Epoch(fence) == f.epoch(tx) {
			// The same write, sent again: it landed, even if another
			// owner claimed the record since (Redis's checkResent).
			if b, m := f.record(tx, id); b != nil && (resentWrite(m.Version, b.Get(headKey), prev, head) || resentWrite(m.ClaimedVersion, m.ClaimedHead, prev, head)) {
				return errResent
			}
		}
		b, m, err := f.check(tx, id, fence)
		if err != nil {
			return err
		}
		if versioned {
			if m.Version != prev {
				return errVersion
			}
			m.Version = prev + 1
			if err := b.Put(headKey, head); err != nil {
				return err
			}
		}
		m.Expires = f.now().Add(ttl).UnixNano()
		return errors.Join(b.Put([]byte(field), value), putMeta(b, m), f.setFence(tx, id, fence, ttl))
	})
	switch {
	case errors.Is(err, errResent):
		return nil
	case errors.Is(err, errVersion):
		return errVersion
	}
	return fileErr(err)
}

// errResent ends, without a change, the transaction of a versioned write
// that was applied already (see versioned.putVersioned).
var errResent = errors.New("statestore: the same write, sent again")

func (f *File) Release(ctx context.Context, id string, fence uint64) error {
	return fileErr(f.do(ctx, true, func(tx *bolt.Tx) error {
		b, m := f.record(tx, id)
		if b == nil || !m.Held || f.fence(tx, id) != fence {
			return nil
		}
		m.Held, m.Owner = false, Owner{}
		return putMeta(b, m)
	}))
}

func (f *File) Delete(ctx context.Context, id string, fence uint64) error {
	return fileErr(f.do(ctx, true, func(tx *bolt.Tx) error {
		b, m := f.record(tx, id)
		if b == nil {
			return nil
		}
		if f.fence(tx, id) != fence {
			return ErrFenced
		}
		// Keep the fence and an empty record until it would have expired.
		recs := tx.Bucket(bucketRecords)
		if err := recs.DeleteBucket([]byte(id)); err != nil {
			return err
		}
		b, err := recs.CreateBucket([]byte(id))
		if err != nil {
			return err
		}
		return errors.Join(putMeta(b, fileMeta{Expires: m.Expires}), f.setFence(tx, id, fence, 0))
	}))
}

// fileErr keeps the store's own errors and names the file in others.
func fileErr(err error) error {
	if err == nil || errors.Is(err, ErrFenced) || errors.Is(err, ErrClosed) || Lost(err) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("statestore: state file: %w", err)
}

// Close stops the sweep, waits for calls in flight and closes the file.
// It is idempotent.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	close(f.stop)
	<-f.swept
	return f.db.Close()
}
