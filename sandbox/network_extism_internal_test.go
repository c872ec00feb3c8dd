package sandbox

import (
	"net/netip"
	"testing"
)

// TestNetworkExtism: under Extism's reading an entry without a port grants
// every port, and only an entry that names an address (or localhost)
// itself lets a request to that private address through.
func TestNetworkExtism(t *testing.T) {
	n := &Network{AllowedHosts: []string{"127.0.0.1", "localhost", "*.internal", "api.example.com:8443", "169.254.169.254"}, Extism: true}
	for _, tt := range []struct {
		hostport string
		want     bool
	}{
		{"127.0.0.1:23422", true}, {"localhost:1", true}, {"a.internal:9000", true},
		{"api.example.com:8443", true}, {"api.example.com:443", false}, {"example.com:80", false},
	} {
		if got := n.Allows(tt.hostport); got != tt.want {
			t.Errorf("Allows(%s) = %v, want %v", tt.hostport, got, tt.want)
		}
	}
	strict := &Network{AllowedHosts: n.AllowedHosts}
	if strict.Allows("127.0.0.1:23422") {
		t.Error("without Extism, a grant without a port granted port 23422")
	}
	lo := netip.MustParseAddr("127.0.0.1")
	for _, tt := range []struct {
		target string
		addr   netip.Addr
		want   bool
	}{
		{"127.0.0.1:23422", lo, true},
		{"localhost:80", lo, true},
		{"localhost:80", netip.MustParseAddr("10.0.0.1"), false},  // localhost that is not loopback
		{"a.internal:80", netip.MustParseAddr("10.0.0.1"), false}, // a name resolving to a private address
		{"127.0.0.2:80", netip.MustParseAddr("127.0.0.2"), false}, // not named
		{"169.254.169.254:80", netip.MustParseAddr("169.254.169.254"), false},
	} {
		if got := n.namesPrivate(tt.target, tt.addr); got != tt.want {
			t.Errorf("namesPrivate(%s, %s) = %v, want %v", tt.target, tt.addr, got, tt.want)
		}
	}
	if strict.namesPrivate("127.0.0.1:80", lo) {
		t.Error("without Extism, a named address passed the private check")
	}
}
