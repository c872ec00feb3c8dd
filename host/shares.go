package host

import (
	"fmt"
	"sync"

	"golang.org/x/time/rate"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

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

// callShare is each tenant's share of the calls in flight
// ([Options.MaxCallsPerSubject]); by default a quarter of the smallest of
// MaxInstances and MaxConcurrentCalls, and 0 (no share) when neither is
// set. A call in flight holds an instance (a parked one too), so one
// tenant's busy calls can never take every instance.
func (h *Host) callShare() int {
	if h.opts.MaxCallsPerSubject > 0 {
		return h.opts.MaxCallsPerSubject
	}
	least := 0
	for _, b := range []int{h.opts.MaxInstances, h.opts.MaxConcurrentCalls} {
		if b > 0 && (least == 0 || b < least) {
			least = b
		}
	}
	if least == 0 {
		return 0
	}
	return max(least/4, 1)
}

// maxRateTenants bounds the tenants whose call rates are tracked; past
// it, the tenants whose buckets are full (idle) are forgotten.
const maxRateTenants = 4096

// admitCall counts a tool call over HTTP by subject ("" for none) against
// its tenant's shares: the calls it has in flight ([Host.callShare]) and
// its calls per second ([Options.CallsPerSecondPerSubject]). Past either
// it fails with an error matching sessions.ErrBusy (CodeBusy, retry);
// else release must be called once the call has ended.
func (h *Host) admitCall(subject string) (release func(), err error) {
	tenant := h.tenantOf(subject)
	if r := h.opts.CallsPerSecondPerSubject; r > 0 {
		h.rateMu.Lock()
		if h.rates == nil {
			h.rates = map[string]*rate.Limiter{}
		}
		if len(h.rates) >= maxRateTenants {
			for k, l := range h.rates {
				if l.Tokens() >= float64(l.Burst()) {
					delete(h.rates, k)
				}
			}
		}
		l := h.rates[tenant]
		if l == nil {
			l = rate.NewLimiter(rate.Limit(r), max(int(r), 1))
			h.rates[tenant] = l
		}
		ok := l.Allow()
		h.rateMu.Unlock()
		if !ok {
			return nil, fmt.Errorf("%w: this client's subject makes more than %g calls per second, its share", sessions.ErrBusy, r)
		}
	}
	share := h.callShare()
	if share == 0 {
		return func() {}, nil
	}
	if !h.callShares.take(tenant, share) {
		return nil, fmt.Errorf("%w: this client's subject has %d calls in flight, its share", sessions.ErrBusy, share)
	}
	var once sync.Once
	return func() { once.Do(func() { h.callShares.give(tenant) }) }, nil
}
