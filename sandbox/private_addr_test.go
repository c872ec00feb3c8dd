package sandbox_test

import (
	"net/netip"
	"testing"

	"github.com/wasmtools/wasmtools/sandbox"
)

// TestPrivateAddrEmbedded: an IPv6 address that carries an IPv4 address a
// translator or tunnel delivers to (NAT64's prefixes, 6to4, Teredo, the
// old IPv4-compatible form) is as private as the IPv4 address it
// carries, and so are the IPv4 ranges no public host is on: a grant
// without allow_private_networks reached the metadata address as
// 64:ff9b::a9fe:a9fe on a network with a NAT64 gateway.
func TestPrivateAddrEmbedded(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		private bool
	}{
		{"64:ff9b::a9fe:a9fe", true},                   // NAT64, 169.254.169.254
		{"64:ff9b::7f00:1", true},                      // NAT64, 127.0.0.1
		{"64:ff9b::a00:1", true},                       // NAT64, 10.0.0.1
		{"64:ff9b::808:808", false},                    // NAT64, 8.8.8.8
		{"64:ff9b:1::a00:1", true},                     // NAT64 local use (RFC 8215): the network's own translator
		{"2002:a9fe:a9fe::1", true},                    // 6to4, 169.254.169.254
		{"2002:c0a8:101::1", true},                     // 6to4, 192.168.1.1
		{"2002:808:808::1", false},                     // 6to4, 8.8.8.8
		{"2001:0:4136:e378:8000:63bf:80ff:fffe", true}, // Teredo, client 127.0.0.1 (XORed)
		{"::7f00:1", true},                             // IPv4-compatible, 127.0.0.1
		{"::ffff:127.0.0.1", true},                     // IPv4-mapped
		{"0.1.2.3", true},                              // "this network"
		{"192.0.0.170", true},                          // IETF protocol assignments
		{"198.18.0.1", true},                           // benchmarking
		{"240.0.0.1", true},                            // reserved
		{"255.255.255.255", true},                      // broadcast
		{"8.8.8.8", false},
		{"2606:4700::1111", false},
	} {
		if got := sandbox.PrivateAddr(netip.MustParseAddr(tc.addr)); got != tc.private {
			t.Errorf("PrivateAddr(%s) = %v, want %v", tc.addr, got, tc.private)
		}
	}
}
