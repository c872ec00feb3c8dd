package sessions

import "container/list"

// handleGroup indexes the open handle clients of one group (OpenIn's),
// so that a handle's opening costs O(1) under m.mu however many clients
// there are: it used to walk every client of every group, three times.
// A client is indexed from its opening until it is forgotten
// (forgetLocked), in the group it is of: a handle opened in group "" moves
// to its first lease's tenant (acquireSlot), while it holds that lease.
type handleGroup struct {
	open int // the group's open handle clients
	idle idleHandles
	// unreturned are those in idle.once holding an instance, least
	// recently used first: Options.MaxUnreturned bounds them.
	unreturned list.List
}

// idleHandles are handle clients with no lease, each least recently used
// first. A client enters at the back as its last lease ends (or as it
// opens), which is when lastUsed is set, so each list is in lastUsed
// order, and leaves as a lease comes.
type idleHandles struct {
	once  list.List // served exactly one request: their client never came back
	other list.List // served none yet (their minting call on the way) or more
}

// handleElems are a handle client's places in the indexes; guarded by
// Manager.mu.
type handleElems struct {
	idle, all, unreturned *list.Element // in its group's idle list, all groups', its group's unreturned
}

// idleList returns the list of idle that c belongs in: by requests, which
// changes only as a lease comes, after c has left the list.
func (c *client) idleList(idle *idleHandles) *list.List {
	if c.requests == 1 {
		return &idle.once
	}
	return &idle.other
}

// indexed reports whether c is an open handle client, which the indexes
// hold. The caller holds m.mu.
func (m *Manager) indexed(c *client) bool {
	return c.key.kind == KindHandle && m.clients[c.key] == c
}

// handleGroupLocked returns group's index, made if need be. The caller
// holds m.mu.
func (m *Manager) handleGroupLocked(group string) *handleGroup {
	g := m.handleGroups[group]
	if g == nil {
		g = &handleGroup{}
		m.handleGroups[group] = g
	}
	return g
}

// indexHandleLocked counts a handle client just opened (in m.clients, of
// its group) and makes it idle. The caller holds m.mu.
func (m *Manager) indexHandleLocked(c *client) {
	m.handleGroupLocked(c.group).open++
	m.idleHandleLocked(c)
}

// unindexHandleLocked takes a handle client being forgotten out of the
// indexes; a group with no open handle left goes. The caller holds m.mu.
func (m *Manager) unindexHandleLocked(c *client) {
	m.busyHandleLocked(c)
	g := m.handleGroups[c.group]
	if g.open--; g.open == 0 {
		delete(m.handleGroups, c.group)
	}
}

// regroupHandleLocked moves an open handle client, which holds a lease,
// to group. The caller holds m.mu.
func (m *Manager) regroupHandleLocked(c *client, group string) {
	m.unindexHandleLocked(c)
	c.group = group
	m.handleGroupLocked(group).open++
}

// idleHandleLocked puts an open handle client whose last lease just ended
// (or that just opened) at the back of its idle lists, and of its group's
// unreturned ones if it served one request and holds an instance. The
// caller holds m.mu.
func (m *Manager) idleHandleLocked(c *client) {
	g := m.handleGroups[c.group]
	c.elems.idle = c.idleList(&g.idle).PushBack(c)
	c.elems.all = c.idleList(&m.idleHandles).PushBack(c)
	if c.requests == 1 && c.holdsInstance() {
		c.elems.unreturned = g.unreturned.PushBack(c)
	}
}

// busyHandleLocked takes a handle client out of the idle lists: a lease
// came, or it is forgotten. The caller holds m.mu.
func (m *Manager) busyHandleLocked(c *client) {
	if c.elems.idle == nil {
		return
	}
	g := m.handleGroups[c.group]
	c.idleList(&g.idle).Remove(c.elems.idle)
	c.idleList(&m.idleHandles).Remove(c.elems.all)
	if c.elems.unreturned != nil {
		g.unreturned.Remove(c.elems.unreturned)
	}
	c.elems = handleElems{}
}

// instanceGoneLocked: one of c's instances was just closed. A client
// with none left is not an unreturned one holding instances any more. The
// caller holds m.mu.
func (m *Manager) instanceGoneLocked(c *client) {
	if c.elems.unreturned != nil && !c.holdsInstance() {
		m.handleGroups[c.group].unreturned.Remove(c.elems.unreturned)
		c.elems.unreturned = nil
	}
}

// holdsInstance reports whether one of c's slots holds an instance. The
// caller holds m.mu.
func (c *client) holdsInstance() bool {
	for _, sl := range c.slots {
		if sl.elem != nil { // set, under m.mu, while inst is
			return true
		}
	}
	return false
}

// handleVictimLocked returns the handle client OpenIn ends for room, or
// nil: one with no lease, of group only (overShare), or of group or of
// none (group ""), or anyone's (group itself ""); of those, the least
// recently used that served exactly one request, else the least recently
// used. The caller holds m.mu.
func (m *Manager) handleVictimLocked(group string, overShare bool) *client {
	if group == "" {
		return oldestIdle(&m.idleHandles)
	}
	var own, none *idleHandles
	if g := m.handleGroups[group]; g != nil {
		own = &g.idle
	}
	if g := m.handleGroups[""]; g != nil && !overShare {
		none = &g.idle
	}
	return oldestIdle(own, none)
}

// oldestIdle returns the least recently used client of the once lists
// of sets (nil ones skipped), else of their other lists, or nil.
func oldestIdle(sets ...*idleHandles) *client {
	for _, list := range []func(*idleHandles) *list.List{
		func(h *idleHandles) *list.List { return &h.once },
		func(h *idleHandles) *list.List { return &h.other },
	} {
		var oldest *client
		for _, h := range sets {
			if h == nil || list(h).Len() == 0 {
				continue
			}
			if c := list(h).Front().Value.(*client); oldest == nil || c.lastUsed.Before(oldest.lastUsed) {
				oldest = c
			}
		}
		if oldest != nil {
			return oldest
		}
	}
	return nil
}
