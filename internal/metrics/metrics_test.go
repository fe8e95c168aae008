package metrics_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/metrics"
)

// values gathers m's registry and returns family name → "label=value,…" → value (a
// histogram's sample count).
func values(t *testing.T, m *metrics.Metrics) map[string]map[string]float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range fams {
		vs := map[string]float64{}
		for _, mt := range f.GetMetric() {
			var ls []string
			for _, l := range mt.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			vs[strings.Join(ls, ",")] = value(mt)
		}
		out[f.GetName()] = vs
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

// recorder is a Signaler that records nothing and succeeds.
type recorder struct{ signals int }

func (r *recorder) SignalWorkflow(context.Context, string, string, string, any) error {
	r.signals++
	return nil
}

// updatingRecorder is a recorder that also takes workflow updates, as a Temporal client does.
type updatingRecorder struct {
	recorder
	updates int
}

func (r *updatingRecorder) UpdateWorkflow(context.Context, client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	r.updates++
	return nil, nil
}

// The notification → accepted latency is observed once per accepted read that covers a
// notification (received before the read was sent), from the oldest covered receipt;
// receipts after the read stay for the next one, and refusals observe nothing.
func TestNotificationAcceptLatency(t *testing.T) {
	t0 := time.Now()
	tests := []struct {
		name     string
		received []time.Duration // receipt times, relative to t0
		accepts  []struct {
			outcome mcpsync.Outcome
			sentAt  time.Duration
		}
		want map[string]float64 // label set → sample count
	}{
		{
			name:     "read after the notification",
			received: []time.Duration{0},
			accepts: []struct {
				outcome mcpsync.Outcome
				sentAt  time.Duration
			}{{mcpsync.OutcomeAccepted, time.Millisecond}},
			want: map[string]float64{"outcome=ACCEPTED": 1},
		},
		{
			name:     "read sent before the notification covers nothing",
			received: []time.Duration{10 * time.Millisecond},
			accepts: []struct {
				outcome mcpsync.Outcome
				sentAt  time.Duration
			}{{mcpsync.OutcomeAccepted, time.Millisecond}},
			want: map[string]float64{},
		},
		{
			name:     "a burst is one observation; the later receipt waits for the next read",
			received: []time.Duration{0, time.Millisecond, 20 * time.Millisecond},
			accepts: []struct {
				outcome mcpsync.Outcome
				sentAt  time.Duration
			}{{mcpsync.OutcomeAccepted, 5 * time.Millisecond}, {mcpsync.OutcomeRevalidated, 30 * time.Millisecond},
				{mcpsync.OutcomeAccepted, 40 * time.Millisecond}},
			want: map[string]float64{"outcome=ACCEPTED": 1, "outcome=REVALIDATED": 1},
		},
		{
			name:     "a refused answer observes nothing and keeps the receipt",
			received: []time.Duration{0},
			accepts: []struct {
				outcome mcpsync.Outcome
				sentAt  time.Duration
			}{{mcpsync.OutcomeStale, time.Millisecond}, {mcpsync.OutcomeAccepted, 2 * time.Millisecond}},
			want: map[string]float64{"outcome=ACCEPTED": 1},
		},
	}
	// Each case runs with the receipts sent as signals and as workflow updates.
	deliveries := []struct {
		name    string
		receive func(t *testing.T, sig metrics.Signaler, u contract.ResourceUpdated)
	}{
		{"signal", func(t *testing.T, sig metrics.Signaler, u contract.ResourceUpdated) {
			if err := sig.SignalWorkflow(context.Background(), "wf-1", "", contract.SignalResourceUpdated, u); err != nil {
				t.Fatal(err)
			}
		}},
		{"update", func(t *testing.T, sig metrics.Signaler, u contract.ResourceUpdated) {
			up, ok := sig.(metrics.Updater)
			if !ok {
				t.Fatal("the wrapped signaler of an updater takes no updates")
			}
			if _, err := up.UpdateWorkflow(context.Background(), client.UpdateWorkflowOptions{
				WorkflowID: "wf-1", UpdateName: contract.UpdateResourceUpdated, Args: []any{u}}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		for _, d := range deliveries {
			t.Run(tt.name+"/"+d.name, func(t *testing.T) {
				m := metrics.New()
				sig := m.Signaler(&updatingRecorder{})
				for _, r := range tt.received {
					d.receive(t, sig, contract.ResourceUpdated{ReceivedAt: t0.Add(r)})
				}
				for _, a := range tt.accepts {
					// SentAt crosses a Temporal payload: JSON keeps the wall clock only.
					m.Accepted(a.outcome, "wf-1", t0.Add(a.sentAt).Round(0))
					m.Accepted(a.outcome, "wf-other", t0.Add(a.sentAt).Round(0)) // another subscription's read covers nothing
				}
				got := values(t, m)["mcpsync_notification_accept_latency_seconds"]
				if got == nil {
					got = map[string]float64{}
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("latency sample counts (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// Sessions by state follow each source's newest report; letting a source go removes it;
// reconnects add up.
func TestSessionsByState(t *testing.T) {
	m := metrics.New()
	m.Health(1, ledger.HealthReport{State: ledger.HealthConnecting})
	m.Health(2, ledger.HealthReport{State: ledger.HealthConnecting})
	m.Health(1, ledger.HealthReport{State: ledger.HealthLive})
	m.Health(2, ledger.HealthReport{State: ledger.HealthBackoff})
	m.Health(2, ledger.HealthReport{State: ledger.HealthConnecting, Reconnects: 1})
	m.Health(2, ledger.HealthReport{State: ledger.HealthAuthFailed})
	m.Health(3, ledger.HealthReport{State: ledger.HealthConnecting})
	m.Health(3, ledger.HealthReport{}) // released
	v := values(t, m)
	want := map[string]float64{"state=AUTH_FAILED": 1, "state=BACKOFF": 0, "state=CONNECTING": 0, "state=FAILED": 0, "state=LIVE": 1}
	if diff := cmp.Diff(want, v["mcpsync_sessions"]); diff != "" {
		t.Errorf("mcpsync_sessions (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"": 1}, v["mcpsync_session_reconnects_total"]); diff != "" {
		t.Errorf("mcpsync_session_reconnects_total (-want +got):\n%s", diff)
	}
}

// Outcome and reason labels come from closed sets: an unknown read reason is "other", an empty
// one is a notification (the workflows' convention).
func TestCountersAndBoundedLabels(t *testing.T) {
	m := metrics.New()
	m.ReadIssued("")
	m.ReadIssued(mcpsync.ReasonBackstop)
	m.ReadIssued("demo://notes/1") // never a label value
	m.Accepted(mcpsync.OutcomeTooLarge, "", time.Time{})
	m.NotFound(mcpsync.OutcomeTombstonePending)
	m.RevocationClosed(1500 * time.Millisecond)
	v := values(t, m)
	for _, c := range []struct {
		family, labels string
		want           float64
	}{
		{"mcpsync_reads_total", "reason=notification", 1},
		{"mcpsync_reads_total", "reason=backstop", 1},
		{"mcpsync_reads_total", "reason=other", 1},
		{"mcpsync_versions_total", "outcome=TOO_LARGE", 1},
		{"mcpsync_not_found_total", "outcome=TOMBSTONE_PENDING", 1},
		{"mcpsync_revocation_close_latency_seconds", "", 1},
	} {
		if got, ok := v[c.family][c.labels]; !ok || got != c.want {
			t.Errorf("%s{%s} = %v (present %v), want %v", c.family, c.labels, got, ok, c.want)
		}
	}
	// A nil *Metrics is a no-op everywhere (metrics disabled).
	var off *metrics.Metrics
	off.ReadIssued(mcpsync.ReasonPoll)
	off.Accepted(mcpsync.OutcomeAccepted, "wf", time.Now())
	off.Health(1, ledger.HealthReport{State: ledger.HealthLive})
	if r := (&recorder{}); off.Signaler(r) != r {
		t.Error("a nil Metrics wraps the signaler")
	}
}

// Serve answers Prometheus text on /metrics; an address in use is ErrAddrInUse (the worker
// runs on without metrics), a malformed address another error.
func TestServe(t *testing.T) {
	m := metrics.New()
	s, err := m.Serve("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	resp, err := http.Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET %s: %d %q, want 200 text/plain", s.URL(), resp.StatusCode, ct)
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(s.URL(), "http://"), "/metrics")
	if _, err := metrics.New().Serve(addr); !errors.Is(err, metrics.ErrAddrInUse) {
		t.Errorf("Serve(%s) while in use: %v, want ErrAddrInUse", addr, err)
	}
	_, err = metrics.New().Serve("127.0.0.1:notaport")
	if err == nil || errors.Is(err, metrics.ErrAddrInUse) || !strings.Contains(err.Error(), metrics.EnvAddr) {
		t.Errorf("Serve(malformed): %v, want an error naming %s", err, metrics.EnvAddr)
	}
}

// An unreachable ledger costs a scrape at most the collector's timeout and reports
// mcpsync_ledger_scrape_success 0 with no partial ledger gauges.
func TestLedgerCollectorUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers: a hung database
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pool, err := pgxpool.New(context.Background(), "postgres://u@"+ln.Addr().String()+"/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	m := metrics.New()
	m.Registry().MustRegister(metrics.NewLedgerCollector(pool, 300*time.Millisecond, nil))
	start := time.Now()
	v := values(t, m)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("scrape took %s with a hung ledger, want about the 300ms timeout", d)
	}
	if diff := cmp.Diff(map[string]float64{"": 0}, v["mcpsync_ledger_scrape_success"]); diff != "" {
		t.Errorf("mcpsync_ledger_scrape_success (-want +got):\n%s", diff)
	}
	for _, f := range []string{"mcpsync_subscriptions", "mcpsync_guard_verdicts", "mcpsync_outbox_lag_rows"} {
		if _, ok := v[f]; ok {
			t.Errorf("%s reported although the ledger was unreachable", f)
		}
	}
}
