package host

// What an operator watches of the state store: the latency and outcome of
// every exchange, by operation, and the claims by outcome. The labels are
// bounded: an operation is one of the Store interface's methods, an
// outcome one of the words of storeOutcome.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// observed is a Store that records each exchange in the host's metrics,
// and says whose bytes each write is (quota, nil for none), for a store
// that counts them itself (statestore.Counts).
type observed struct {
	statestore.Store
	m     *metrics
	quota func(id string) statestore.Quota
}

// storeOutcome names err for a metric label.
func storeOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, statestore.ErrNotFound):
		return "not_found"
	case errors.Is(err, statestore.ErrFenced):
		return "fenced"
	case errors.Is(err, statestore.ErrHeld):
		return "held"
	case errors.Is(err, statestore.ErrLeased):
		return "leased" // another replica's lease on the session: waited out
	case statestore.Lost(err):
		return "lost"
	case errors.Is(err, statestore.ErrTooLarge):
		return "too_large"
	case errors.Is(err, statestore.ErrBudget):
		return "budget"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "timeout"
	default:
		return "error"
	}
}

func (o observed) done(op string, start time.Time, err error) {
	o.m.storeOps.WithLabelValues(op, storeOutcome(err)).Observe(time.Since(start).Seconds())
}

func (o observed) Heartbeat(ctx context.Context, ow statestore.Owner, ttl time.Duration) (err error) {
	defer func(start time.Time) { o.done("heartbeat", start, err) }(time.Now())
	return o.Store.Heartbeat(ctx, ow, ttl)
}

func (o observed) Leave(ctx context.Context, ow statestore.Owner) (err error) {
	defer func(start time.Time) { o.done("leave", start, err) }(time.Now())
	return o.Store.Leave(ctx, ow)
}

func (o observed) Claim(ctx context.Context, id string, ow statestore.Owner, ttl time.Duration, steal bool) (c statestore.Claim, err error) {
	defer func(start time.Time) {
		o.done("claim", start, err)
		o.m.claims.WithLabelValues(storeOutcome(err)).Inc()
	}(time.Now())
	return o.Store.Claim(ctx, id, ow, ttl, steal)
}

func (o observed) Put(ctx context.Context, id, field string, v []byte, fence uint64, ttl time.Duration) (err error) {
	defer func(start time.Time) { o.done("put", start, err) }(time.Now())
	if o.quota != nil {
		ctx = statestore.WithQuota(ctx, o.quota(id))
	}
	err = o.Store.Put(ctx, id, field, v, fence, ttl)
	if errors.Is(err, statestore.ErrBudget) {
		err = fmt.Errorf("%w: %w", ErrStoreBudget, err)
	}
	return err
}

func (o observed) Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (f uint64, err error) {
	defer func(start time.Time) { o.done("renew", start, err) }(time.Now())
	return o.Store.Renew(ctx, id, fence, ttl, bump)
}

func (o observed) Epoch(ctx context.Context, seen uint32, window time.Duration) (e uint32, lost statestore.Loss, err error) {
	defer func(start time.Time) { o.done("epoch", start, err) }(time.Now())
	return o.Store.Epoch(ctx, seen, window)
}

func (o observed) Get(ctx context.Context, id string) (rec map[string][]byte, err error) {
	defer func(start time.Time) { o.done("get", start, err) }(time.Now())
	return o.Store.Get(ctx, id)
}

func (o observed) Release(ctx context.Context, id string, fence uint64) (err error) {
	defer func(start time.Time) { o.done("release", start, err) }(time.Now())
	return o.Store.Release(ctx, id, fence)
}

func (o observed) Delete(ctx context.Context, id string, fence uint64) (err error) {
	defer func(start time.Time) { o.done("delete", start, err) }(time.Now())
	return o.Store.Delete(ctx, id, fence)
}
