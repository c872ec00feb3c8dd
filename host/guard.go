package host

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	wauth "github.com/wasmtools/wasmtools/internal/auth"
)

// Defaults of [GuardOptions] and of the HTTP server wasmtools runs.
const (
	// DefaultMaxRequestBody bounds a request body. It is the go-sdk's own
	// bound on /mcp, applied to every endpoint.
	DefaultMaxRequestBody = 4 << 20
	// DefaultBodyTimeout bounds the time a client may take to send a
	// request body, from the end of its headers.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultHeaderTimeout bounds the time a client may take to send a
	// request's headers (http.Server.ReadHeaderTimeout).
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultMaxHeaderBytes bounds a request's headers
	// (http.Server.MaxHeaderBytes; net/http reads 4 KiB more): HAProxy's
	// whole request buffer by default, above the 8 KiB lines nginx takes.
	// What a connection holds while it reads them is some 14 times the
	// bytes read at worst (short lines of distinct names, parsed into the
	// header map as they come: 280 KiB of heap at 16 KiB, 1 MiB at the
	// 64 KiB of before), for up to the header timeout (docs/SECURITY.md).
	DefaultMaxHeaderBytes = 16 << 10
	// DefaultIdleTimeout closes a keep-alive connection that sends no new
	// request for this long (http.Server.IdleTimeout).
	DefaultIdleTimeout = 2 * time.Minute
)

// GuardOptions are the checks [Guard] applies to every request. Nil and
// zero fields mean the documented defaults.
type GuardOptions struct {
	// Token, if set, is a bearer token every client may carry; Tokens
	// maps subjects to tokens of their own, which identify them (see
	// [RequireTokens]). With either set, every request needs one.
	Token  string
	Tokens map[string]string
	// Verifier, if set, checks bearer tokens instead (an OAuth resource
	// server's, or a chain with the static tokens); Bearer says what its
	// refusals tell the client (see [RequireBearer]).
	Verifier wauth.Verifier
	Bearer   BearerOptions
	// Public are paths served without the token; the other checks still
	// apply, but for the bound on request bodies, which counts a body
	// against the tenant its token names: a handler of a public path
	// must not read a body. wasmtools lists its probes and the
	// operator's endpoints here, which check the operator's credential
	// themselves.
	Public []string
	// Open are paths served without the token to any origin (the Host
	// check still applies): public documents a browser-based client reads
	// cross-origin, such as the protected resource metadata (RFC 9728).
	// As on Public paths, their bodies are neither read nor counted.
	Open []string
	// AllowedOrigins are browser origins ("http://localhost:6274"),
	// besides the server's own, whose cross-origin requests are served.
	AllowedOrigins []string
	// MaxBody bounds a request body; a longer one fails with 413. 0 means
	// DefaultMaxRequestBody.
	MaxBody int64
	// BodyTimeout bounds the time from a request's headers to the end of
	// its body; a client sending more slowly is cut off, connection and
	// all. 0 means DefaultBodyTimeout. Requests without a body (the GET
	// that opens a long-lived SSE stream) have no read deadline.
	BodyTimeout time.Duration
	// RequestBytes bounds the bytes of the request bodies read and served
	// at once (a body counted from before it is read until its request
	// has been served); 0 means DefaultRequestBytes. With tenants
	// (Tenants, or Tokens given), each subject, and all clients without
	// one together, has a share of it: RequestBytesPerSubject, 0 meaning
	// a quarter. Each is at least MaxBody. A request past either waits
	// up to 2 s for room, then is refused with 503 and Retry-After.
	RequestBytes, RequestBytesPerSubject int64
	// Metrics, if set, is the host in whose metrics ([Host.MetricsHandler])
	// the requests refused past RequestBytes or RequestBytesPerSubject
	// are counted: wasmtools_request_bodies_refused_total, by the bound
	// met ("total" or "per_subject"). nil counts them nowhere.
	Metrics *Host
	// Tenants gives each subject a share of the bounds above, as
	// [Options.Tenants] does of the host's; giving Tokens implies it.
	Tenants bool
}

// Guard wraps next with the checks every HTTP endpoint of wasmtools gets,
// in this order:
//
//  1. Host: a request arriving on a loopback address whose Host header
//     is not loopback is refused with 403 (DNS rebinding: a web page whose
//     name now resolves to 127.0.0.1 sends its own name as the Host), as
//     the go-sdk does for its MCP handler.
//  2. Origin: a cross-origin browser request (by Sec-Fetch-Site, or an
//     Origin that is not the request's own host) is refused with 403,
//     whatever its method, unless its Origin is in AllowedOrigins.
//  3. Token: without the bearer token, 401, except on Public paths.
//
// It also bounds the request body's size and the time to send it, and
// the bytes of the bodies read and served at once, in all and, with
// tenants, for each (RequestBytes): a body counts against its tenant's
// share once the token says whose it is, before it is read. The checks
// are not a substitute for TLS: the token crosses the network in clear
// over plain HTTP.
func Guard(next http.Handler, o GuardOptions) http.Handler {
	maxBody := o.MaxBody
	if maxBody <= 0 {
		maxBody = DefaultMaxRequestBody
	}
	bodyTimeout := o.BodyTimeout
	if bodyTimeout <= 0 {
		bodyTimeout = DefaultBodyTimeout
	}
	allowed := map[string]bool{}
	for _, origin := range o.AllowedOrigins {
		allowed[strings.TrimSuffix(origin, "/")] = true
	}
	public, open := map[string]bool{}, map[string]bool{}
	for _, p := range o.Public {
		public[p] = true
	}
	for _, p := range o.Open {
		open[p] = true
	}
	// After the token's check, which says whose share a body counts
	// against; before the go-sdk reads it.
	bodies := newBodyBudget(o.requestBytes(maxBody))
	if o.Metrics != nil {
		bodies.refused = o.Metrics.metrics.bodiesRefused
	}
	// The paths served without the token are served without the budget:
	// their handlers read no body, and counted, a body that never came
	// (chunked: counted from before its first byte) held the anonymous
	// tenant's share, or with no subjects everyone's, until the body
	// timeout, for anyone who reached the port with no token at all
	// (a red team, stop 72: TestPublicPathBodiesHoldNoBudget).
	untokened := next
	next = bodies.wrap(next)
	withToken := next
	switch {
	case o.Verifier != nil:
		withToken = RequireBearer(o.Verifier, o.Bearer, next)
	case o.Token != "" || len(o.Tokens) > 0:
		withToken = RequireBearer(wauth.NewStatic(o.Token, o.Tokens), o.Bearer, next)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			// First, so that a refused request's unread body is bounded
			// too: the server reads what is left after the handler.
			limitBody(w, r, maxBody, bodyTimeout)
		}
		if err := checkHost(r); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		if open[r.URL.Path] {
			untokened.ServeHTTP(w, r)
			return
		}
		if err := checkOrigin(r, allowed); err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		if public[r.URL.Path] {
			untokened.ServeHTTP(w, r)
			return
		}
		withToken.ServeHTTP(w, r)
	})
}

// requestBytes is what newBodyBudget takes: the bound on request bodies
// in all, each tenant's share of it (0 without tenants) and the largest
// body.
func (o GuardOptions) requestBytes(maxBody int64) (total, share, max int64) {
	total = o.RequestBytes
	if total <= 0 {
		total = DefaultRequestBytes
	}
	switch {
	case !o.Tenants && len(o.Tokens) == 0:
	case o.RequestBytesPerSubject > 0:
		share = o.RequestBytesPerSubject
	default:
		share = total / 4
	}
	return total, share, maxBody
}

// limitBody bounds r's body to max bytes, and the time to read it to
// timeout: the connection's read deadline is set now and cleared when the
// body has been read to its end, so a stream the handler then writes (an
// SSE response to a POST) is not cut off.
func limitBody(w http.ResponseWriter, r *http.Request, max int64, timeout time.Duration) {
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return // not a connection of net/http's server (a test recorder)
	}
	r.Body = &deadlineBody{ReadCloser: http.MaxBytesReader(w, r.Body, max), rc: rc}
}

// deadlineBody clears the connection's read deadline at the end of the
// body.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// checkHost refuses a request that arrived on a loopback address with a
// Host header that is not loopback. A request with no Host at all
// (HTTP/1.0, as a proxy's health check sends) passes: a browser always
// sends one, so it is not a rebinding page.
func checkHost(r *http.Request) error {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || local == nil || !isLoopback(local.String()) || r.Host == "" || isLoopback(r.Host) {
		return nil
	}
	return fmt.Errorf("forbidden: Host %q is not a loopback name on a loopback address (DNS rebinding?)", r.Host)
}

// isLoopback reports whether addr (host or host:port) is localhost or a
// loopback address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// checkOrigin refuses a cross-origin browser request unless its origin is
// allowed. Requests from programs that send neither Sec-Fetch-Site nor
// Origin are not browser requests, and pass.
func checkOrigin(r *http.Request, allowed map[string]bool) error {
	origin := r.Header.Get("Origin")
	if origin != "" && allowed[origin] {
		return nil
	}
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		return fmt.Errorf("forbidden: %s request from origin %q (allow it with http.allowed_origins)", site, origin)
	}
	if origin == "" {
		return nil
	}
	if u, err := url.Parse(origin); err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return fmt.Errorf("forbidden: cross-origin request from origin %q (allow it with http.allowed_origins)", origin)
	}
	return nil
}
