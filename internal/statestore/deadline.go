package statestore

import (
	"context"
	"time"
)

// A store's exchange must return when its context ends. The Redis client
// bounds its wait for a reply by the context's deadline (a socket
// deadline) but does not notice a cancellation, so Redis runs each
// exchange on a goroutine of its own and returns at either. That hand-off
// costs a goroutine switch and, when the other core is idle, waking it:
// about 30 µs of a Go guest's checkpoint on the 2-core machine of
// docs/BENCHMARKS.md (docs/DESIGN.md, "Why does an after-call checkpoint's
// Redis exchange run on the caller's goroutine?"). A context that nothing but a deadline can end
// before the exchange returns needs none of it, and the durable-session
// writes that follow a call are made under such contexts (Detach): the
// call was answered or is being answered, and its state must be written
// whatever the client does since.

// deadlineOnlyKey is the key of a deadlineOnlyMark.
type deadlineOnlyKey struct{}

// deadlineOnlyMark marks a context that only a deadline ends: done is its
// Done channel, so that a context derived from it by anything but
// WithTimeout (context.WithCancel, say), whose Done is another channel,
// is not taken for one.
type deadlineOnlyMark struct{ done <-chan struct{} }

// Detach returns ctx without its cancellation (context.WithoutCancel),
// marked as a context that only a deadline ends. A store may run an
// exchange under it, or under WithTimeout of it, on the caller's
// goroutine: it then returns at the exchange's end or its deadline, as it
// would have anyway.
func Detach(ctx context.Context) context.Context {
	ctx = context.WithoutCancel(ctx)
	return context.WithValue(ctx, deadlineOnlyKey{}, deadlineOnlyMark{ctx.Done()})
}

// WithTimeout is context.WithTimeout, keeping Detach's mark: a context
// that only a deadline ends is still one with an earlier deadline. The
// caller must call cancel only after the exchanges under the context
// returned (defer cancel()), as it would for any context it made.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	marked := DeadlineOnly(ctx)
	ctx, cancel := context.WithTimeout(ctx, d)
	if marked {
		ctx = context.WithValue(ctx, deadlineOnlyKey{}, deadlineOnlyMark{ctx.Done()})
	}
	return ctx, cancel
}

// DeadlineOnly reports whether ctx is one of Detach's, or of WithTimeout
// of one, with nothing between that could cancel it: one a store may run
// an exchange under on the caller's goroutine.
func DeadlineOnly(ctx context.Context) bool {
	m, ok := ctx.Value(deadlineOnlyKey{}).(deadlineOnlyMark)
	return ok && m.done == ctx.Done()
}
