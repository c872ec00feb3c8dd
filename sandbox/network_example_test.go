package sandbox_test

import (
	"fmt"

	"github.com/wasmtools/wasmtools/sandbox"
)

// A grant names a host, and a port unless it is the scheme's default.
func ExampleNetwork_Allows() {
	n := &sandbox.Network{AllowedHosts: []string{"api.example.com", "*.example.org:8443", "127.0.0.1:18409", "[::1]:8080"}}
	for _, hostport := range []string{"api.example.com", "api.example.com:8080", "a.example.org:8443", "127.0.0.1:18409", "127.0.0.1:18410", "[::1]:8080"} {
		fmt.Println(hostport, n.Allows(hostport))
	}
	fmt.Println(sandbox.CheckHostGrant("::1:8080:x"))
	// Output:
	// api.example.com true
	// api.example.com:8080 false
	// a.example.org:8443 true
	// 127.0.0.1:18409 true
	// 127.0.0.1:18410 false
	// [::1]:8080 true
	// allowed host "::1:8080:x": an IPv6 address with a port goes in brackets, without a zone: [::1]:8080
}
