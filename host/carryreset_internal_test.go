package host

import (
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// TestCarryReset: a call run again (its first attempt ran on a stale
// instance) answers with the reset its first attempt's lease carried, if
// its own has none; its own reset wins, and no reset is made up.
func TestCarryReset(t *testing.T) {
	lost := &sessions.Reset{Reason: "store-lost"}
	evicted := &sessions.Reset{Reason: "evicted"}
	for _, c := range []struct {
		n, prev sessions.Notice
		want    *sessions.Reset
	}{
		{sessions.Notice{}, sessions.Notice{}, nil},
		{sessions.Notice{}, sessions.Notice{Reset: lost}, lost},
		{sessions.Notice{Reset: evicted}, sessions.Notice{Reset: lost}, evicted},
		{sessions.Notice{Reset: evicted}, sessions.Notice{}, evicted},
	} {
		if got := carryReset(c.n, c.prev).Reset; got != c.want {
			t.Errorf("carryReset(%+v, %+v) = %+v, want %+v", c.n, c.prev, got, c.want)
		}
	}
}
