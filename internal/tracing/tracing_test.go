package tracing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/mcpsync/mcpsync/internal/tracing"
)

// clearEnv unsets every OTEL_* variable the package or the exporters read, so the machine's
// environment cannot turn tracing on behind a test's back.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{
		tracing.EnvEndpoint, tracing.EnvTracesEndpoint, tracing.EnvProtocol, tracing.EnvTracesProtocol,
		tracing.EnvTracesExporter, tracing.EnvSDKDisabled, "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
	} {
		t.Setenv(k, "") // restored after the test
		os.Unsetenv(k)
	}
}

// With no OTLP endpoint (or with the SDK or the traces exporter switched off), Acquire
// installs nothing: spans are not recorded, carry no context, no _meta is produced and no
// Temporal interceptor is returned.
func TestOffUnlessEndpointSet(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"unset", nil},
		{"blank endpoint", map[string]string{tracing.EnvEndpoint: "  "}},
		{"sdk disabled", map[string]string{tracing.EnvEndpoint: "http://127.0.0.1:1", tracing.EnvSDKDisabled: "true"}},
		{"exporter none", map[string]string{tracing.EnvTracesEndpoint: "http://127.0.0.1:1", tracing.EnvTracesExporter: "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			release, err := tracing.Acquire(context.Background(), tracing.Options{ServiceName: "mcpsync-test"})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := release(context.Background()); err != nil {
					t.Error(err)
				}
			}()
			if tracing.Configured() || tracing.Enabled() {
				t.Fatalf("Configured=%v Enabled=%v, want both false", tracing.Configured(), tracing.Enabled())
			}
			ctx, span := tracing.Start(context.Background(), tracing.SpanNotification, trace.SpanKindInternal)
			if span.IsRecording() || span.SpanContext().IsValid() {
				t.Errorf("span recording=%v valid=%v, want a no-op span", span.IsRecording(), span.SpanContext().IsValid())
			}
			if m := tracing.Meta(ctx); m != nil {
				t.Errorf("Meta = %v, want nil (no _meta sent)", m)
			}
			span.End()
			ics, err := tracing.TemporalInterceptors()
			if err != nil || ics != nil {
				t.Errorf("TemporalInterceptors = %v, %v; want none", ics, err)
			}
		})
	}
}

// collector is an OTLP/HTTP trace endpoint that keeps the span names it receives.
type collector struct {
	mu       sync.Mutex
	spans    []string
	services []string
	paths    []string
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	c.paths = append(c.paths, r.URL.Path)
	for _, rs := range req.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				c.services = append(c.services, a.GetValue().GetStringValue())
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, s.GetName())
			}
		}
	}
	c.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, spans are exported over OTLP/HTTP to it (flushed by
// the last release), under the service name; tracing is off again afterwards.
func TestExportsOverOTLPWhenEndpointSet(t *testing.T) {
	clearEnv(t)
	col := &collector{}
	srv := httptest.NewServer(col)
	defer srv.Close()
	t.Setenv(tracing.EnvEndpoint, srv.URL)

	ctx := context.Background()
	release, err := tracing.Acquire(ctx, tracing.Options{ServiceName: "mcpsync-test"})
	if err != nil {
		t.Fatal(err)
	}
	second, err := tracing.Acquire(ctx, tracing.Options{ServiceName: "ignored"})
	if err != nil {
		t.Fatal(err)
	}
	if !tracing.Enabled() {
		t.Fatal("tracing not enabled with an endpoint set")
	}
	ics, err := tracing.TemporalInterceptors()
	if err != nil || len(ics) != 2 {
		t.Fatalf("TemporalInterceptors = %d, %v; want the SDK interceptor and the signal link", len(ics), err)
	}
	sctx, span := tracing.StartMCPRead(ctx, "demo://notes/1", 7, "req-1")
	meta := tracing.Meta(sctx)
	tp, _ := meta["traceparent"].(string)
	if want := span.SpanContext().TraceID().String(); !strings.Contains(tp, want) {
		t.Errorf("_meta traceparent %q does not carry trace %s", tp, want)
	}
	span.End()
	if err := second(ctx); err != nil {
		t.Fatal(err)
	}
	if !tracing.Enabled() {
		t.Fatal("the first release shut tracing down while another holder remains")
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if tracing.Enabled() {
		t.Error("tracing still enabled after the last release")
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if diff := cmp.Diff([]string{tracing.SpanMCPRead}, col.spans); diff != "" {
		t.Errorf("exported spans (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"mcpsync-test"}, col.services); diff != "" {
		t.Errorf("service.name (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/v1/traces"}, col.paths); diff != "" {
		t.Errorf("paths (-want +got):\n%s", diff)
	}
}

// A setting the exporters cannot honour fails with one line naming it, and leaves tracing off.
func TestBadSettingsFailClearly(t *testing.T) {
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"json protocol", tracing.EnvProtocol, "http/json", `OTEL_EXPORTER_OTLP_PROTOCOL="http/json" is not supported: use http/protobuf or grpc`},
		{"traces protocol", tracing.EnvTracesProtocol, "thrift", `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="thrift" is not supported: use http/protobuf or grpc`},
		{"exporter", tracing.EnvTracesExporter, "zipkin", `OTEL_TRACES_EXPORTER="zipkin" is not supported: use otlp or none`},
		{"endpoint without scheme", tracing.EnvEndpoint, "127.0.0.1:4318", `OTEL_EXPORTER_OTLP_ENDPOINT="127.0.0.1:4318": want the collector's http:// or https:// URL`},
		{"endpoint unparsable", tracing.EnvEndpoint, "::bad", `OTEL_EXPORTER_OTLP_ENDPOINT="::bad": want the collector's http:// or https:// URL`},
		{"traces endpoint without host", tracing.EnvTracesEndpoint, "http:///v1/traces", `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="http:///v1/traces": want the collector's http:// or https:// URL`},
		{"traces endpoint's scheme", tracing.EnvTracesEndpoint, "grpc://collector:4317", `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT="grpc://collector:4317": want the collector's http:// or https:// URL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			t.Setenv(tracing.EnvEndpoint, "http://127.0.0.1:1")
			t.Setenv(tc.key, tc.value)
			_, err := tracing.Acquire(context.Background(), tracing.Options{})
			if err == nil {
				t.Fatal("Acquire succeeded")
			}
			if err.Error() != tc.want || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q, want %q", err, tc.want)
			}
			if tracing.Enabled() {
				t.Error("tracing enabled after a failed Acquire")
			}
		})
	}
}

// Meta carries the W3C trace context of the current span, and FromMeta reads it back.
func TestMetaRoundTrip(t *testing.T) {
	tp, _ := tracing.NewInMemory()
	defer tracing.Install(tp)()
	ctx, span := tracing.Start(context.Background(), tracing.SpanMCPRead, trace.SpanKindClient)
	defer span.End()
	meta := tracing.Meta(ctx)
	if _, ok := meta["traceparent"]; !ok || len(meta) != 1 {
		t.Fatalf("Meta = %v, want exactly a traceparent", meta)
	}
	got := trace.SpanContextFromContext(tracing.FromMeta(context.Background(), meta))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || !got.IsRemote() {
		t.Errorf("FromMeta = %v, want the remote context of %v", got, span.SpanContext())
	}
}

// A failed span's status and error event never carry a credential found in the error, and a
// URI attribute is redacted too.
func TestEndRedactsErrors(t *testing.T) {
	tp, exp := tracing.NewInMemory()
	defer tracing.Install(tp)()
	_, span := tracing.StartMCPRead(context.Background(), "https://alice:s3cret@example.com/r?token=s3cret", 1, "r1")
	tracing.End(span, fmt.Errorf("read failed: %w", errors.New("GET https://alice:s3cret@example.com/r: 401, Authorization: Bearer s3cret")))
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans, want 1", len(spans))
	}
	got := fmt.Sprintf("%v %v %v", spans[0].Status, spans[0].Events, spans[0].Attributes)
	if strings.Contains(got, "s3cret") {
		t.Errorf("a secret reached the span: %s", got)
	}
	if spans[0].Status.Code != codes.Error {
		t.Errorf("status %v, want Error", spans[0].Status)
	}
}

// grpcCollector is an OTLP/gRPC trace service that keeps the span names it receives.
type grpcCollector struct {
	coltrace.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []string
}

func (g *grpcCollector) Export(_ context.Context, req *coltrace.ExportTraceServiceRequest) (*coltrace.ExportTraceServiceResponse, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				g.spans = append(g.spans, s.GetName())
			}
		}
	}
	return &coltrace.ExportTraceServiceResponse{}, nil
}

// OTEL_EXPORTER_OTLP_PROTOCOL=grpc exports over OTLP/gRPC instead.
func TestExportsOverOTLPGRPC(t *testing.T) {
	clearEnv(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	col := &grpcCollector{}
	gs := grpc.NewServer()
	coltrace.RegisterTraceServiceServer(gs, col)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	t.Setenv(tracing.EnvEndpoint, "http://"+lis.Addr().String())
	t.Setenv(tracing.EnvProtocol, "grpc")

	ctx := context.Background()
	release, err := tracing.Acquire(ctx, tracing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tracing.Start(ctx, tracing.SpanLedgerAccept, trace.SpanKindClient)
	span.End()
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	col.mu.Lock()
	defer col.mu.Unlock()
	if diff := cmp.Diff([]string{tracing.SpanLedgerAccept}, col.spans); diff != "" {
		t.Errorf("exported spans (-want +got):\n%s", diff)
	}
}
