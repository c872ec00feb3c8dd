package host

import (
	"errors"
	"sync"
	"time"
)

// A request naming a stateful session ID that this replica does not hold
// makes it read the state store, to take the session over (adopt). The
// store is every replica's and every tenant's (their checkpoints wait on
// it), and an ID costs a client nothing to make up: each tenant's reads
// of IDs the store turns out not to hold for it are paced by a token
// bucket of its own (the anonymous pool's one, as for every share;
// without tenants, everyone's). A read that finds the tenant's own
// session gives its token back, so that a replica's failover, which
// moves a tenant's every session at once, is not paced: only IDs that
// end in a 404 (unknown, expired, or another subject's) or that the
// store did not answer spend the bucket. Past it the request is refused
// as when the store does not answer a takeover (503, retry), not 404: a
// real session of the tenant's is not ended at its client because its
// other requests named made-up IDs.
//
// The pace is generous (a read of a key Redis does not have costs it
// some microseconds): it bounds what one tenant's requests take of the
// store, and spares the tenant's own takeovers otherwise. A GET so
// refused (the go-sdk client's standing stream, reopened at a failover,
// which takes a 503 for the session's end) is answered an empty event
// stream that asks it to come back in 4 to 5 s (notNow); a client whose
// fellow clients in the same tenant (the anonymous pool; everyone,
// without tenants) keep the bucket empty, some 64 requests a second,
// through its four such answers still loses its session.
const (
	takeoverBurst = 128 // reads at once
	takeoverRate  = 64  // reads a second, after
)

// errTakeoversPaced is a takeover not tried: the tenant's bucket of
// store reads is empty.
var errTakeoversPaced = errors.New("too many requests of this client's subject named sessions unknown here")

// takeoverPace is each tenant's bucket of takeover reads. It is safe
// for concurrent use.
type takeoverPace struct {
	mu      sync.Mutex
	buckets map[string]*takeoverBucket
}

type takeoverBucket struct {
	tokens float64
	at     time.Time // when tokens was last refilled
}

// refill brings b to now.
func (b *takeoverBucket) refill(now time.Time) {
	if d := now.Sub(b.at); d > 0 {
		b.tokens = min(takeoverBurst, b.tokens+d.Seconds()*takeoverRate)
		b.at = now
	}
}

// take takes a token of tenant's, and reports whether there was one.
func (p *takeoverPace) take(tenant string) bool {
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.buckets[tenant]
	if b == nil {
		if p.buckets == nil {
			p.buckets = map[string]*takeoverBucket{}
		}
		if len(p.buckets) >= maxRateTenants {
			// The full buckets are as good as new ones.
			for k, o := range p.buckets {
				if o.refill(now); o.tokens >= takeoverBurst {
					delete(p.buckets, k)
				}
			}
		}
		b = &takeoverBucket{tokens: takeoverBurst, at: now}
		p.buckets[tenant] = b
	}
	b.refill(now)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// give gives back a token tenant took (its read found its session).
func (p *takeoverPace) give(tenant string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.buckets[tenant]; b != nil {
		b.tokens = min(takeoverBurst, b.tokens+1)
	}
}
