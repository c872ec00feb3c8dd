package sessions

import (
	"fmt"
	"time"
)

// parkedRun is a call whose lease waits, between a client's requests, for
// the client to come back with an answer.
type parkedRun struct {
	id      string
	lease   *Lease
	value   any
	timer   *time.Timer
	abandon func(cause error)
}

// Park registers the lease's call as parked under id until [Manager.Unpark]
// takes it, with value for whoever does. The lease must be paused (see
// [Lease.Pause]): a parked call holds its instance but no concurrency
// token, and may be evicted. If no one unparks it within after, or it is
// evicted, or the manager closes, it is taken out and abandon is called
// (on a goroutine of its own) with the cause: abandon must stop the call,
// and the lease's Done follows. Park refuses with [ErrParkLimit] past
// [Options.MaxParked] or [Options.MaxParkedPerClient].
func (l *Lease) Park(id string, value any, after time.Duration, abandon func(cause error)) error {
	m := l.m
	m.mu.Lock()
	defer m.mu.Unlock()
	maxAll, maxClient := m.opts.MaxParked, m.opts.MaxParkedPerClient
	if maxAll <= 0 {
		maxAll = DefaultMaxParked
	}
	if maxClient <= 0 {
		maxClient = DefaultMaxParkedPerClient
	}
	switch {
	case l.done || l.evicted:
		return fmt.Errorf("park: the call has ended")
	case m.closed:
		return ErrClosed
	case len(m.parked) >= maxAll:
		return fmt.Errorf("%w: %d in all, the most the server keeps", ErrParkLimit, maxAll)
	case l.c != nil && l.c.parked >= maxClient:
		return fmt.Errorf("%w: this client has %d, the most it may", ErrParkLimit, maxClient)
	}
	p := &parkedRun{id: id, lease: l, value: value, abandon: abandon}
	p.timer = time.AfterFunc(after, func() {
		m.mu.Lock()
		mine := m.parked[id] == p
		if mine {
			m.unparkLocked(id)
		}
		m.mu.Unlock()
		if mine {
			abandon(fmt.Errorf("the client did not answer within %s", after))
		}
	})
	m.parked[id] = p
	l.park = p
	if l.c != nil {
		l.c.parked++
	}
	return nil
}

// Unpark takes the call parked under id, for the client's answer, if
// match accepts its value (nil accepts any): it returns the value given to
// Park, or false if no such call is parked there (finished, abandoned,
// evicted, taken already, or not matched, in which case it stays parked).
func (m *Manager) Unpark(id string, match func(value any) bool) (any, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.parked[id]
	if p == nil || match != nil && !match(p.value) {
		return nil, false
	}
	m.unparkLocked(id)
	return p.value, true
}

// unparkLocked takes the call parked under id out. The caller holds m.mu.
func (m *Manager) unparkLocked(id string) {
	p := m.parked[id]
	if p == nil {
		return
	}
	p.timer.Stop()
	delete(m.parked, id)
	p.lease.park = nil
	if c := p.lease.c; c != nil {
		c.parked--
	}
}
