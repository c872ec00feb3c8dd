package sessions

import (
	"container/list"
	"fmt"
)

// CheckHandleIndex reports where the handle indexes (handleindex.go)
// differ from what a walk of every client finds, as OpenIn once walked
// them.
func (m *Manager) CheckHandleIndex() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	open := map[string]int{}
	idle := map[*client]bool{}
	for _, c := range m.clients {
		if c.key.kind != KindHandle {
			continue
		}
		open[c.group]++
		if c.leases == 0 {
			idle[c] = true
		}
	}
	if len(open) != len(m.handleGroups) {
		return fmt.Errorf("%d groups indexed; want %d", len(m.handleGroups), len(open))
	}
	// walk checks that l holds, in lastUsed order, the clients of want
	// that served one request (once) or not.
	walk := func(name string, l *list.List, once bool, want func(*client) bool) (int, error) {
		n := 0
		for e := l.Front(); e != nil; e = e.Next() {
			c := e.Value.(*client)
			if !want(c) || (c.requests == 1) != once {
				return 0, fmt.Errorf("%s holds %s (group %q, leases %d, requests %d)", name, c.key, c.group, c.leases, c.requests)
			}
			if p := e.Prev(); p != nil && c.lastUsed.Before(p.Value.(*client).lastUsed) {
				return 0, fmt.Errorf("%s is out of order at %s", name, c.key)
			}
			n++
		}
		return n, nil
	}
	count := func(f func(*client) bool) int {
		n := 0
		for c := range idle {
			if f(c) {
				n++
			}
		}
		return n
	}
	for group, g := range m.handleGroups {
		if g.open != open[group] {
			return fmt.Errorf("group %q: %d open; want %d", group, g.open, open[group])
		}
		of := func(c *client) bool { return idle[c] && c.group == group }
		for _, once := range []bool{true, false} {
			l := &g.idle.other
			if once {
				l = &g.idle.once
			}
			n, err := walk(fmt.Sprintf("group %q's idle list (once %v)", group, once), l, once, of)
			if err != nil {
				return err
			}
			if want := count(func(c *client) bool { return of(c) && (c.requests == 1) == once }); n != want {
				return fmt.Errorf("group %q's idle list (once %v): %d; want %d", group, once, n, want)
			}
		}
		unreturned := func(c *client) bool { return of(c) && c.requests == 1 && c.holdsInstance() }
		n, err := walk(fmt.Sprintf("group %q's unreturned", group), &g.unreturned, true, unreturned)
		if err != nil {
			return err
		}
		if want := count(unreturned); n != want {
			return fmt.Errorf("group %q's unreturned: %d; want %d", group, n, want)
		}
	}
	for _, once := range []bool{true, false} {
		l := &m.idleHandles.other
		if once {
			l = &m.idleHandles.once
		}
		n, err := walk(fmt.Sprintf("the idle list of all (once %v)", once), l, once, func(c *client) bool { return idle[c] })
		if err != nil {
			return err
		}
		if want := count(func(c *client) bool { return (c.requests == 1) == once }); n != want {
			return fmt.Errorf("the idle list of all (once %v): %d; want %d", once, n, want)
		}
	}
	// The victim OpenIn takes, against the walk it took before.
	for group := range open {
		for _, overShare := range []bool{false, true} {
			var once, lru *client
			for _, c := range m.clients {
				if c.key.kind != KindHandle || c.leases > 0 || c.closed {
					continue
				}
				if group != "" && c.group != group && (overShare || c.group != "") {
					continue
				}
				if lru == nil || c.lastUsed.Before(lru.lastUsed) {
					lru = c
				}
				if c.requests == 1 && (once == nil || c.lastUsed.Before(once.lastUsed)) {
					once = c
				}
			}
			want := once
			if want == nil {
				want = lru
			}
			got := m.handleVictimLocked(group, overShare)
			// Of equal lastUsed, the walk took any.
			if (got == nil) != (want == nil) || got != nil && (got.requests == 1) != (want.requests == 1) || got != nil && !got.lastUsed.Equal(want.lastUsed) {
				return fmt.Errorf("group %q (over its share %v): victim %v; want %v", group, overShare, got, want)
			}
		}
	}
	return nil
}

// SetGaveBack has f run after each start that failed gave back what it
// took, before its lease lets the slot go.
func (m *Manager) SetGaveBack(f func()) { m.gaveBack = f }

// Lock holds the manager's lock until the returned func is called, so
// that a test can check that something does not wait for it.
func (m *Manager) Lock() (unlock func()) {
	m.mu.Lock()
	return m.mu.Unlock
}
