package host_test

import (
	"fmt"
	"io"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestOperatorMetrics checks the series DEPLOY.md's "What to alert on"
// names, on two replicas sharing a store: the store's exchanges by
// operation and outcome, claims, takeovers, checkpoints, and the gauges of
// handles, parked calls and tasks.
func TestOperatorMetrics(t *testing.T) {
	a, b, rt := twoReplicas(t)
	cs := connectHTTP(t, a.srv.URL, "2025-11-25", rt)
	for i := range 3 {
		if res := call(t, cs, "note_add", map[string]any{"text": fmt.Sprint("note ", i)}); res.IsError {
			t.Fatal(text(res))
		}
	}
	a.gone()
	rt.point(b)
	if res := notes(t, cs, nil); res.IsError || !strings.Contains(text(res), "note 2") {
		t.Fatalf("after the move: %s", text(res))
	}
	ma, mb := scrape(a), scrape(b)
	for _, c := range []struct {
		metrics, series string
		min             float64
	}{
		{ma, `wasmtools_claims_total{outcome="ok"}`, 1},
		{ma, `wasmtools_store_op_seconds_count{op="put",outcome="ok"}`, 3},
		{ma, `wasmtools_store_op_seconds_count{op="claim",outcome="ok"}`, 1},
		{ma, `wasmtools_checkpoints_total{outcome="ok"}`, 3},
		{mb, `wasmtools_sessions_adopted_total`, 1},
		{mb, `wasmtools_store_op_seconds_count{op="get",outcome="ok"}`, 1},
		{mb, `wasmtools_session_handles`, 0},
		{mb, `wasmtools_parked_calls`, 0},
		{mb, `wasmtools_tasks`, 0},
	} {
		if v := seriesValue(t, c.metrics, c.series); v < c.min {
			t.Errorf("%s = %v, want at least %v", c.series, v, c.min)
		}
	}
}

// scrape is r's /metrics, as an operator reads it.
func scrape(r *replica) string {
	rec := httptest.NewRecorder()
	r.h.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return string(body)
}

// seriesValue is series' value in metrics (scrape's), failing t if it
// is not there.
func seriesValue(t *testing.T, metrics, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(metrics)
	if m == nil {
		t.Fatalf("no series %s in:\n%s", series, metrics)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}
