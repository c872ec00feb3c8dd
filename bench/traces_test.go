package bench

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/wasmtools/wasmtools/internal/telemetry"
)

// BenchmarkTracedCall is BenchmarkWarmCall's in-memory call of each plugin
// with tracing off (OpenTelemetry's no-op provider: what wasmtools runs
// with when no OTEL_* exporter is set) and on (the SDK's provider, every
// span sampled and handed to a batch processor whose exporter discards
// them: the cost in wasmtools, not in a network or a collector). Issue 29:
// off must cost nothing measurable against BenchmarkWarmCall's
// inmemory/<plugin>/wasmtools, and on's overhead is reported.
func BenchmarkTracedCall(b *testing.B) {
	ctx := context.Background()
	for _, p := range benchPlugins {
		h := newHost(b, p.path(b))
		for _, mode := range []string{"off", "on"} {
			b.Run("inmemory/"+p.name+"/traces-"+mode, func(b *testing.B) {
				if mode == "on" {
					tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
					telemetry.Use(tp)
					defer func() {
						telemetry.Use(nil)
						tp.Shutdown(ctx)
					}()
				}
				cs, _, err := connectInMemory(ctx, h.Server())
				if err != nil {
					b.Fatal(err)
				}
				defer cs.Close()
				warmCalls(ctx, b, cs, p, false)
			})
		}
	}
}

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }
