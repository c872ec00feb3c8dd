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
	"path"
	"strings"
	"syscall"
	"time"
)

// Network is what a plugin may reach with the Extism http_request import.
// The zero value reaches nothing.
type Network struct {
	// AllowedHosts are host names, or patterns with * (matching any run of
	// characters, dots included: "*.example.com"), that requests and each
	// redirect hop may go to.
	AllowedHosts []string
	// AllowPrivate lets requests reach loopback, private (RFC 1918, ULA),
	// link-local and cloud metadata addresses. Without it they are refused
	// when the connection is made, whatever the name resolved to, so a
	// granted name that resolves (or is rebound) to 127.0.0.1 or
	// 169.254.169.254 reaches nothing.
	AllowPrivate bool
	// MaxResponse bounds a response body; 0 means 4 MiB. Timeout bounds a
	// request (redirects included); 0 means 10s. The call's own deadline
	// applies too.
	MaxResponse int64
	Timeout     time.Duration
}

// WithNetwork grants network access through the http_request import.
func (p Policy) WithNetwork(n Network) Policy {
	n.AllowedHosts = append([]string(nil), n.AllowedHosts...)
	p.network = n
	return p
}

// Allows reports whether requests may go to host.
func (n *Network) Allows(host string) bool { return n.hostAllowed(host) }

// hostAllowed reports whether host matches one of the patterns.
func (n *Network) hostAllowed(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, pat := range n.AllowedHosts {
		pat = strings.ToLower(pat)
		if pat == host {
			return true
		}
		// path.Match's * stops only at "/", which a host name never has:
		// "*.example.com" matches a.b.example.com, not example.com.
		if ok, _ := path.Match(pat, host); ok {
			return true
		}
	}
	return false
}

// ErrAddressRefused is matched by the error of a request whose connection
// would reach an address the grant does not allow.
var ErrAddressRefused = errors.New("address not allowed")

// privateAddr reports whether ip is loopback, private, link-local,
// unspecified, multicast or a cloud metadata address.
func privateAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	return ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() ||
		ip.IsUnspecified() || ip.IsMulticast() || ip.IsInterfaceLocalMulticast() ||
		ip == netip.MustParseAddr("169.254.169.254") || ip == netip.MustParseAddr("fd00:ec2::254") ||
		netip.MustParsePrefix("100.64.0.0/10").Contains(ip) // carrier-grade NAT
}

// client returns the HTTP client of a grant. It checks the host of every
// hop against the allowlist, and every address it connects to (after DNS)
// against the private ranges.
func (n *Network) client() *http.Client {
	timeout := n.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	dialer := &net.Dialer{
		Timeout: timeout,
		// Control runs on the resolved address, right before connecting:
		// DNS rebinding cannot slip a private address past it.
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return fmt.Errorf("%w: %s", ErrAddressRefused, address)
			}
			if !n.AllowPrivate && privateAddr(ap.Addr()) {
				return fmt.Errorf("%w: %s is a loopback, private, link-local or metadata address (the grant does not allow private networks)", ErrAddressRefused, ap.Addr())
			}
			return nil
		},
	}
	return &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			DialContext:            dialer.DialContext,
			Proxy:                  nil, // a proxy would hide the address from the check
			ResponseHeaderTimeout:  timeout,
			MaxResponseHeaderBytes: 64 << 10,
		},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			if !n.hostAllowed(req.URL.Hostname()) {
				return fmt.Errorf("redirect to host %q, which is not granted", req.URL.Hostname())
			}
			if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to scheme %q", req.URL.Scheme)
			}
			return nil
		},
	}
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
	if len(n.AllowedHosts) == 0 {
		return nil, fmt.Errorf("network access is not granted to this plugin (no allowed hosts; the operator grants hosts with allowed_hosts)")
	}
	if !n.hostAllowed(req.URL.Hostname()) {
		return nil, fmt.Errorf("host %q is not granted to this plugin (allowed: %s)", req.URL.Hostname(), strings.Join(n.AllowedHosts, ", "))
	}
	for k, v := range r.Headers {
		req.Header.Set(k, v)
	}
	if i.httpClient == nil {
		i.httpClient = n.client()
	}
	resp, err := i.httpClient.Do(req)
	if err != nil {
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
