package host

import (
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
)

// A URL question's ID is refused past maxElicitationID bytes: IDs are
// remembered until completed, and a completion of a longer one is
// refused anyway. Before stop 57 an issued ID had no bound but the host
// function's 1 MiB input.
func TestElicitationIDBounded(t *testing.T) {
	r := abi.ElicitRequest{Mode: "url", Message: "Sign in", URL: "https://example.com/", ElicitationID: strings.Repeat("i", maxElicitationID)}
	if _, _, err := elicitParams(r); err != nil {
		t.Fatalf("an ID of %d bytes: %v", maxElicitationID, err)
	}
	r.ElicitationID += "i"
	if _, _, err := elicitParams(r); err == nil || !strings.Contains(err.Error(), "over the 256-byte limit") {
		t.Fatalf("an ID of %d bytes: %v; want it refused", len(r.ElicitationID), err)
	}
}
