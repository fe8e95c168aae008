package e2e_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// scrapeMetrics fetches url over HTTP and parses the Prometheus text exposition.
func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s: %s", url, resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape %s: content type %q, want Prometheus text", url, ct)
	}
	// MCPSYNC_METRICS_DUMP=FILE keeps the last scrape, for the note's excerpt.
	if dump := os.Getenv("MCPSYNC_METRICS_DUMP"); dump != "" {
		_ = os.WriteFile(dump, body, 0o644)
	}
	var p expfmt.TextParser
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

// sample returns the value of the family's sample whose labels include want (a counter,
// gauge, or a histogram's count), and whether there is one.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

// A real worker serves Prometheus text at its metrics address (issue 17, part 2): after one
// subscription, one update, one guarded read and one revocation, a scrape over HTTP parses
// and holds every mcpsync family with the values the run implies, and the Temporal SDK's own
// metrics (the worker dials its own client, with the tally metrics handler).
func TestMetricsScrape(t *testing.T) {
	s := newStack(t, withoutWorker())
	w, err := workerapp.Start(s.ctx, workerapp.Config{
		DatabaseURL: s.dbURL, TemporalAddress: s.ts.GetFrontendHostPort(), Namespace: s.ts.GetDefaultNamespace(),
		Logger: s.log, HostQueue: "metrics-" + t.Name(), MetricsAddr: "127.0.0.1:0",
		Host: mcphost.Options{ClaimInterval: 200 * time.Millisecond, Lease: 3 * time.Second,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, KeepAlive: stackKeepAlive},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	url := w.MetricsURL()
	if !strings.HasPrefix(url, "http://127.0.0.1:") || !strings.HasSuffix(url, "/metrics") {
		t.Fatalf("MetricsURL() = %q, want http://127.0.0.1:PORT/metrics", url)
	}

	const uri = "demo://notes/1"
	srv := s.startChaosHTTP("metered", map[string]string{uri: "v0"})
	if _, err := s.st.EnsureConsumer(s.ctx, "idx-metrics", false); err != nil {
		t.Fatal(err)
	}
	s.mustCLI("subscribe", "metered", uri)
	s.waitDigest("metered", uri, ledger.Digest([]byte("v0")))
	srv.Set(uri, "v1", "text/plain") // one update: notification → read → accept
	s.waitDigest("metered", uri, ledger.Digest([]byte("v1")))
	// While the subscription is ACTIVE its source has a staleness gauge.
	before := scrapeMetrics(t, url)
	if age, ok := sample(before, "mcpsync_source_staleness_seconds", map[string]string{"source": "metered"}); !ok || age < 0 || age > 60 {
		t.Errorf("mcpsync_source_staleness_seconds{source=metered} = %v (present %v), want a small age", age, ok)
	}
	if n, ok := sample(before, "mcpsync_subscriptions", map[string]string{"state": "ACTIVE"}); !ok || n != 1 {
		t.Errorf("mcpsync_subscriptions{state=ACTIVE} = %v (present %v), want 1", n, ok)
	}
	s.mustCLI("get", "metered", uri) // one guard verdict stored
	s.mustCLI("revoke", "default", "metered", "--wait", "20s")

	// The SDK's metrics reach the registry on tally's 1 s report interval, and the revocation
	// → close latency is observed by the close-fence activity just after the fence commits,
	// so possibly after `revoke --wait` saw the fence and returned.
	var fams map[string]*dto.MetricFamily
	eventually(t, 15*time.Second, "temporal SDK metrics and the revocation close latency in /metrics", func() (bool, string) {
		fams = scrapeMetrics(t, url)
		if n, _ := sample(fams, "mcpsync_revocation_close_latency_seconds", nil); n < 1 {
			return false, "no revocation close latency observed yet"
		}
		for name := range fams {
			if strings.HasPrefix(name, "temporal_request") || strings.HasPrefix(name, "temporal_workflow_task") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("families: %s", familyNames(fams))
	})

	atLeast := []struct {
		name   string
		labels map[string]string
		min    float64
	}{
		{"mcpsync_versions_total", map[string]string{"outcome": "ACCEPTED"}, 2}, // v0 and v1
		{"mcpsync_reads_total", map[string]string{"reason": "notification"}, 1},
		{"mcpsync_notification_accept_latency_seconds", nil, 1},
		{"mcpsync_session_reconnects_total", nil, 0},
		{"mcpsync_sessions", map[string]string{"state": "LIVE"}, 1},
		{"mcpsync_outbox_lag_rows", map[string]string{"consumer": "idx-metrics"}, 2},
		{"mcpsync_outbox_lag_seconds", map[string]string{"consumer": "idx-metrics"}, 0},
		{"mcpsync_guard_verdicts", map[string]string{"outcome": "PASS"}, 1},
		{"mcpsync_revocation_close_latency_seconds", nil, 1},
		{"mcpsync_ledger_scrape_success", nil, 1},
		{"go_goroutines", nil, 1},
	}
	for _, c := range atLeast {
		v, ok := sample(fams, c.name, c.labels)
		if !ok {
			t.Errorf("%s%v: missing from /metrics", c.name, c.labels)
			continue
		}
		if v < c.min {
			t.Errorf("%s%v = %v, want ≥ %v", c.name, c.labels, v, c.min)
		}
	}
	if n, ok := sample(fams, "mcpsync_subscriptions", map[string]string{"state": "ACTIVE"}); !ok || n != 0 {
		t.Errorf("mcpsync_subscriptions{state=ACTIVE} = %v (present %v) after the revocation, want 0", n, ok)
	}
	if _, ok := sample(fams, "mcpsync_source_staleness_seconds", map[string]string{"source": "metered"}); ok {
		t.Errorf("mcpsync_source_staleness_seconds{source=metered} present after the revocation closed its only ACTIVE subscription")
	}
	// Labels stay bounded: no URI or principal anywhere in mcpsync's families.
	for name, f := range fams {
		if !strings.HasPrefix(name, "mcpsync_") {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "://") || l.GetValue() == "default" {
					t.Errorf("%s has label %s=%q: URIs and principals are never labels", name, l.GetName(), l.GetValue())
				}
			}
		}
	}
}

func familyNames(fams map[string]*dto.MetricFamily) string {
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}
