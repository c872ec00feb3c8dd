package host

import (
	"errors"
	"fmt"
	"sync"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// listenBytes bounds the URI bytes held by the open subscriptions/listen
// streams of 2026-07-28 clients, in all; each tenant gets a quarter (with
// tenants). A listen holds at most maxSubscriptions URIs of at most
// maxURILen bytes, and the go-sdk keeps about four times their bytes in
// the parsed request and its subscriptions while the stream is open: 64
// MiB of URIs is some 256 MiB of memory at most.
// Behind Guard a stream's request body counts here too, as the go-sdk
// keeps it while the stream is open (subscriptionsMiddleware), and no
// longer against the bound on request bodies. The URIs 2025-11-25
// sessions subscribe to with resources/subscribe count against the same
// bytes (takeBytes).
const listenBytes = 64 << 20

// subscriptionCost is what one resources/subscribe URI is counted at
// besides its bytes: the host's book and the go-sdk's each keep it in a
// map.
const subscriptionCost = 128

// listenBook bounds the open subscriptions/listen streams (the 2026-07-28
// clients' way to be told of changes, open until the client leaves), in
// number and in the bytes of the URIs they subscribe to: in all, and with
// tenants, each tenant's share, as [sessionBook] bounds the sessions of
// earlier clients. Until stop 63 nothing did: one client held any number,
// each 2 MiB or more.
type listenBook struct {
	max, share           int // streams
	maxBytes, shareBytes int

	mu      sync.Mutex
	open    int
	bytes   int
	streams map[string]int // tenant -> streams
	held    map[string]int // tenant -> bytes
}

func newListenBook(o *Options) *listenBook {
	b := &listenBook{max: DefaultMaxSessions, maxBytes: listenBytes, streams: map[string]int{}, held: map[string]int{}}
	if o.MaxSessions > 0 {
		b.max = o.MaxSessions
	}
	b.share, b.shareBytes = b.max, b.maxBytes
	if o.Tenants {
		b.share = max(b.max/4, 1)
		if o.MaxSessionsPerSubject > 0 {
			b.share = o.MaxSessionsPerSubject
		}
		b.shareBytes = b.maxBytes / 4
	}
	return b
}

// errListensBusy is matched by the refusal of a listen past the bounds.
var errListensBusy = errors.New("no new subscriptions/listen stream")

// take books a listen stream of tenant holding n bytes of URIs, and
// returns what frees it when the stream ends.
func (b *listenBook) take(tenant string, n int) (release func(), err error) {
	n += 1 << 10 // the stream itself
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case (b.streams[tenant] >= b.share || b.held[tenant]+n > b.shareBytes) && pooled(tenant):
		return nil, fmt.Errorf("%w: the listen streams of the clients without a subject, together, hold their share (%d streams, %d bytes of URIs); close one", errListensBusy, b.share, b.shareBytes)
	case b.streams[tenant] >= b.share || b.held[tenant]+n > b.shareBytes:
		return nil, fmt.Errorf("%w: this client's listen streams hold %d of its share (%d streams, %d bytes of URIs); close one", errListensBusy, b.streams[tenant], b.share, b.shareBytes)
	case b.open >= b.max || b.bytes+n > b.maxBytes:
		return nil, sessions.ServerFull(errListensBusy, "the listen streams, or the bytes of their URIs,")
	}
	return b.bookLocked(tenant, 1, n), nil
}

// takeBytes books n bytes of URIs that a session of tenant's subscribed
// to with resources/subscribe (2025-11-25), within the bytes the listen
// streams' URIs are bounded to, in all and for each tenant, and returns
// what frees them. A session holds at most maxSubscriptions of them, but
// until stop 72 nothing bounded a tenant's: its share of sessions (1,024
// at the defaults) held 512 KiB of URIs each.
func (b *listenBook) takeBytes(tenant string, n int) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.held[tenant]+n > b.shareBytes && pooled(tenant):
		return nil, fmt.Errorf("%w: the subscriptions of the clients without a subject, together, hold their share of %d bytes of URIs; unsubscribe from some", errListensBusy, b.shareBytes)
	case b.held[tenant]+n > b.shareBytes:
		return nil, fmt.Errorf("%w: this client's subscriptions hold %d bytes of URIs, its share is %d; unsubscribe from some", errListensBusy, b.held[tenant], b.shareBytes)
	case b.bytes+n > b.maxBytes:
		return nil, sessions.ServerFull(errListensBusy, "the bytes of subscribed URIs")
	}
	return b.bookLocked(tenant, 0, n), nil
}

// bookLocked counts streams (0 or 1) and n bytes for tenant, and returns
// what gives them back, once. b.mu is held.
func (b *listenBook) bookLocked(tenant string, streams, n int) (release func()) {
	b.streams[tenant] += streams
	b.held[tenant] += n
	b.open += streams
	b.bytes += n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.streams[tenant] -= streams; b.streams[tenant] == 0 {
				delete(b.streams, tenant)
			}
			if b.held[tenant] -= n; b.held[tenant] == 0 {
				delete(b.held, tenant)
			}
			b.open -= streams
			b.bytes -= n
		})
	}
}
