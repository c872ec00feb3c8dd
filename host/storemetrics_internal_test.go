package host

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// TestStoreOutcomesDocumented checks that every outcome label of the
// store's metrics is named where an operator reads them: DEPLOY.md's
// table of what to alert on, and the metrics' help, so that an alert or a
// dashboard written from them sees every series.
func TestStoreOutcomesDocumented(t *testing.T) {
	errs := []error{nil, statestore.ErrNotFound, statestore.ErrFenced, statestore.ErrHeld, statestore.ErrLeased,
		statestore.ErrStoreLost, statestore.ErrTooLarge, &statestore.BudgetError{}, context.DeadlineExceeded, errors.New("connection reset")}
	doc, err := os.ReadFile("../docs/DEPLOY.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `wasmtools_store_op_seconds\\{op,outcome\\}` \\|[^|]*\\|").Find(doc)
	if row == nil {
		t.Fatal("DEPLOY.md has no row for wasmtools_store_op_seconds")
	}
	m := newMetrics()
	help := func(name string) string {
		mfs, _ := m.reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetHelp()
			}
		}
		return ""
	}
	// Gather lists a vector only once it has a series.
	m.storeOps.WithLabelValues("get", "ok")
	m.claims.WithLabelValues("ok")
	for _, err := range errs {
		outcome := storeOutcome(err)
		if !strings.Contains(string(row), "`"+outcome+"`") {
			t.Errorf("DEPLOY.md's wasmtools_store_op_seconds row does not name outcome %q (of %v)", outcome, err)
		}
		if h := help("wasmtools_store_op_seconds"); !strings.Contains(h, outcome) {
			t.Errorf("wasmtools_store_op_seconds' help %q does not name outcome %q", h, outcome)
		}
	}
	for _, outcome := range []string{"ok", "held", "leased", "lost", "timeout", "error"} {
		if h := help("wasmtools_claims_total"); !strings.Contains(h, outcome) {
			t.Errorf("wasmtools_claims_total's help %q does not name outcome %q", h, outcome)
		}
	}
}
