package host

import (
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/abi"
)

// TestGuestCannotUseTheHostsInputKeys: a 2026-07-28 client is told a
// grant question by its input key, wasmtools.grant (docs/ABI.md), as it
// is told the host's _meta by dev.wasmtools/: a guest's own question,
// alone or in a batch, is never put under a key of the host's.
func TestGuestCannotUseTheHostsInputKeys(t *testing.T) {
	if k := inputKey(abi.ElicitRequest{Message: "m", ElicitationID: grantInputKey}); strings.HasPrefix(k, "wasmtools.") {
		t.Errorf("a guest's question is asked under the host's key %q", k)
	}
	q, err := batchQuestion([]byte(`{"inputRequests":{"` + grantInputKey + `":{"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object","properties":{}}}}}}`))
	if err == nil {
		t.Errorf("a guest's batch is asked under the host's key: %q", q.key)
	}
}
