// Package telemetry is wasmtools' tracing: OpenTelemetry spans for what a
// request costs (the MCP request, waiting for a slot, the guest's run, each
// host function that goes outside, checkpoints, loads), W3C trace context in
// and out, and trace IDs on log lines.
//
// Tracing is off unless [Setup] finds an exporter in the standard OTEL_*
// environment variables. Off, every function here works on OpenTelemetry's
// no-op provider: a span start is a few nanoseconds and allocates nothing
// that outlives the call, so call sites need no "if enabled" of their own.
//
// What goes into attributes is decided here and in the host: names of
// methods, tools and plugins, digests of session IDs and handles, outcomes
// and error types. Never a guest's arguments, results, questions, URLs'
// paths or secrets: there is no setting that puts them in.
package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// instrumentation is the tracer's name: wasmtools' module path.
const instrumentation = "github.com/wasmtools/wasmtools"

// propagator is W3C trace context and baggage, what SEP-414 carries in
// `_meta` and HTTP requests carry in headers. It is set globally by Setup
// too, so that libraries that read the global one agree.
var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Settings is what [Setup] read from the environment.
type Settings struct {
	// Enabled: an exporter was configured.
	Enabled bool
	// Endpoint is where spans go, as the OTLP exporter will use it (for
	// the log line at start).
	Endpoint string
}

// Setup installs the global tracer provider that the OTEL_* environment
// variables describe, read through getenv (only cmd/ reads the environment):
//
//   - OTEL_TRACES_EXPORTER: "otlp" turns tracing on (the default when an
//     OTLP endpoint is set), "none" keeps it off.
//   - OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: the
//     collector (Jaeger, an OpenTelemetry Collector); with neither, tracing
//     stays off.
//   - OTEL_EXPORTER_OTLP_PROTOCOL: only "http/protobuf" (the default) is
//     supported; "grpc" is refused, not silently ignored.
//   - OTEL_SDK_DISABLED=true keeps everything off.
//   - OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and
//     the exporter's own headers, timeout and TLS variables are read by the
//     OpenTelemetry SDK itself.
//
// The returned shutdown flushes spans still buffered; call it before exit.
// With tracing off it does nothing.
func Setup(ctx context.Context, getenv func(string) string, service, version string) (Settings, func(context.Context) error, error) {
	noop := func(context.Context) error { return nil }
	var s Settings
	otel.SetTextMapPropagator(propagator)
	if err := SetClientContext(getenv("WASMTOOLS_TRACE_CLIENTS")); err != nil {
		return s, noop, err
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return s, noop, nil
	}
	endpoint := getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	switch exp := getenv("OTEL_TRACES_EXPORTER"); exp {
	case "none":
		return s, noop, nil
	case "", "otlp":
		if endpoint == "" {
			if exp == "otlp" {
				endpoint = "http://localhost:4318 (the OTLP default)"
			} else {
				return s, noop, nil
			}
		}
	default:
		return s, noop, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: wasmtools exports traces over OTLP only (\"otlp\" or \"none\")", exp)
	}
	if p := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"); p != "" && p != "http/protobuf" {
		return s, noop, fmt.Errorf("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=%q: wasmtools exports OTLP over HTTP (http/protobuf) only", p)
	}
	if p := getenv("OTEL_EXPORTER_OTLP_PROTOCOL"); p != "" && p != "http/protobuf" {
		return s, noop, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: wasmtools exports OTLP over HTTP (http/protobuf) only", p)
	}
	exporter, err := otlptracehttp.New(ctx)
	if err != nil {
		return s, noop, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		attribute.String("service.name", service),
		attribute.String("service.version", version),
	))
	if err != nil {
		res = resource.Default()
	}
	if getenv("OTEL_SERVICE_NAME") != "" {
		// The SDK's default resource already holds the operator's name;
		// ours must not replace it.
		res = resource.Default()
	}
	// Attribute values are bounded (the SDK's default is none): several
	// carry what clients and guests chose.
	limits := sdktrace.NewSpanLimits()
	limits.AttributeValueLengthLimit = maxAttribute
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits))
	Use(tp)
	s.Enabled, s.Endpoint = true, endpoint
	return s, tp.Shutdown, nil
}

// maxAttribute bounds an attribute's value in the spans Setup's provider
// records.
const maxAttribute = 1024

// on is whether a real provider is in place: with it off, the Start
// functions return at once, before making a context or a span.
var on atomic.Bool

// On reports whether spans are recorded.
func On() bool { return on.Load() }

// Use installs tp as the global tracer provider and turns spans on; nil
// turns them off (OpenTelemetry's no-op provider). [Setup] calls it; the
// benchmarks call it with a provider of their own.
func Use(tp trace.TracerProvider) {
	if tp == nil {
		otel.SetTracerProvider(noop.NewTracerProvider())
		on.Store(false)
		return
	}
	otel.SetTracerProvider(tp)
	on.Store(true)
}

// off is the span the Start functions return when spans are off.
var off = trace.SpanFromContext(context.Background())

// Start starts a span named name, a child of ctx's span (or a root), with
// attrs. End it with [End].
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !on.Load() {
		return ctx, off
	}
	return otel.Tracer(instrumentation).Start(ctx, name, trace.WithAttributes(attrs...))
}

// StartServer is Start for a request wasmtools received (span kind server).
//
// With [ClientContextLink], a span whose parent is a client's (remote)
// starts a trace of its own, linked to the client's: sampling is then the
// operator's sampler's alone.
func StartServer(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !on.Load() {
		return ctx, off
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...)}
	if sc := trace.SpanContextFromContext(ctx); sc.IsRemote() && linkClients.Load() {
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return otel.Tracer(instrumentation).Start(ctx, name, opts...)
}

// How a request's span treats the trace context its client sent
// (WASMTOOLS_TRACE_CLIENTS).
const (
	// ClientContextParent: the client's span is the request span's
	// parent, one trace from the agent into the tool's backend, and
	// the client's sampled flag and trace ID decide sampling (a
	// parent-based sampler follows the flag; a ratio sampler hashes the
	// trace ID, which the client chose). The default.
	ClientContextParent = "parent"
	// ClientContextLink: a new trace, linked to the client's span, for
	// clients the operator does not trust with its sampling (tenants): a
	// client can then neither have every request of its own exported
	// nor hide them.
	ClientContextLink = "link"
)

// linkClients is whether ClientContextLink is in force.
var linkClients atomic.Bool

// SetClientContext sets how request spans treat a client's trace
// context: [ClientContextParent] ("" too) or [ClientContextLink].
func SetClientContext(mode string) error {
	switch mode {
	case "", ClientContextParent:
		linkClients.Store(false)
	case ClientContextLink:
		linkClients.Store(true)
	default:
		return fmt.Errorf("WASMTOOLS_TRACE_CLIENTS=%q: want %q or %q", mode, ClientContextParent, ClientContextLink)
	}
	return nil
}

// StartClient is Start for a request wasmtools sends (span kind client):
// an HTTP request of a guest's, a question to the client.
func StartClient(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !on.Load() {
		return ctx, off
	}
	return otel.Tracer(instrumentation).Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}

// End ends span, recording err (its type as error.type, the span's status
// as Error) when not nil.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, statusText(err.Error()))
		span.SetAttributes(attribute.String("error.type", fmt.Sprintf("%T", err)))
	}
	span.End()
}

// Fail marks span failed with errorType (error.type) and msg, without
// ending it: for outcomes that are not Go errors (a tool result with
// isError, a JSON-RPC error code).
func Fail(span trace.Span, errorType, msg string) {
	if span.IsRecording() {
		span.SetStatus(codes.Error, statusText(msg))
		span.SetAttributes(attribute.String("error.type", errorType))
	}
}

// maxStatus bounds a span's status description: errors carry what
// clients and guests chose (an unknown tool's name, a guest's trap), and
// the SDK keeps a status whole.
const maxStatus = 512

// urlParts matches a URL: its scheme, user information, host, and the
// rest (path, query, fragment).
var urlParts = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)([^/\s"'?#@]*@)?([^/\s"'?#@]+)([/?#][^\s"']*)?`)

// statusText is msg as a span's status says it: its URLs cut to their
// scheme and host (user information, a path or a query can hold secrets:
// the spans of a plugin's requests record only the host, and so must
// their errors), and bounded.
func statusText(msg string) string {
	msg = urlParts.ReplaceAllStringFunc(msg, func(u string) string {
		m := urlParts.FindStringSubmatch(u)
		if m[2] == "" && m[4] == "" {
			return u
		}
		return m[1] + m[3] + "/…"
	})
	return Cut(msg, maxStatus)
}

// Cut returns s bounded to n bytes, cut on a rune boundary and marked so.
func Cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "…"
}

// FromMeta returns ctx with the remote span context carried in an MCP
// request's `_meta` (SEP-414: "traceparent", "tracestate", "baggage"),
// when it has one; else ctx unchanged.
func FromMeta(ctx context.Context, meta map[string]any) context.Context {
	if len(meta) == 0 {
		return ctx
	}
	if _, ok := meta["traceparent"].(string); !ok {
		return ctx
	}
	return propagator.Extract(ctx, metaCarrier(meta))
}

// FromHeader returns ctx with the remote span context of an HTTP request's
// headers (traceparent, tracestate, baggage), when it has one.
func FromHeader(ctx context.Context, h http.Header) context.Context {
	if h == nil || h.Get("traceparent") == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes ctx's span context into an outgoing HTTP request's
// headers, replacing any the guest set: the trace crosses the sandbox
// into the services a tool calls. Nothing is written when ctx has no
// span (tracing off and no client context).
//
// Trace context only (traceparent, tracestate), never baggage: what a
// client put in its baggage is the client's to say, not for the services
// of a plugin it calls (a red team, stop 64: a client's baggage reached
// them).
func Inject(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
}

// InjectMeta writes ctx's span context into an outgoing MCP request's
// `_meta` (SEP-414 keys), when ctx has one.
func InjectMeta(ctx context.Context, meta map[string]any) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	propagator.Inject(ctx, metaCarrier(meta))
}

// metaCarrier reads trace context from `_meta` keys.
type metaCarrier map[string]any

func (m metaCarrier) Get(key string) string { s, _ := m[key].(string); return s }
func (m metaCarrier) Set(key, value string) { m[key] = value }
func (m metaCarrier) Keys() []string {
	keys := make([]string, 0, 3)
	for _, k := range []string{"traceparent", "tracestate", "baggage"} {
		if _, ok := m[k]; ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// LogHandler wraps h so that each record logged with a context holding a
// span carries trace_id and span_id, the keys log pipelines join traces on.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return l.Handler.Handle(ctx, r)
}

func (l logHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(attrs)}
}

func (l logHandler) WithGroup(name string) slog.Handler { return logHandler{l.Handler.WithGroup(name)} }

// Under returns ctx (its deadline, cancellation and values) with parent's
// span as the current span: for work that runs under a context made for
// another stage (a lease's, made while the slot wait's span was current)
// but belongs to parent's span in the trace.
func Under(ctx, parent context.Context) context.Context {
	return trace.ContextWithSpan(ctx, trace.SpanFromContext(parent))
}
