package host

import (
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// metrics are the host's Prometheus metrics, in a registry of the host's
// own (no package-level state: two hosts in one process do not share them).
type metrics struct {
	reg       *prometheus.Registry
	live      *prometheus.GaugeVec
	created   *prometheus.CounterVec
	evictions *prometheus.CounterVec
	resets    *prometheus.CounterVec
	calls     *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	series    sync.Map // [2]string{plugin, outcome} → calls' series; plugin → duration's
	// The state store (internal/durable).
	adopted     prometheus.Counter
	storeLost   prometheus.Counter
	checkpoints *prometheus.CounterVec
	ckptTime    prometheus.Histogram
	ckptBytes   prometheus.Histogram
	notSaved    *prometheus.CounterVec
	storeOps    *prometheus.HistogramVec
	claims      *prometheus.CounterVec
	// Refusals by reason and by tenant kind (trace.go sees each).
	refusals *prometheus.CounterVec
	// Idle HTTP sessions ended to make room (sessionBook).
	sessionsEvicted prometheus.Counter
	// Requests refused by the bound on request bodies (bodies.go), by
	// the bound met.
	bodiesRefused *prometheus.CounterVec
	// Connections refused at the listener's bound, and the open ones it
	// counts (connlimit.go; 0 without one).
	connsRefused prometheus.Counter
	connsOpen    atomic.Pointer[func() int64]
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		live: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "wasmtools_instances_live", Help: "Plugin instances alive now.",
		}, []string{"plugin"}),
		created: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_instances_created_total", Help: "Plugin instances created.",
		}, []string{"plugin"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_instance_evictions_total", Help: "Instances evicted (idle, or waiting for a person) to make room under the instance limits.",
		}, []string{"plugin"}),
		resets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_instance_resets_total", Help: "Instances discarded, by reason (trap, timeout, cancelled, upgrade, evicted).",
		}, []string{"plugin", "reason"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_calls_total", Help: "Tool calls, by outcome (ok, tool_error, refused).",
		}, []string{"plugin", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wasmtools_call_duration_seconds", Help: "Tool call duration, host side.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5, 30},
		}, []string{"plugin"}),
		adopted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasmtools_sessions_adopted_total", Help: "Sessions taken over from the state store (served before by another replica, or by this one before a restart).",
		}),
		storeLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasmtools_store_lost_total", Help: "Session records the state store lost (it came back empty, or evicted them) that this replica wrote back.",
		}),
		checkpoints: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_checkpoints_total", Help: "Instance states written to the state store, by outcome (ok, fenced, error).",
		}, []string{"outcome"}),
		ckptTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wasmtools_checkpoint_write_seconds", Help: "Time to write one instance state to the state store.",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1},
		}),
		ckptBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "wasmtools_checkpoint_bytes", Help: "Size of one instance state as written to the state store (before sealing).",
			Buckets: prometheus.ExponentialBuckets(256, 4, 10),
		}),
		notSaved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_not_saved_total", Help: "Call results marked notSaved (their state change not durably checkpointed), by reason (store-unavailable, too-large, over-budget, moved, cannot-snapshot, unverified).",
		}, []string{"reason"}),
		storeOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "wasmtools_store_op_seconds", Help: "Exchanges with the state store, by operation and outcome (ok, not_found, fenced, held, leased, lost, too_large, budget, timeout, error).",
			Buckets: []float64{.0001, .0005, .001, .005, .01, .05, .1, .5, 1, 5},
		}, []string{"op", "outcome"}),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_claims_total", Help: "Claims of sessions in the state store, by outcome (ok; held: a live replica holds it; leased: another replica's lease on it, waited out; lost: the store forgot it; timeout, error).",
		}, []string{"outcome"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_refusals_total", Help: "Requests refused with one of wasmtools' codes, by reason (busy, at_capacity, state_unavailable, shutting_down, ...) and tenant (subject: an authenticated client; anonymous).",
		}, []string{"reason", "tenant"}),
		sessionsEvicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasmtools_http_sessions_evicted_total", Help: "Idle stateful HTTP sessions ended to make room for a new one under --max-sessions or a tenant's share of it.",
		}),
		bodiesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "wasmtools_request_bodies_refused_total", Help: "HTTP requests refused with 503 after waiting 2 s for room under the bound on request bodies read at once (not those whose client hung up meanwhile), by the bound met (total: limits.request_bytes_total; per_subject: limits.request_bytes_per_subject).",
		}, []string{"reason"}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "wasmtools_http_connections_refused_total", Help: "HTTP connections answered 503 and closed as they were accepted, the server holding --max-connections (http.max_connections) already.",
		}),
	}
	connsOpen := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "wasmtools_http_connections", Help: "HTTP connections open now, under --max-connections (http.max_connections).",
	}, func() float64 {
		if f := m.connsOpen.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	for _, bound := range []string{boundTotal, boundShare} {
		m.bodiesRefused.WithLabelValues(bound) // exported at 0 from the start, for rate() and alerts
	}
	m.reg.MustRegister(m.live, m.created, m.evictions, m.resets, m.calls, m.duration, m.adopted, m.storeLost, m.checkpoints, m.ckptTime, m.ckptBytes,
		m.notSaved, m.storeOps, m.claims, m.refusals, m.sessionsEvicted, m.bodiesRefused, m.connsRefused, connsOpen,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// setConnections makes open the source of wasmtools_http_connections.
func (m *metrics) setConnections(open func() int64) { m.connsOpen.Store(&open) }

func (m *metrics) call(plugin, outcome string, d time.Duration) {
	m.callsOf(plugin, outcome).Inc()
	m.durationOf(plugin).Observe(d.Seconds())
}

// callsOf and durationOf return a plugin's series of the calls' metrics,
// looked up at their first use and kept: WithLabelValues hashes and
// checks its labels and takes a lock at every call, about 0.3 µs of each
// call for the two series. The series are never deleted, so those kept
// stay the registry's.
func (m *metrics) callsOf(plugin, outcome string) prometheus.Counter {
	key := [2]string{plugin, outcome}
	if c, ok := m.series.Load(key); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.series.LoadOrStore(key, m.calls.WithLabelValues(plugin, outcome))
	return c.(prometheus.Counter)
}

func (m *metrics) durationOf(plugin string) prometheus.Observer {
	if o, ok := m.series.Load(plugin); ok {
		return o.(prometheus.Observer)
	}
	o, _ := m.series.LoadOrStore(plugin, m.duration.WithLabelValues(plugin))
	return o.(prometheus.Observer)
}

func (m *metrics) checkpoint(d time.Duration, n int, err error) {
	switch {
	case err == nil:
		m.checkpoints.WithLabelValues("ok").Inc()
		m.ckptTime.Observe(d.Seconds())
		m.ckptBytes.Observe(float64(n))
	case errors.Is(err, statestore.ErrFenced):
		m.checkpoints.WithLabelValues("fenced").Inc()
	default:
		m.checkpoints.WithLabelValues("error").Inc()
	}
}

// MetricsHandler serves the host's metrics in the Prometheus text format:
// live instances, instances created, evictions, resets, calls and call
// duration, per plugin. wasmtools mounts it at /metrics in HTTP mode.
func (h *Host) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(h.metrics.reg, promhttp.HandlerOpts{})
}

// The host's metrics are the session layer's observer.

func (m *metrics) InstanceStarted(plugin string) {
	m.created.WithLabelValues(plugin).Inc()
	m.live.WithLabelValues(plugin).Inc()
}

func (m *metrics) InstanceClosed(plugin string) { m.live.WithLabelValues(plugin).Dec() }

func (m *metrics) InstanceReset(plugin, reason string) {
	m.resets.WithLabelValues(plugin, reason).Inc()
	if reason == "evicted" {
		m.evictions.WithLabelValues(plugin).Inc()
	}
}
