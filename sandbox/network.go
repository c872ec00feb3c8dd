package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/wasmtools/wasmtools/internal/telemetry"
)

// Network is what a plugin may reach with the Extism http_request import.
// The zero value reaches nothing.
type Network struct {
	// AllowedHosts are the hosts, and optionally ports, that requests and
	// each redirect hop may go to: "api.example.com", "api.example.com:8443",
	// "127.0.0.1:18409", "[::1]:8080", or patterns with * (matching any run
	// of characters, dots included: "*.example.org", "*.example.org:8443").
	// A grant without a port allows only the scheme's default port (80 for
	// http, 443 for https): granting "127.0.0.1:18409" does not grant
	// 127.0.0.1:18410. An entry that is not a host or host:port
	// ([CheckHostGrant]) grants nothing, and fails [Runtime.Compile].
	AllowedHosts []string
	// Ask is the ceiling of run-time grants: hosts, with optional ports
	// and patterns as in AllowedHosts, that a request may go to once the
	// [Asker] the call's context carries ([WithAsker]) grants it. A
	// request to a host neither granted nor in Ask is refused without
	// asking; a redirect hop to a host in Ask is put to the Asker with
	// [GrantRequest.Redirect] set, which answers only from what it knows.
	// AllowPrivate applies to what is asked for too. Empty (the default)
	// asks nothing.
	Ask []string
	// AllowPrivate lets requests reach loopback, private (RFC 1918, ULA),
	// link-local and cloud metadata addresses. Without it they are refused
	// when the connection is made, whatever the name resolved to, so a
	// granted name that resolves (or is rebound) to 127.0.0.1 or
	// 169.254.169.254 reaches nothing.
	AllowPrivate bool
	// Extism reads AllowedHosts as Extism and hyper-mcp read them (for
	// hyper-mcp's configuration files): an entry without a port grants
	// every port, and an entry that is itself a loopback or private
	// address ("127.0.0.1", "[::1]", "10.0.0.7") or "localhost" lets
	// requests that name it reach that address without AllowPrivate. A
	// host name that resolves to a private address, a pattern that
	// happens to match an address ("*"), and metadata addresses
	// (169.254.169.254) stay refused. Off by default.
	Extism bool
	// MaxResponse bounds a response body; 0 means 4 MiB. Timeout bounds a
	// request (redirects included); 0 means 10s. The call's own deadline
	// applies too.
	MaxResponse int64
	Timeout     time.Duration
}

// WithNetwork grants network access through the http_request import.
func (p Policy) WithNetwork(n Network) Policy {
	n.AllowedHosts = append([]string(nil), n.AllowedHosts...)
	n.Ask = append([]string(nil), n.Ask...)
	p.network = n
	return p
}

// Network returns the network grant, its lists copied.
func (p Policy) Network() Network {
	n := p.network
	n.AllowedHosts = append([]string(nil), n.AllowedHosts...)
	n.Ask = append([]string(nil), n.Ask...)
	return n
}

// Allows reports whether requests may go to hostport: a host name or
// address with an optional port ("api.example.com", "api.example.com:8443",
// "[::1]:8080"). Without a port, it reports whether the default port of
// http or of https is granted.
func (n *Network) Allows(hostport string) bool {
	g, err := parseGrant(hostport)
	if err != nil || strings.Contains(g.host, "*") {
		return false
	}
	if g.port != "" {
		return n.allowed(g.host, g.port, "")
	}
	return n.allowed(g.host, "80", "http") || n.allowed(g.host, "443", "https")
}

// CheckHostGrant reports whether s is a valid entry of
// [Network.AllowedHosts]: a host name, address or pattern, with an
// optional port from 1 to 65535; an IPv6 address with a port goes in
// brackets ("[::1]:8080").
func CheckHostGrant(s string) error {
	_, err := parseGrant(s)
	return err
}

// checkGrants reports the first invalid entry of AllowedHosts.
func (n *Network) checkGrants() error {
	for _, s := range n.AllowedHosts {
		if err := CheckHostGrant(s); err != nil {
			return err
		}
	}
	return nil
}

// hostGrant is one parsed entry of AllowedHosts.
type hostGrant struct {
	host string // lower case, no brackets, no trailing dot; may hold *
	port string // "" for the scheme's default port
}

func parseGrant(s string) (hostGrant, error) {
	orig := s
	s = strings.ToLower(strings.TrimSpace(s))
	bad := func(why string) (hostGrant, error) {
		return hostGrant{}, fmt.Errorf("allowed host %q: %s", orig, why)
	}
	if s == "" {
		return bad("empty")
	}
	if strings.ContainsAny(s, "/?#@ ") {
		return bad("want a host or host:port, not a URL")
	}
	var g hostGrant
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return bad("no ] after an IPv6 address")
		}
		g.host = s[1:end]
		switch rest := s[end+1:]; {
		case rest == "":
		case rest[0] == ':':
			g.port = rest[1:]
			if g.port == "" {
				return bad("empty port")
			}
		default:
			return bad("want [address]:port")
		}
	case strings.Count(s, ":") == 1:
		g.host, g.port, _ = strings.Cut(s, ":")
		if g.port == "" {
			return bad("empty port")
		}
	case strings.Count(s, ":") > 1:
		// A bare IPv6 address: it has no port.
		g.host = s
		if a, err := netip.ParseAddr(s); err != nil || a.Zone() != "" {
			return bad("an IPv6 address with a port goes in brackets, without a zone: [::1]:8080")
		}
	default:
		g.host = s
	}
	g.host = strings.TrimSuffix(g.host, ".")
	if g.host == "" {
		return bad("no host")
	}
	if _, err := path.Match(g.host, ""); err != nil {
		return bad("bad pattern")
	}
	if g.port != "" {
		if v, err := strconv.ParseUint(g.port, 10, 16); err != nil || v == 0 || strconv.FormatUint(v, 10) != g.port {
			return bad("the port must be a number from 1 to 65535")
		}
	}
	return g, nil
}

// defaultPort is the port a URL of scheme means when it names none.
func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// allowed reports whether host (lower case, no brackets) and port are
// granted; a grant without a port matches the default port of scheme, or
// of http or https when scheme is "".
func (n *Network) allowed(host, port, scheme string) bool {
	return matchGrants(n.AllowedHosts, host, port, scheme, n.Extism)
}

// matchGrants reports whether one of grants (AllowedHosts entries) names
// host and port; see [Network.allowed]. With anyPort (Extism's reading of
// a hyper-mcp file), a grant without a port matches every port.
func matchGrants(grants []string, host, port, scheme string, anyPort bool) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, s := range grants {
		g, err := parseGrant(s)
		if err != nil {
			continue
		}
		switch {
		case g.port == port:
		case g.port == "" && anyPort:
		case g.port == "" && scheme != "" && port == defaultPort(scheme):
		case g.port == "" && scheme == "" && (port == "80" || port == "443"):
		default:
			continue
		}
		if g.host == host {
			return true
		}
		// path.Match's * stops only at "/", which a host name never has:
		// "*.example.com" matches a.b.example.com, not example.com.
		if ok, _ := path.Match(g.host, host); ok {
			return true
		}
	}
	return false
}

// checkURL returns the *NetworkError refusing u, or nil if u's host and
// port are granted, or are in the ceiling (Ask) and the Asker in ctx
// grants them.
func (n *Network) checkURL(ctx context.Context, u *url.URL, redirect bool) error {
	host, port := strings.ToLower(strings.TrimSuffix(u.Hostname(), ".")), u.Port()
	if port == "" {
		port = defaultPort(u.Scheme)
	}
	if n.allowed(host, port, u.Scheme) {
		return nil
	}
	if ctx != nil && matchGrants(n.Ask, host, port, u.Scheme, false) {
		target := net.JoinHostPort(host, port)
		if !plainHost(host) {
			// A person reads the target: no look-alike or reordering
			// characters reach the question.
			return &NetworkError{Target: target, Redirect: redirect, Err: ErrHostNotGranted,
				Answer: fmt.Sprintf("host %q has characters other than ASCII letters, digits, '-' and '.', so no one is asked for it (write an international name in its xn-- form)", host)}
		}
		if !dnsLength(host) {
			// Nothing to reach, and a question of any length, the
			// ceiling's domain at its far end (a red team, stop 66).
			return &NetworkError{Target: cutString(target, 80), Redirect: redirect, Err: ErrHostNotGranted,
				Answer: fmt.Sprintf("host name of %d characters is no DNS name (at most 253, and 63 a label), so no one is asked for it", len(host))}
		}
		err := askGrant(ctx, GrantRequest{Kind: GrantNetwork, Target: target, Redirect: redirect})
		if err == nil {
			return nil
		}
		return &NetworkError{Target: target, Redirect: redirect, Err: ErrHostNotGranted, Answer: err.Error()}
	}
	missing := net.JoinHostPort(host, port)
	if port == defaultPort(u.Scheme) {
		missing = host
		if strings.Contains(host, ":") {
			missing = "[" + host + "]"
		}
	}
	// A host that is itself a private address (or localhost) needs
	// allow_private_networks too, refused only at dial time: said now,
	// so that the operator does not learn it on a second try.
	private := false
	if !n.AllowPrivate && !n.Extism {
		if a, err := netip.ParseAddr(host); err == nil && privateAddr(a) || host == "localhost" {
			private = true
		}
	}
	return &NetworkError{Target: net.JoinHostPort(host, port), Missing: missing, Redirect: redirect, Err: ErrHostNotGranted, granted: n.AllowedHosts, private: private}
}

// plainHost reports whether host (lower case, no brackets) is an IP
// address without a zone or a name of ASCII letters, digits, '-' and '.'
// only. An IPv6 zone ("%25..." in a URL) is any text the guest likes,
// spaces and reordering characters too, which a question would show the
// person as the target (a red team, stop 64).
func plainHost(host string) bool {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Zone() == ""
	}
	for _, c := range host {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return host != ""
}

// dnsLength reports whether host (no trailing dot), when a name, has
// the lengths of a DNS name: at most 253 characters, and 63 a label. An
// address always has.
func dnsLength(host string) bool {
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	if len(host) > 253 {
		return false
	}
	for l := range strings.SplitSeq(host, ".") {
		if len(l) > 63 {
			return false
		}
	}
	return true
}

// cutString cuts s to at most n bytes, marking the cut.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

var (
	// ErrHostNotGranted is matched by the error of a request, or of a
	// redirect hop, to a host and port no grant names.
	ErrHostNotGranted = errors.New("host not granted")
	// ErrAddressRefused is matched by the error of a request whose
	// connection would reach an address the grant does not allow (a
	// private one without AllowPrivate).
	ErrAddressRefused = errors.New("address not allowed")
)

// NetworkError is an http_request that the grant refused. The guest sees
// its message, which names the host and the grant that is missing; the
// host finds it with errors.As on the error of the call (a [TrapError]
// around a [HostCallError] around it), and it matches [ErrHostNotGranted]
// or [ErrAddressRefused] with errors.Is.
type NetworkError struct {
	// Target is the host and port the request or redirect hop went to:
	// "api.example.com:443", "[::1]:8080".
	Target string
	// Addr is the address refused when connecting (Err is
	// ErrAddressRefused), after DNS.
	Addr netip.Addr
	// Missing is what the operator would have to grant: an allowed_hosts
	// entry ("api.example.com", "127.0.0.1:18410"), or
	// "allow_private_networks".
	Missing string
	// Redirect is set when a redirect hop was refused.
	Redirect bool
	// Err is ErrHostNotGranted or ErrAddressRefused.
	Err error
	// Answer is why the [Asker] refused a host inside the ceiling
	// ([Network.Ask]); "" when no one was asked.
	Answer string

	granted []string
	private bool // the host is a private address: allow_private_networks too
}

func (e *NetworkError) Error() string {
	what := "request"
	if e.Redirect {
		what = "redirect"
	}
	if errors.Is(e.Err, ErrAddressRefused) {
		return fmt.Sprintf("%s to %s refused: %s is a loopback, private, link-local or metadata address, which needs allow_private_networks in the grant", what, e.Target, e.Addr)
	}
	if e.Answer != "" {
		return fmt.Sprintf("%s to %s refused: %s", what, e.Target, e.Answer)
	}
	also := ""
	if e.private {
		also = " and allow_private_networks = true (it is a loopback or private address)"
	}
	if len(e.granted) == 0 {
		return fmt.Sprintf("network access is not granted to this plugin: the %s to %s needs %q in allowed_hosts%s", what, e.Target, e.Missing, also)
	}
	return fmt.Sprintf("%s to %s refused: host %s is not granted to this plugin; it needs %q in allowed_hosts%s (granted: %s)", what, e.Target, e.Target, e.Missing, also, strings.Join(e.granted, ", "))
}

func (e *NetworkError) Unwrap() error { return e.Err }

// PrivateAddr reports whether ip is loopback, private, link-local,
// unspecified, multicast, carrier-grade NAT, another range where no
// public host is (RFC 6890), a cloud metadata address, or an IPv6 address
// that delivers to such an IPv4 address through NAT64, 6to4 or Teredo:
// what a grant without AllowPrivate never reaches. Plugin sources hold
// redirect hops to the same rule.
func PrivateAddr(ip netip.Addr) bool { return privateAddr(ip) }

// privateAddr is [PrivateAddr].
func privateAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if v4, ok := embeddedV4(ip); ok && privateAddr(v4) {
		return true
	}
	if ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast() ||
		ip == metadataV4 || ip == metadataV6 {
		return true
	}
	for _, p := range nonPublic {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

var (
	metadataV4 = netip.MustParseAddr("169.254.169.254")
	metadataV6 = netip.MustParseAddr("fd00:ec2::254")
	// nonPublic are the ranges, beyond the standard library's classes,
	// where no public host is (RFC 6890's special-purpose registries).
	nonPublic = []netip.Prefix{
		netip.MustParsePrefix("0.0.0.0/8"),      // "this network": Linux reaches the host itself
		netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT
		netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
		netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
		netip.MustParsePrefix("240.0.0.0/4"),    // reserved, and the broadcast address
		netip.MustParsePrefix("64:ff9b:1::/48"), // NAT64 for local use (RFC 8215): the network's own translator
		netip.MustParsePrefix("fec0::/10"),      // site-local, deprecated but routed by some
	}
	nat64     = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052's well-known prefix
	sixToFour = netip.MustParsePrefix("2002::/16")
	teredo    = netip.MustParsePrefix("2001::/32")
)

// embeddedV4 returns the IPv4 address an IPv6 address delivers to through
// a translator or tunnel: NAT64's well-known prefix (its last 32 bits),
// 6to4 (bits 16 to 47), Teredo (the client's address, its last 32 bits
// inverted) and the deprecated IPv4-compatible form (::a.b.c.d). A NAT64
// gateway on the host's network takes 64:ff9b::a9fe:a9fe to the
// metadata address.
func embeddedV4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case nat64.Contains(ip):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	case teredo.Contains(ip):
		return netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}), true
	case [12]byte(b[:12]) == [12]byte{} && !ip.IsLoopback() && !ip.IsUnspecified():
		return netip.AddrFrom4([4]byte(b[12:16])), true
	}
	return netip.Addr{}, false
}

// namesPrivate reports whether, under Extism's reading of the grant,
// target (the host:port a request named) names addr explicitly: target's
// host is an address literal equal to addr, or "localhost" with addr a
// loopback address, and a grant names that host without a pattern.
// Metadata addresses are never named this way.
func (n *Network) namesPrivate(target string, addr netip.Addr) bool {
	if !n.Extism {
		return false
	}
	addr = addr.Unmap()
	if addr == netip.MustParseAddr("169.254.169.254") || addr == netip.MustParseAddr("fd00:ec2::254") {
		return false
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return false
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" {
		if !addr.IsLoopback() {
			return false
		}
	} else if a, err := netip.ParseAddr(host); err != nil || a.Unmap() != addr {
		return false
	}
	for _, s := range n.AllowedHosts {
		if g, err := parseGrant(s); err == nil && g.host == host {
			return true
		}
	}
	return false
}

// Limits of the connection pool each compiled plugin keeps for its
// instances' requests.
const (
	netIdleTimeout    = 30 * time.Second // an idle connection is closed after this
	netMaxIdle        = 8                // idle connections kept, all hosts
	netMaxIdlePerHost = 2                // idle connections kept per host
	netMaxHeaderBytes = 64 << 10
	netDefaultTimeout = 10 * time.Second
	netMaxRedirects   = 5
)

// netClient is the HTTP client of one compiled plugin, shared by its
// instances, so that discarding an instance leaves no connection behind:
// idle connections are pooled (a few, for a while), and closed with the
// plugin. The zero value is ready; it makes the client on first use.
type netClient struct {
	mu        sync.Mutex
	client    *http.Client
	transport *http.Transport
	closed    bool
}

// get returns the client for grant n, made on the first call. It fails
// once the plugin is closed.
func (c *netClient) get(n *Network) (*http.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.client == nil {
		c.client, c.transport = n.newClient()
	}
	return c.client, nil
}

// close closes the pool's connections; requests after it fail.
func (c *netClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
}

// newClient returns an HTTP client for the grant. It checks the host and
// port of every hop against the grant, and every address it connects to
// (after DNS) against the private ranges.
func (n *Network) newClient() (*http.Client, *http.Transport) {
	timeout := n.Timeout
	if timeout <= 0 {
		timeout = netDefaultTimeout
	}
	dial := func(ctx context.Context, network, target string) (net.Conn, error) {
		d := &net.Dialer{
			Timeout: timeout,
			// Control runs on the resolved address, right before
			// connecting: DNS rebinding cannot slip a private address
			// past it.
			Control: func(_, address string, _ syscall.RawConn) error {
				ap, err := netip.ParseAddrPort(address)
				if err != nil {
					return &NetworkError{Target: target, Missing: "allow_private_networks", Err: ErrAddressRefused}
				}
				if !n.AllowPrivate && privateAddr(ap.Addr()) && !n.namesPrivate(target, ap.Addr()) {
					return &NetworkError{Target: target, Addr: ap.Addr(), Missing: "allow_private_networks", Err: ErrAddressRefused}
				}
				return nil
			},
		}
		c, err := d.DialContext(ctx, network, target)
		if err != nil {
			return nil, err
		}
		return trackGuestConn(c), nil
	}
	tr := &http.Transport{
		DialContext:            dial,
		Proxy:                  nil, // a proxy would hide the address from the check
		TLSHandshakeTimeout:    timeout,
		ResponseHeaderTimeout:  timeout,
		MaxResponseHeaderBytes: netMaxHeaderBytes,
		IdleConnTimeout:        netIdleTimeout,
		MaxIdleConns:           netMaxIdle,
		MaxIdleConnsPerHost:    netMaxIdlePerHost,
	}
	return &http.Client{
		Timeout:   timeout,
		Transport: tr,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= netMaxRedirects {
				return fmt.Errorf("more than %d redirects", netMaxRedirects)
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to scheme %q", req.URL.Scheme)
			}
			return n.checkURL(req.Context(), req.URL, true)
		},
	}, tr
}

// guestConns holds the connections guests' requests opened on loopback
// (http_request, get_access_token), by their two ends, while they are
// open: to a server of this process such a peer is a guest acting on some
// tenant's behalf, not someone on this machine ([GuestPeer]).
var guestConns sync.Map // guestEnds -> struct{}

type guestEnds struct{ local, remote netip.AddrPort }

// endsOf returns c's two ends, and whether its local one is loopback.
func endsOf(local, remote net.Addr) (guestEnds, bool) {
	l, err1 := netip.ParseAddrPort(local.String())
	r, err2 := netip.ParseAddrPort(remote.String())
	if err1 != nil || err2 != nil {
		return guestEnds{}, false
	}
	e := guestEnds{netip.AddrPortFrom(l.Addr().Unmap(), l.Port()), netip.AddrPortFrom(r.Addr().Unmap(), r.Port())}
	return e, e.local.Addr().IsLoopback()
}

// trackGuestConn registers c in guestConns until it is closed, if it is
// a loopback connection.
func trackGuestConn(c net.Conn) net.Conn {
	e, loopback := endsOf(c.LocalAddr(), c.RemoteAddr())
	if !loopback {
		return c
	}
	guestConns.Store(e, struct{}{})
	return &guestConn{Conn: c, ends: e}
}

type guestConn struct {
	net.Conn
	ends guestEnds
	once sync.Once
}

func (c *guestConn) Close() error {
	c.once.Do(func() { guestConns.Delete(c.ends) })
	return c.Conn.Close()
}

// GuestPeer reports whether a connection a server of this process
// accepted, with peer (its remote address, as http.Request.RemoteAddr
// gives it) and local (its own address, http.LocalAddrContextKey), is one
// a guest opened and has not closed: a request on it comes from a plugin,
// on behalf of whoever called it, though its peer is loopback.
func GuestPeer(peer string, local net.Addr) bool {
	if local == nil {
		return false
	}
	p, err := netip.ParseAddrPort(peer)
	if err != nil {
		return false
	}
	e, loopback := endsOf(net.TCPAddrFromAddrPort(p), local)
	if !loopback {
		return false
	}
	_, ok := guestConns.Load(e)
	return ok
}

// httpRequest is the Extism http_request request.
type httpRequest struct {
	URL     string            `json:"url"`
	Method  string            `json:"method"`
	Headers map[string]string `json:"headers"`
}

// doHTTP serves http_request: it makes the request on the guest's behalf
// and returns the body; the status and headers are kept for
// http_status_code and http_headers.
func (i *Instance) doHTTP(ctx context.Context, reqJSON, body []byte) ([]byte, error) {
	n := &i.compiled.policy.network
	var r httpRequest
	if err := json.Unmarshal(reqJSON, &r); err != nil {
		return nil, fmt.Errorf("request is not the expected JSON: %v", err)
	}
	if r.Method == "" {
		r.Method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, strings.ToUpper(r.Method), r.URL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("bad request: %v", err)
	}
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return nil, fmt.Errorf("scheme %q is not allowed: use http or https", req.URL.Scheme)
	}
	if err := n.checkURL(ctx, req.URL, false); err != nil {
		return nil, err
	}
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	client, err := i.compiled.net.get(n)
	if err != nil {
		return nil, err
	}
	// The trace goes on into the service: a client span, and its
	// traceparent in the request (replacing one the guest set). Only the
	// host and port are recorded: a URL's path and query can hold secrets.
	sctx, span := telemetry.StartClient(ctx, req.Method,
		attribute.String("http.request.method", req.Method),
		attribute.String("server.address", req.URL.Hostname()),
		attribute.String("url.scheme", req.URL.Scheme))
	telemetry.Inject(sctx, req.Header)
	resp, err := client.Do(req.WithContext(sctx))
	if err == nil {
		span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	}
	telemetry.End(span, err)
	if err != nil {
		var ne *NetworkError
		if errors.As(err, &ne) {
			return nil, ne // the grant's refusal, matchable by the host
		}
		return nil, fmt.Errorf("request failed: %v", err)
	}
	defer resp.Body.Close()
	limit := n.MaxResponse
	if limit <= 0 {
		limit = 4 << 20
	}
	out, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading the response: %v", err)
	}
	if int64(len(out)) > limit {
		return nil, fmt.Errorf("response body is over the %d-byte limit", limit)
	}
	i.kernel.httpStatus = resp.StatusCode
	h := map[string]string{}
	for k := range resp.Header {
		h[k] = resp.Header.Get(k)
	}
	i.kernel.httpHeaders, _ = json.Marshal(h)
	return out, nil
}

// HTTPClient returns the client through which the plugin's own requests
// go, for a request the host makes on the plugin's behalf to rawURL (such
// as an OAuth token request): the same grant applies, to rawURL and to
// every redirect hop and address. The error is a [*NetworkError] when the
// grant refuses rawURL.
func (c *Compiled) HTTPClient(rawURL string) (*http.Client, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("bad URL: %v", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("scheme %q is not allowed: use http or https", u.Scheme)
	}
	n := &c.policy.network
	if err := n.checkURL(nil, u, false); err != nil { // no one is asked for the host's own requests
		return nil, err
	}
	return c.net.get(n)
}
