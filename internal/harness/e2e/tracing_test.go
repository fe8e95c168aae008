package e2e_test

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/tracing"
)

// One update through the real stack (a real Temporal server, the worker with its session host,
// Postgres, the fault-injecting MCP server over streamable HTTP) is one connected trace
// (issue 17 part 3): the host's notification span is the root; the Temporal interceptor
// carries it through the workflow update into the workflow; the read's allocation, the MCP
// read and the acceptance hang from that update; and the server received the read span's W3C traceparent
// in the request's _meta.
func TestOneUpdateOneConnectedTrace(t *testing.T) {
	tp, exp := tracing.NewInMemory()
	t.Cleanup(tracing.Install(tp)) // registered first: restored after the stack has stopped
	s := newStack(t)
	const uri = "demo://traced/1"
	srv := s.startChaosHTTP("traced", map[string]string{uri: "v1"})
	s.mustCLI("subscribe", "traced", uri)
	s.waitDigest("traced", uri, ledger.Digest([]byte("v1")))

	srv.Set(uri, "v2", "text/plain")
	s.waitDigest("traced", uri, ledger.Digest([]byte("v2")))

	// The host delivers the notification as a workflow update (issue 16).
	update, handle := "UpdateWorkflow:"+contract.UpdateResourceUpdated, "HandleUpdate:"+contract.UpdateResourceUpdated
	var tr traceView
	eventually(t, 10*time.Second, "the update's trace", func() (bool, string) {
		var err error
		tr, err = updateTrace(exp.GetSpans(), uri)
		if err != nil {
			return false, err.Error()
		}
		if _, ok := tr.named[tracing.SpanLedgerAccept]; !ok {
			return false, "no accept span yet:\n" + tr.String()
		}
		if _, ok := tr.named["RunActivity:"+contract.ActLocalRead]; !ok {
			return false, "the fast path's local activity not ended yet:\n" + tr.String()
		}
		// The update call returns (and its span ends) only after the workflow task that ran
		// the read has completed, so it may end after the accept span.
		if _, ok := tr.named[update]; !ok {
			return false, "the update call not returned yet:\n" + tr.String()
		}
		return true, ""
	})
	t.Logf("trace %s:\n%s", tr.id, tr)

	// Connected: one root (the notification), every other span's parent in the trace.
	var roots []string
	for _, sp := range tr.spans {
		if _, ok := tr.byID[sp.Parent.SpanID()]; !ok {
			roots = append(roots, sp.Name)
		}
	}
	if len(roots) != 1 || roots[0] != tracing.SpanNotification {
		t.Errorf("roots %v, want only %s", roots, tracing.SpanNotification)
	}
	// The worker holding the session runs the update on the fast path (issue 16 item 2): the
	// read and the acceptance are children of its one local activity.
	for _, chain := range [][]string{
		{tracing.SpanMCPRead, "RunActivity:" + contract.ActLocalRead, "StartActivity:" + contract.ActLocalRead, handle, update, tracing.SpanNotification},
		{tracing.SpanLedgerAccept, "RunActivity:" + contract.ActLocalRead, "StartActivity:" + contract.ActLocalRead, handle, update, tracing.SpanNotification},
	} {
		if got := tr.ancestry(chain[0], len(chain)); strings.Join(got, " <- ") != strings.Join(chain, " <- ") {
			t.Errorf("ancestry of %s:\n got %s\nwant %s", chain[0], strings.Join(got, " <- "), strings.Join(chain, " <- "))
		}
	}

	// The MCP server saw the read span's context in the read request's _meta.
	meta, ok := srv.LastReadMeta(uri)
	if !ok {
		t.Fatal("the server recorded no read of " + uri)
	}
	read := tr.named[tracing.SpanMCPRead]
	want := fmt.Sprintf("00-%s-%s-01", tr.id, read.SpanContext.SpanID())
	if got, _ := meta["traceparent"].(string); got != want {
		t.Errorf("_meta traceparent %q, want %q (the read span); _meta %v", got, want, meta)
	}
}

// traceView is the spans of one trace.
type traceView struct {
	id    trace.TraceID
	spans []tracetest.SpanStub
	byID  map[trace.SpanID]tracetest.SpanStub
	named map[string]tracetest.SpanStub // the last span of each name
}

// updateTrace returns the trace of the one notification span of uri that was routed to a
// subscription (the update); it fails unless there is exactly one.
func updateTrace(all tracetest.SpanStubs, uri string) (traceView, error) {
	var roots []tracetest.SpanStub
	for _, sp := range all {
		if sp.Name != tracing.SpanNotification {
			continue
		}
		for _, a := range sp.Attributes {
			if a.Key == tracing.AttrURI && a.Value.AsString() == uri {
				roots = append(roots, sp)
			}
		}
	}
	if len(roots) != 1 {
		return traceView{}, fmt.Errorf("%d notification spans of %s, want 1 (of %d spans)", len(roots), uri, len(all))
	}
	tr := traceView{id: roots[0].SpanContext.TraceID(), byID: map[trace.SpanID]tracetest.SpanStub{}, named: map[string]tracetest.SpanStub{}}
	for _, sp := range all {
		if sp.SpanContext.TraceID() == tr.id {
			tr.spans = append(tr.spans, sp)
			tr.byID[sp.SpanContext.SpanID()] = sp
			tr.named[sp.Name] = sp
		}
	}
	sort.Slice(tr.spans, func(i, j int) bool { return tr.spans[i].StartTime.Before(tr.spans[j].StartTime) })
	return tr, nil
}

// ancestry returns the names of the span called name and up to n-1 of its ancestors.
func (tr traceView) ancestry(name string, n int) []string {
	sp, ok := tr.named[name]
	if !ok {
		return nil
	}
	out := []string{sp.Name}
	for len(out) < n {
		p, ok := tr.byID[sp.Parent.SpanID()]
		if !ok {
			break
		}
		out = append(out, p.Name)
		sp = p
	}
	return out
}

// String draws the trace as a tree, children under their parent in start order.
func (tr traceView) String() string {
	var b strings.Builder
	var walk func(parent trace.SpanID, depth int)
	walk = func(parent trace.SpanID, depth int) {
		for _, sp := range tr.spans {
			if sp.Parent.SpanID() == parent && sp.SpanContext.SpanID() != parent {
				fmt.Fprintf(&b, "%s%s (%s)\n", strings.Repeat("  ", depth), sp.Name, sp.EndTime.Sub(sp.StartTime).Round(10*time.Microsecond))
				walk(sp.SpanContext.SpanID(), depth+1)
			}
		}
	}
	for _, sp := range tr.spans {
		if _, ok := tr.byID[sp.Parent.SpanID()]; !ok {
			fmt.Fprintf(&b, "%s (%s)\n", sp.Name, sp.EndTime.Sub(sp.StartTime).Round(10*time.Microsecond))
			walk(sp.SpanContext.SpanID(), 1)
		}
	}
	return b.String()
}

// otlpCollector is an OTLP/HTTP trace endpoint that keeps every span it receives.
type otlpCollector struct {
	mu    sync.Mutex
	spans []otlpSpan
}

type otlpSpan struct {
	name, service string
	trace, span   string
	parent        string
}

func (c *otlpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &req)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.GetResourceSpans() {
		var service string
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				c.spans = append(c.spans, otlpSpan{name: s.GetName(), service: service,
					trace: hex.EncodeToString(s.GetTraceId()), span: hex.EncodeToString(s.GetSpanId()), parent: hex.EncodeToString(s.GetParentSpanId())})
			}
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// The mcpsync-worker binary exports its spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT
// is set (issue 17 part 3): after one update, the collector holds the update's notification,
// MCP read and ledger acceptance spans in one trace, from service mcpsync-worker.
func TestWorkerExportsTracesOverOTLP(t *testing.T) {
	col := &otlpCollector{}
	hs := httptest.NewServer(col)
	defer hs.Close()
	s := newStack(t, withoutWorker())
	w := s.startWorkerBinary(filepath.Join(t.TempDir(), "worker.log"), []string{"--log-level", "warn"},
		"MCPSYNC_METRICS_ADDR=", tracing.EnvEndpoint+"="+hs.URL, "OTEL_BSP_SCHEDULE_DELAY=100")
	cmd := w.cmd

	const uri = "demo://exported/1"
	srv := s.startChaosHTTP("exported", map[string]string{uri: "v1"})
	s.mustCLI("subscribe", "exported", uri)
	s.waitDigest("exported", uri, ledger.Digest([]byte("v1")))
	srv.Set(uri, "v2", "text/plain")
	s.waitDigest("exported", uri, ledger.Digest([]byte("v2")))

	eventually(t, 20*time.Second, "the update's spans at the collector", func() (bool, string) {
		col.mu.Lock()
		defer col.mu.Unlock()
		byName := map[string][]otlpSpan{}
		for _, sp := range col.spans {
			byName[sp.name] = append(byName[sp.name], sp)
		}
		notes := byName[tracing.SpanNotification]
		if len(notes) != 1 {
			return false, fmt.Sprintf("%d notification spans of %d spans", len(notes), len(col.spans))
		}
		var inTrace []string
		for _, sp := range col.spans {
			if sp.trace == notes[0].trace {
				if sp.service != "mcpsync-worker" {
					return false, fmt.Sprintf("span %s from service %q", sp.name, sp.service)
				}
				inTrace = append(inTrace, sp.name)
			}
		}
		sort.Strings(inTrace)
		for _, want := range []string{tracing.SpanNotification, "UpdateWorkflow:" + contract.UpdateResourceUpdated,
			"HandleUpdate:" + contract.UpdateResourceUpdated, tracing.SpanMCPRead, tracing.SpanLedgerAccept} {
			if !slices.Contains(inTrace, want) {
				return false, fmt.Sprintf("trace %s lacks %s: %v", notes[0].trace, want, inTrace)
			}
		}
		return true, ""
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("worker exit after SIGTERM: %v", err)
	}
}
