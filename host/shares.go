package host

import "sync"

// Per-tenant shares of the bounds the clients share (issue 26): a tenant
// is an authenticated subject, and all clients without a subject together
// are one more. One tenant exhausting its share leaves the others theirs.

// tenantOf is the tenant of subject ("" for none): a keyed digest, so that
// a subject's name (any string) never shows in logs or keys.
func (h *Host) tenantOf(subject string) string { return "tenant:" + h.subjectTag(subject) }

// shares counts what each tenant holds of one bound. It is safe for
// concurrent use.
type shares struct {
	mu   sync.Mutex
	held map[string]int
}

// take counts one more for tenant if it holds fewer than max, and
// reports whether it did.
func (s *shares) take(tenant string, max int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant] >= max {
		return false
	}
	if s.held == nil {
		s.held = map[string]int{}
	}
	s.held[tenant]++
	return true
}

// give counts one fewer for tenant.
func (s *shares) give(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[tenant]--; s.held[tenant] <= 0 {
		delete(s.held, tenant)
	}
}

// count is what tenant holds.
func (s *shares) count(tenant string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[tenant]
}
