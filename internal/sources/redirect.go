package sources

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"unicode/utf8"

	"golang.org/x/net/idna"

	"github.com/wasmtools/wasmtools/sandbox"
)

// ErrRedirectPrivate: a redirect hop of a fetch, or a host the registry
// named (its token realm), led to a loopback, private, link-local or
// metadata address that the source itself does not name.
var ErrRedirectPrivate = fmt.Errorf("redirect to a private address refused")

// hops is what one fetch's redirects led to, carried in its context: a
// host:port reached only through a redirect, other than the source's own,
// is held to the private-address rule of plugin requests
// (sandbox.PrivateAddr), checked on the address dialled (after DNS), so
// a source on a public host cannot bounce the fetch to 169.254.169.254
// or a private service. So is a host the fetch asks because the registry
// named it: a token realm (WWW-Authenticate) on another host name than
// the source's, unless the source is itself at a private address (the
// operator's network, where a self-hosted registry's token service may
// be on another host). Only the source's own host is the operator's
// choice.
type hops struct {
	origin string // host:port
	mu     sync.Mutex
	only   map[string]string // host:port held to the rule: how it was reached
	// private says the origin resolves to private addresses only; nil
	// until a realm asks.
	private *bool
}

type hopsKey struct{}

// withHops returns ctx carrying the redirect record of a fetch of a
// source at origin (its host:port).
func withHops(ctx context.Context, origin string) context.Context {
	return context.WithValue(ctx, hopsKey{}, &hops{origin: origin, only: map[string]string{}})
}

// hostPort is u's host:port as net/http dials it (dialName), the scheme's
// default port if none is named.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "443"
		if u.Scheme == "http" {
			port = "80"
		}
	}
	return net.JoinHostPort(dialName(u.Hostname()), port)
}

// dialName is host as net/http dials it, lower-cased: mapped for DNS
// (IDNA) when it is not ASCII. Recorded as written, a realm or redirect
// to https://１０.１.２.３ was not the address dialled (10.1.2.3), and
// escaped the private-address rule (TestTokenRealmPrivateUnicodeHost).
func dialName(host string) string {
	for i := 0; i < len(host); i++ {
		if host[i] >= utf8.RuneSelf {
			if a, err := idna.Lookup.ToASCII(host); err == nil {
				host = a
			}
			break
		}
	}
	return strings.ToLower(host)
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
	h.only[hp] = "a redirect"
	h.mu.Unlock()
}

// requested records a request of a fetch to u: on another host name than
// the source's, it is one the registry named (its token realm), and is
// checked when dialled as a redirect hop is. oras-go refuses loopback,
// link-local and metadata realms, but not the private network's, which a
// public registry must not reach through wasmtools either.
func requested(ctx context.Context, u *url.URL) {
	h, _ := ctx.Value(hopsKey{}).(*hops)
	if h == nil {
		return
	}
	host, _, _ := net.SplitHostPort(h.origin)
	if dialName(u.Hostname()) == host {
		return
	}
	hp := hostPort(u)
	h.mu.Lock()
	private := h.private
	h.mu.Unlock()
	if private == nil { // resolved outside the lock: the fetch's dials take it
		p := privateHost(ctx, host)
		private = &p
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.private = private
	if *private {
		return
	}
	if h.only[hp] == "" {
		h.only[hp] = "a host the registry named (token realm)"
	}
}

// privateHost reports whether host (a name or an address) resolves to
// private addresses only; false if it cannot be resolved.
func privateHost(ctx context.Context, host string) bool {
	ips := []netip.Addr{}
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = append(ips, ip)
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return false
	}
	for _, ip := range ips {
		if !sandbox.PrivateAddr(ip) {
			return false
		}
	}
	return len(ips) > 0
}

// checked says how a dial of addr (host:port) came to be held to the
// private-address rule, "" if it is not.
func checked(ctx context.Context, addr string) string {
	h, _ := ctx.Value(hopsKey{}).(*hops)
	if h == nil {
		return ""
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "a malformed address"
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.only[net.JoinHostPort(strings.ToLower(host), port)]
}

// guardDial wraps dial: a checked host is resolved here, refused if any
// of its addresses is private, and dialled at the address checked (so DNS
// cannot answer differently between the check and the dial).
func guardDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		how := checked(ctx, addr)
		if how == "" {
			return dial(ctx, network, addr)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := publicAddrs(ctx, addr, host, how)
		if err != nil {
			return nil, err
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

// publicAddrs resolves host (of addr, reached through how) and returns its
// addresses, or ErrRedirectPrivate if any of them is private.
func publicAddrs(ctx context.Context, addr, host, how string) ([]netip.Addr, error) {
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip}
	} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
		return nil, err
	}
	for _, ip := range ips {
		if sandbox.PrivateAddr(ip) {
			return nil, fmt.Errorf("%w: %s is %s (reached through %s)", ErrRedirectPrivate, addr, ip, how)
		}
	}
	return ips, nil
}

// guardTransport returns rt with its requests recorded ([requested]) and,
// if it is an *http.Transport (a copy), its dials guarded ([guardDial])
// and the checked hosts it sends to a proxy checked before.
func guardTransport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	tr, ok := rt.(*http.Transport)
	if !ok {
		return guardedTransport{rt: rt}
	}
	tr = tr.Clone()
	dial := tr.DialContext
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	tr.DialContext = guardDial(dial)
	return guardedTransport{rt: tr, proxy: tr.Proxy}
}

// guardedTransport records each request's host ([requested]) before it is
// sent. Through a proxy the proxy is what is dialled, so a checked host is
// resolved and checked here instead (the proxy may resolve it otherwise:
// a name this host cannot resolve is left to it).
type guardedTransport struct {
	rt    http.RoundTripper
	proxy func(*http.Request) (*url.URL, error)
}

func (t guardedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	requested(ctx, req.URL)
	if how := checked(ctx, hostPort(req.URL)); how != "" && t.proxy != nil {
		if p, err := t.proxy(req); err == nil && p != nil {
			var dnsErr *net.DNSError
			if _, err := publicAddrs(ctx, hostPort(req.URL), dialName(req.URL.Hostname()), how); err != nil && !errors.As(err, &dnsErr) {
				if req.Body != nil {
					req.Body.Close()
				}
				return nil, err
			}
		}
	}
	return t.rt.RoundTrip(req)
}
