// Package tracing is mcpsync's OpenTelemetry tracing (issue 17 part 3): one process-wide
// tracer provider — an OTLP exporter when the standard OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, nothing at all otherwise — helpers that start
// the spans around the update path (notification → signal → workflow → read → accept), the
// W3C trace context for an MCP request's _meta, and the Temporal interceptors that carry a
// notification's trace through its signal into the workflow's read and accept.
//
// When tracing is off, Tracer is OpenTelemetry's no-op tracer: spans are not recorded, no
// span context is valid, Meta returns nil (no _meta is sent) and TemporalInterceptors returns
// none, so the Temporal client, workers and headers are exactly as without this package.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// ScopeName is the instrumentation scope of every span mcpsync starts itself.
const ScopeName = "github.com/mcpsync/mcpsync"

// Names of the spans mcpsync starts itself; the Temporal interceptor adds its own
// ("SignalWorkflow:<signal>", "HandleSignal:<signal>", "StartActivity:<activity>",
// "RunActivity:<activity>", "RunWorkflow:<workflow>").
const (
	// SpanNotification covers one notifications/resources/updated on the session host, from
	// its arrival to the signals it caused (its root span when nothing upstream is traced).
	SpanNotification = "mcpsync.notification"
	// SpanMCPRead covers one resources/read request on the live MCP session.
	SpanMCPRead = "mcp.resources/read"
	// SpanLedgerAccept covers the acceptance point's ledger transaction (R16).
	SpanLedgerAccept = "ledger.accept"
)

// Attribute keys set on mcpsync's spans.
const (
	AttrSource     = attribute.Key("mcpsync.source.id")
	AttrGeneration = attribute.Key("mcpsync.session.generation")
	AttrSeq        = attribute.Key("mcpsync.notification.seq")
	AttrPulses     = attribute.Key("mcpsync.notification.pulses")
	AttrTargets    = attribute.Key("mcpsync.notification.targets")
	AttrURI        = attribute.Key("mcpsync.uri")
	AttrOrdinal    = attribute.Key("mcpsync.read.ordinal")
	AttrRequestID  = attribute.Key("mcpsync.read.request_id")
	AttrMCPMethod  = attribute.Key("mcp.method.name")
	AttrSubID      = attribute.Key("mcpsync.subscription.id")
)

// Environment variables read here (the OpenTelemetry specification's names). The exporters
// read the rest themselves (headers, timeout, compression, certificates, insecure).
const (
	EnvEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvTracesExporter  = "OTEL_TRACES_EXPORTER"
	EnvSDKDisabled     = "OTEL_SDK_DISABLED"
	defaultServiceName = "mcpsync"
)

// active holds the installed provider; nil means tracing is off.
var active atomic.Pointer[provider]

type provider struct{ tp trace.TracerProvider }

// Enabled reports whether a tracer provider is installed (by Acquire from the environment, or
// by Install). Only then are spans recorded and the Temporal interceptors returned.
func Enabled() bool { return active.Load() != nil }

// Tracer returns mcpsync's tracer on the installed provider, or a no-op tracer when tracing is
// off (it records nothing and its spans carry no valid context).
func Tracer() trace.Tracer {
	if p := active.Load(); p != nil {
		return p.tp.Tracer(ScopeName)
	}
	return noopTracer
}

var noopTracer = noop.NewTracerProvider().Tracer(ScopeName)

// NoopSpan returns a span that records nothing and whose End does nothing (never the span of
// a context, which End would end).
func NoopSpan() trace.Span { return noop.Span{} }

// Install makes tp the process's tracer provider until the returned restore function puts
// the previous one (or none) back. It is for tests and programs that build their own
// provider; Acquire never replaces a provider installed this way.
func Install(tp trace.TracerProvider) (restore func()) {
	prev := active.Swap(&provider{tp: tp})
	return func() { active.Store(prev) }
}

// NewInMemory returns a provider that hands every ended span synchronously to an in-memory
// exporter, for tests: install it with Install and read the spans with GetSpans.
func NewInMemory() (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	return sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp)), exp
}

// Start starts a span of kind internal (or the given kind) as a child of the span in ctx.
func Start(ctx context.Context, name string, kind trace.SpanKind, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	return Tracer().Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// End records err (if any) on span, marks it failed, and ends it.
func End(span trace.Span, err error) {
	if err != nil {
		err = redact.Err(err) // no credential in an error reaches a trace backend
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// URI is the attribute for a resource URI, redacted (credentials in a URI never reach a
// trace backend).
func URI(uri string) attribute.KeyValue { return AttrURI.String(redact.URL(uri)) }

// propagator is the W3C trace context, the format MCP's _meta carries.
var propagator = propagation.TraceContext{}

// Meta returns the W3C trace context of the span in ctx as MCP request _meta entries
// ("traceparent", and "tracestate" when there is one), or nil when ctx carries no valid
// span context (tracing off): a request then carries no _meta at all.
func Meta(ctx context.Context) map[string]any {
	carrier := propagation.MapCarrier{}
	propagator.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return nil
	}
	m := make(map[string]any, len(carrier))
	for k, v := range carrier {
		m[k] = v
	}
	return m
}

// FromMeta returns ctx with the remote span context found in MCP _meta entries (the
// inverse of Meta), for servers that continue the client's trace.
func FromMeta(ctx context.Context, meta map[string]any) context.Context {
	carrier := propagation.MapCarrier{}
	for _, k := range propagator.Fields() {
		if s, ok := meta[k].(string); ok {
			carrier[k] = s
		}
	}
	return propagator.Extract(ctx, carrier)
}

// Options tune Acquire.
type Options struct {
	// ServiceName is the service.name resource attribute unless OTEL_SERVICE_NAME says
	// otherwise (default "mcpsync").
	ServiceName string
	// OnError receives export errors (default: dropped). It is only installed when Acquire
	// sets up the provider.
	OnError func(error)
}

var (
	acquireMu sync.Mutex
	refs      int
	owned     *sdktrace.TracerProvider // installed by Acquire, shut down by the last release
)

// Configured reports whether the environment asks for OTLP export of traces: an endpoint is
// set (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT), the SDK is not
// disabled (OTEL_SDK_DISABLED=true) and OTEL_TRACES_EXPORTER is not "none".
func Configured() bool {
	if strings.EqualFold(strings.TrimSpace(os.Getenv(EnvSDKDisabled)), "true") {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(os.Getenv(EnvTracesExporter)), "none") {
		return false
	}
	return strings.TrimSpace(os.Getenv(EnvTracesEndpoint)) != "" || strings.TrimSpace(os.Getenv(EnvEndpoint)) != ""
}

// Acquire sets up the process's tracer provider from the environment the first time it is
// called while none is installed: an OTLP exporter (http/protobuf, or grpc when
// OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL says so) behind a batch span processor, when
// Configured; nothing when not. Every call must be paired with one call of the returned
// release; the last release flushes and shuts down a provider Acquire installed. A provider
// installed with Install is left alone. A malformed setting fails with one clear line.
func Acquire(ctx context.Context, opts Options) (release func(context.Context) error, err error) {
	acquireMu.Lock()
	defer acquireMu.Unlock()
	if refs == 0 && !Enabled() && Configured() {
		tp, err := newOTLPProvider(ctx, opts)
		if err != nil {
			return nil, err
		}
		owned = tp
		active.Store(&provider{tp: tp})
		if opts.OnError != nil {
			otel.SetErrorHandler(otel.ErrorHandlerFunc(opts.OnError))
		}
	}
	refs++
	var once sync.Once
	return func(ctx context.Context) error {
		var err error
		once.Do(func() { err = releaseRef(ctx) })
		return err
	}, nil
}

func releaseRef(ctx context.Context) error {
	acquireMu.Lock()
	defer acquireMu.Unlock()
	refs--
	if refs > 0 || owned == nil {
		return nil
	}
	tp := owned
	owned = nil
	if p := active.Load(); p != nil && p.tp == tp {
		active.Store(nil)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("flushing traces: %w", redact.Err(err))
	}
	return nil
}

// protocol returns the OTLP protocol the environment selects for traces.
func protocol() (string, error) {
	p := strings.TrimSpace(os.Getenv(EnvTracesProtocol))
	name := EnvTracesProtocol
	if p == "" {
		p, name = strings.TrimSpace(os.Getenv(EnvProtocol)), EnvProtocol
	}
	switch p {
	case "", "http/protobuf":
		return "http/protobuf", nil
	case "grpc":
		return "grpc", nil
	}
	return "", fmt.Errorf("%s=%q is not supported: use http/protobuf or grpc", name, p)
}

func newOTLPProvider(ctx context.Context, opts Options) (*sdktrace.TracerProvider, error) {
	if e := strings.TrimSpace(os.Getenv(EnvTracesExporter)); e != "" && e != "otlp" {
		return nil, fmt.Errorf("%s=%q is not supported: use otlp or none", EnvTracesExporter, e)
	}
	proto, err := protocol()
	if err != nil {
		return nil, err
	}
	if err := checkEndpoint(); err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	if proto == "grpc" {
		exp, err = otlptracegrpc.New(ctx)
	} else {
		exp, err = otlptracehttp.New(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter (%s) for %s: %w", proto, redact.URL(Endpoint()), redact.Err(err))
	}
	name := opts.ServiceName
	if name == "" {
		name = defaultServiceName
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", name)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	// The sampler honours OTEL_TRACES_SAMPLER[_ARG], the batcher OTEL_BSP_*.
	return sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res)), nil
}

// checkEndpoint refuses an endpoint the exporters cannot use: OTLP endpoints are URLs with
// scheme http or https and a host (both protocols); given anything else (host:port, a bare
// word) the exporters log a parse error of their own, once, and export nothing.
func checkEndpoint() error {
	name, e := endpointSetting()
	if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s=%q: want the collector's http:// or https:// URL", name, redact.URL(e))
	}
	return nil
}

// Endpoint is the OTLP endpoint the environment names for traces (the traces-specific one
// first), or "".
func Endpoint() string {
	_, e := endpointSetting()
	return e
}

// endpointSetting is the variable that names the traces' OTLP endpoint and its value: the
// traces-specific one when set, else the general one ("" if neither is).
func endpointSetting() (name, value string) {
	if e := strings.TrimSpace(os.Getenv(EnvTracesEndpoint)); e != "" {
		return EnvTracesEndpoint, e
	}
	return EnvEndpoint, strings.TrimSpace(os.Getenv(EnvEndpoint))
}

// StartMCPRead starts the client span of one resources/read request of uri (read ordinal and
// request ID as attributes); pass its context to Meta for the request's _meta.
func StartMCPRead(ctx context.Context, uri string, ordinal int64, requestID string) (context.Context, trace.Span) {
	if !Enabled() {
		return ctx, NoopSpan()
	}
	return Start(ctx, SpanMCPRead, trace.SpanKindClient, AttrMCPMethod.String("resources/read"), URI(uri),
		AttrOrdinal.Int64(ordinal), AttrRequestID.String(requestID))
}
