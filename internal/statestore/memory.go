package statestore

import (
	"bytes"
	"context"
	"maps"
	"sync"
	"time"
)

// Memory is a Store in this process's memory: for tests, and for hosts in
// one process sharing a store. Nothing survives the process. It grants
// no [Lease] unless SetLease is called: its tests of anything else take
// sessions from one another at once.
type Memory struct {
	now   func() time.Time
	lease time.Duration

	mu     sync.Mutex
	closed bool
	epoch  uint32
	// lostFor is the epoch whose loss of an earlier one is recorded
	// (Epoch), at lostAt until lostUntil; 0 for none.
	lostFor           uint32
	lostAt, lostUntil time.Time
	alive             map[Owner]time.Time // heartbeat expiry
	records           map[string]*memRecord
}

type memRecord struct {
	owner   Owner
	held    bool
	fence   uint64
	bumped  uint64 // the fence the holder's last bump replaced; 0 after a claim
	taken   uint64 // the fence of the claim that made the holder (Claim.Taken)
	expires time.Time
	leased  time.Time // the holder's last exchange: its Lease runs from it
	fields  map[string][]byte
	version uint64 // the write version ([versioned]); 0 for none
	head    []byte // the sealed head, nil for none
	// claimedVersion and claimedHead are version and head when the
	// holder last changed: the last write of the owner before, which a
	// resend of it finds (resentWrite).
	claimedVersion uint64
	claimedHead    []byte
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{now: time.Now, epoch: newEpoch(), alive: map[Owner]time.Time{}, records: map[string]*memRecord{}}
}

// Flush forgets everything, as a Redis server restarted without
// persistence does: the store gets a new epoch, so every fence claimed
// before is refused with [ErrStoreLost]. For tests.
func (m *Memory) Flush() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.epoch = newEpoch()
	m.lostFor = 0
	clear(m.records)
	clear(m.alive)
}

func (m *Memory) Epoch(ctx context.Context, seen uint32, window time.Duration) (uint32, Loss, error) {
	if err := m.lock(ctx); err != nil {
		return 0, Loss{}, err
	}
	defer m.mu.Unlock()
	now := m.now()
	if seen != 0 && seen != m.epoch && m.lostFor != m.epoch {
		m.lostFor, m.lostAt, m.lostUntil = m.epoch, now, now.Add(window)
	}
	if m.lostFor != m.epoch || !now.Before(m.lostUntil) {
		return m.epoch, Loss{}, nil
	}
	return m.epoch, Loss{Recorded: true, Ago: max(now.Sub(m.lostAt), 0)}, nil
}

// Expire forgets one record and its fence, as an eviction does. For tests.
func (m *Memory) Expire(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.records, id)
}

func (m *Memory) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// record returns id's live record. An expired one is emptied but stays in
// the map for its fence: a claim after it expired must not count from 0
// again, or a stale owner's fence could match the new owner's.
func (m *Memory) record(id string) *memRecord {
	r := m.records[id]
	if r != nil && !m.now().Before(r.expires) {
		if r.held || len(r.fields) > 0 {
			m.records[id] = &memRecord{fence: r.fence, expires: r.expires}
		}
		return nil
	}
	return r
}

func (m *Memory) isAlive(o Owner) bool {
	t, ok := m.alive[o]
	return ok && m.now().Before(t)
}

func (m *Memory) Heartbeat(ctx context.Context, owner Owner, ttl time.Duration) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	m.alive[owner] = m.now().Add(ttl)
	return nil
}

func (m *Memory) Leave(ctx context.Context, owner Owner) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	delete(m.alive, owner)
	return nil
}

// SetLease sets the lease a holder's exchanges give it (0, the default:
// none; [Lease] as Redis grants). Call it before the store is used.
func (m *Memory) SetLease(d time.Duration) { m.lease = d }

func (m *Memory) Claim(ctx context.Context, id string, owner Owner, ttl time.Duration, steal bool) (Claim, error) {
	if err := m.lock(ctx); err != nil {
		return Claim{}, err
	}
	defer m.mu.Unlock()
	r := m.record(id)
	if r == nil {
		r = &memRecord{fields: map[string][]byte{}}
		if old, ok := m.records[id]; ok { // expired: keep counting fences
			r.fence = old.fence
		}
		m.records[id] = r
	}
	r.expires = m.now().Add(ttl)
	now := m.now()
	if r.held && r.owner == owner && Epoch(r.fence) == m.epoch {
		r.bumped, r.leased = 0, now
		return Claim{Fence: r.fence, Taken: r.taken, Held: true}, nil
	}
	var c Claim
	if r.held {
		alive := m.isAlive(r.owner)
		if alive && !steal {
			return Claim{}, &HeldError{Holder: r.owner}
		}
		if left := r.leased.Add(m.lease).Sub(now); left > 0 {
			return Claim{}, &LeasedError{Holder: r.owner, Wait: left}
		}
		c.Previous, c.PreviousAlive = r.owner, alive
	}
	r.owner, r.held, r.bumped, r.leased = owner, true, 0, now
	r.claimedVersion, r.claimedHead = r.version, r.head
	n := uint32(r.fence) + 1
	if r.fence == 0 {
		n = firstFence()
	}
	r.fence = uint64(m.epoch)<<32 | uint64(n)
	c.Fence, c.Taken, r.taken = r.fence, r.fence, r.fence
	return c, nil
}

func (m *Memory) Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error {
	return m.write(ctx, id, field, value, nil, fence, 0, ttl, false)
}

func (m *Memory) readHead(ctx context.Context, id string) (uint64, []byte, []string, error) {
	if err := m.lock(ctx); err != nil {
		return 0, nil, nil, err
	}
	defer m.mu.Unlock()
	r := m.record(id)
	if r == nil {
		return 0, nil, nil, nil
	}
	names := make([]string, 0, len(r.fields))
	for k := range r.fields {
		names = append(names, k)
	}
	return r.version, bytes.Clone(r.head), names, nil
}

func (m *Memory) getVersioned(ctx context.Context, id string) (map[string][]byte, uint64, []byte, error) {
	if err := m.lock(ctx); err != nil {
		return nil, 0, nil, err
	}
	defer m.mu.Unlock()
	r := m.record(id)
	if r == nil || len(r.fields) == 0 {
		return nil, 0, nil, ErrNotFound
	}
	out := maps.Clone(r.fields)
	for k, v := range out {
		out[k] = bytes.Clone(v)
	}
	return out, r.version, bytes.Clone(r.head), nil
}

func (m *Memory) putVersioned(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration) error {
	return m.write(ctx, id, field, value, head, fence, prev, ttl, true)
}

// write is Put, and with versioned putVersioned.
func (m *Memory) write(ctx context.Context, id, field string, value, head []byte, fence, prev uint64, ttl time.Duration, versioned bool) error {
	if len(value) > MaxValue {
		return ErrTooLarge
	}
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if versioned && Epoch(fence) == m.epoch {
		// The same write, sent again: it landed, even if another owner
		// claimed the record since (Redis's checkResent says why).
		if r := m.record(id); r != nil && (resentWrite(r.version, r.head, prev, head) || resentWrite(r.claimedVersion, r.claimedHead, prev, head)) {
			return nil
		}
	}
	r, err := m.check(id, fence)
	if err != nil {
		return err
	}
	if versioned {
		if r.version != prev {
			return errVersion
		}
		r.head, r.version = bytes.Clone(head), prev+1
	}
	r.fields[field] = bytes.Clone(value)
	r.expires, r.leased = m.now().Add(ttl), m.now()
	return nil
}

// check returns id's record if fence may write it. m.mu is held.
func (m *Memory) check(id string, fence uint64) (*memRecord, error) {
	if Epoch(fence) != m.epoch {
		return nil, ErrStoreLost
	}
	r := m.record(id)
	switch {
	case r == nil:
		return nil, ErrRecordLost
	case !r.held || r.fence != fence:
		return nil, ErrFenced
	}
	return r, nil
}

func (m *Memory) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	if r := m.record(id); bump && r != nil && r.held && r.bumped == fence && r.bumped != 0 {
		r.expires = m.now().Add(ttl) // the same bump, sent again
		return r.fence, nil
	}
	r, err := m.check(id, fence)
	if err != nil {
		return 0, err
	}
	if bump {
		r.bumped = fence
		r.fence++
	}
	r.expires, r.leased = m.now().Add(ttl), m.now()
	return r.fence, nil
}

func (m *Memory) Get(ctx context.Context, id string) (map[string][]byte, error) {
	fields, _, _, err := m.getVersioned(ctx, id)
	return fields, err
}

func (m *Memory) Release(ctx context.Context, id string, fence uint64) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	if r := m.record(id); r != nil && r.held && r.fence == fence {
		r.held, r.leased = false, time.Time{}
	}
	return nil
}

func (m *Memory) Delete(ctx context.Context, id string, fence uint64) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	r := m.record(id)
	if r == nil {
		return nil
	}
	if r.fence != fence {
		return ErrFenced
	}
	// Keep the fence, so a stale owner's later write is still refused.
	m.records[id] = &memRecord{fence: r.fence, expires: r.expires, fields: map[string][]byte{}}
	return nil
}

func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
