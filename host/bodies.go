package host

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultRequestBytes is the default of [GuardOptions.RequestBytes]: 64
// MiB of request bodies read and served at once, in all.
//
// It counts a body's bytes, not what decoding them costs: the go-sdk
// holds a body twice while it reads and checks it, and a body of many
// small JSON values decodes into some ten times its bytes of maps and
// values, so the bound keeps the heap requests take at once to some 640
// MiB, within the 3 GiB a replica is given (deploy/k8s). Counting the
// decoded cost instead would make a 4 MiB body larger than a tenant's
// share, and the number harder to set against max_request_body.
const DefaultRequestBytes = 64 << 20

// bodyWait is how long a request past the bound on request bodies waits
// for room before it is refused: long enough for the bodies being read
// (a few MiB on a local network) to be served, short enough that a
// client is told rather than held.
const bodyWait = 2 * time.Second

// bodyBudget bounds the bytes of the request bodies being read and
// served, in all and for each tenant, so that how many the go-sdk reads
// and decodes at once is bounded in bytes (the call shares apply only
// once it has). A body of known length counts its length from before it
// is read until the request has been served (its decoded parameters live
// that long); one of unknown length (chunked) is read here, its count
// growing as it is read. It is safe for concurrent use.
type bodyBudget struct {
	total, share int // share 0: no shares (no tenants)
	maxBody      int
	held         byteShares // by subject ("" for none)
	// refused counts the requests refused, by the bound they met; nil
	// counts none.
	refused *prometheus.CounterVec
}

// newBodyBudget bounds bodies of at most maxBody bytes to total in all,
// and share (0: none) for each tenant, each at least one body of
// maxBody.
func newBodyBudget(total, share, maxBody int64) *bodyBudget {
	if share > 0 {
		share = max(share, maxBody)
	}
	return &bodyBudget{total: int(max(total, maxBody)), share: int(share), maxBody: int(maxBody)}
}

// take counts n more bytes for tenant, waiting up to bodyWait for room
// (or until ctx ends), and reports whether it did; a refusal is counted
// (the caller refuses the request), unless ctx ended: a client that hung
// up while it waited is told nothing, and the metric counts the 503s
// clients are told.
func (b *bodyBudget) take(ctx context.Context, tenant string, n int) bool {
	bound := b.held.await(ctx, tenant, n, b.total, b.share, bodyWait)
	if bound != "" && b.refused != nil && ctx.Err() == nil {
		b.refused.WithLabelValues(bound).Inc()
	}
	return bound == ""
}

// wrap counts the bodies of the requests next serves. A request past the
// bound is refused with 503 and Retry-After, as the server's other
// refusals of the moment are (a replica draining, a token that cannot be
// checked now): what MCP clients and proxies retry, possibly on another
// replica. (429 would tell the client it went past a rate, which is not
// what is bounded here.)
func (b *bodyBudget) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		tenant := ""
		if b.share > 0 {
			if ti, ok := r.Context().Value(verifiedKey{}).(*auth.TokenInfo); ok {
				tenant = ti.UserID
			}
		}
		var n int
		if r.ContentLength < 0 {
			var ok bool
			if n, ok = b.readUnknown(r, tenant); !ok {
				refuseBody(w)
				return
			}
		} else {
			// The body's reader stops at its length (net/http's), and
			// at maxBody (limitBody's).
			n = int(min(r.ContentLength, int64(b.maxBody)))
			if !b.take(r.Context(), tenant, n) {
				refuseBody(w)
				return
			}
		}
		if listenRequest(r) {
			// A listen gives its count back once booked (heldBody); every
			// other request, at its end, with nothing allocated.
			held := &heldBody{n: n, give: func() { b.held.give(tenant, n) }}
			defer held.giveBack()
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), heldBodyKey{}, held)))
			return
		}
		defer b.held.give(tenant, n)
		next.ServeHTTP(w, r)
	})
}

// heldBodyKey carries, in a request's context, its body's count under
// the bound on request bodies (a *heldBody).
type heldBodyKey struct{}

// heldBody is a request body's count under the bound on request bodies,
// given back when the request has been served, or before by a request
// served for long once its body has been read and parsed (a
// subscriptions/listen stream: Host.listenBody), which counts what it
// keeps in a bound of its own.
type heldBody struct {
	n    int // bytes counted
	once sync.Once
	give func()
}

// giveBack gives the body's count back, once.
func (h *heldBody) giveBack() { h.once.Do(h.give) }

// readUnknown reads r's body of unknown length under a count for tenant
// that grows, doubling, as it is read, and gives r the bytes read. It
// returns the bytes counted, or false (nothing counted) when the count
// could not grow: a client that does not say its body's length must not
// pass the bound by sending it in pieces.
func (b *bodyBudget) readUnknown(r *http.Request, tenant string) (int, bool) {
	reserved := min(64<<10, b.maxBody)
	if !b.take(r.Context(), tenant, reserved) {
		return 0, false
	}
	var buf bytes.Buffer
	for {
		_, err := io.CopyN(&buf, r.Body, int64(reserved-buf.Len()))
		if err != nil {
			// The end, or a failure (a body over maxBody): the handler
			// reads it after the bytes, and answers it. A MultiReader
			// lets go of the bytes once they are read: a listen's body
			// is no longer counted then (heldBody).
			rest := []io.Reader{bytes.NewReader(buf.Bytes())}
			if err != io.EOF {
				rest = append(rest, errReader{err})
			}
			r.Body = io.NopCloser(io.MultiReader(rest...))
			return reserved, true
		}
		more := min(reserved, b.maxBody-reserved)
		if more <= 0 {
			// maxBody read, and maybe more to come: the handler reads on,
			// and its read fails past maxBody (limitBody's reader).
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(buf.Bytes()), r.Body))
			return reserved, true
		}
		if !b.take(r.Context(), tenant, more) {
			b.held.give(tenant, reserved)
			return 0, false
		}
		reserved += more
	}
}

// errReader fails with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// refuseBody answers a request past the bound on request bodies.
func refuseBody(w http.ResponseWriter) {
	refuse(w, "too many request bodies are being read now (limits.request_bytes_total, request_bytes_per_subject); retry")
}
