package sources

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"

	"github.com/wasmtools/wasmtools/sandbox"
)

// ErrRedirectPrivate: a redirect hop of a fetch led to a loopback,
// private, link-local or metadata address that the source itself does
// not name.
var ErrRedirectPrivate = fmt.Errorf("redirect to a private address refused")

// hops is what one fetch's redirects led to, carried in its context: a
// host:port reached only through a redirect, other than the source's own,
// is held to the private-address rule of plugin requests
// (sandbox.PrivateAddr), checked on the address dialled (after DNS), so
// a source on a public host cannot bounce the fetch to 169.254.169.254
// or a private service. The hosts the fetch asks itself (the source's,
// a registry's token realm) are the operator's choice and are not.
type hops struct {
	origin string
	mu     sync.Mutex
	only   map[string]bool // host:port reached by a redirect
}

type hopsKey struct{}

// withHops returns ctx carrying the redirect record of a fetch of a
// source at origin (its host:port).
func withHops(ctx context.Context, origin string) context.Context {
	return context.WithValue(ctx, hopsKey{}, &hops{origin: origin, only: map[string]bool{}})
}

// hostPort is u's host:port, the scheme's default port if none is named.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// redirected records a redirect hop to u; it is checked when dialled.
func redirected(ctx context.Context, u *url.URL) {
	h, _ := ctx.Value(hopsKey{}).(*hops)
	if h == nil {
		return
	}
	hp := hostPort(u)
	if hp == h.origin {
		return
	}
	h.mu.Lock()
	h.only[hp] = true
	h.mu.Unlock()
}

// checked reports whether a dial of addr (host:port) must be held to the
// private-address rule.
func checked(ctx context.Context, addr string) bool {
	h, _ := ctx.Value(hopsKey{}).(*hops)
	if h == nil {
		return false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.only[net.JoinHostPort(strings.ToLower(host), port)]
}

// guardDial wraps dial: a redirect hop's host is resolved here, refused
// if any of its addresses is private, and dialled at the address checked
// (so DNS cannot answer differently between the check and the dial).
func guardDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !checked(ctx, addr) {
			return dial(ctx, network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{ip}
		} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if sandbox.PrivateAddr(ip) {
				return nil, fmt.Errorf("%w: %s is %s", ErrRedirectPrivate, addr, ip)
			}
		}
		var errs []error
		for _, ip := range ips {
			c, err := dial(ctx, network, net.JoinHostPort(ip.String(), port))
			if err == nil {
				return c, nil
			}
			errs = append(errs, err)
		}
		return nil, fmt.Errorf("dial %s: %v", addr, errs)
	}
}

// guardTransport returns rt with its dials guarded ([guardDial]), if it
// is an *http.Transport (a copy); otherwise rt.
func guardTransport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	tr, ok := rt.(*http.Transport)
	if !ok {
		return rt
	}
	tr = tr.Clone()
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	tr.DialContext = guardDial(dial)
	return tr
}
