// Package metrics is the worker's Prometheus instrumentation (issue 17, part 2): one registry
// per worker holding the Temporal SDK's own metrics (through its tally metrics handler) and
// mcpsync's instruments, served as Prometheus text by Serve.
//
// Labels are bounded: outcomes, read reasons and session states are closed sets of the
// mcpsync vocabulary; the only open-ended labels are source names and outbox consumer names,
// which operators create one by one. URIs, principals and server strings are never labels.
//
// Every method of *Metrics is safe on a nil receiver (it does nothing), so instrumented code
// needs no "metrics enabled" checks.
package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Namespace prefixes every mcpsync metric name.
const Namespace = "mcpsync"

// Latency buckets in seconds, from 5 ms (an in-process accept) to 5 min (a backstop read).
var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// sessionStates are the states a session host reports for a source it holds (issue 14,
// item 2); each has a sessions gauge from the start, so the family is complete at 0.
var sessionStates = []ledger.HealthState{ledger.HealthConnecting, ledger.HealthLive, ledger.HealthBackoff,
	ledger.HealthAuthFailed, ledger.HealthFailed}

// Metrics holds one worker's registry and its instruments. Create it with New.
type Metrics struct {
	reg *prometheus.Registry

	// versions counts the answers offered to the acceptance point (R16), by the ledger's
	// outcome: ACCEPTED and REVALIDATED are accepted, every other outcome (STALE,
	// OLD_SESSION, OLD_GENERATION, NOT_DISPATCHED, DUPLICATE, REVOKED, STALE_AFTER_CLOSE,
	// TOO_LARGE) is a refusal.
	versions *prometheus.CounterVec
	// notFound counts not-found answers passed through the ordinal fence (R21), by outcome.
	notFound *prometheus.CounterVec
	// reads counts read ordinals issued (R14), by read reason.
	reads *prometheus.CounterVec
	// notifyLatency is the notification → accepted latency (see Notifications).
	notifyLatency *prometheus.HistogramVec
	// sessions is the number of sources this worker's session host holds, by health state.
	sessions *prometheus.GaugeVec
	// reconnects counts connection attempts after a source's first one.
	reconnects prometheus.Counter
	// revocationClose is the revocation → close fence latency (see RevocationClosed).
	revocationClose prometheus.Histogram

	notes notifications

	smu   sync.Mutex
	state map[int64]ledger.HealthState
}

// New returns Metrics with every mcpsync instrument registered in a fresh registry, with the
// Go runtime and process collectors. It registers nothing globally, so several workers in
// one process (tests) keep separate registries.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		versions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "versions_total",
			Help: "Read answers offered to the acceptance point (R16), by outcome: ACCEPTED and REVALIDATED are accepted, the others refused."},
			[]string{"outcome"}),
		notFound: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "not_found_total",
			Help: "Not-found read answers passed through the ordinal fence (R21), by outcome."}, []string{"outcome"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "reads_total",
			Help: "Read ordinals issued (R14), by read reason."}, []string{"reason"}),
		notifyLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace,
			Name:    "notification_accept_latency_seconds",
			Help:    "From the session host receiving notifications/resources/updated to the acceptance (outcome ACCEPTED or REVALIDATED) of the first read sent after it; observed when both happen in this worker process.",
			Buckets: latencyBuckets}, []string{"outcome"}),
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "sessions",
			Help: "Sources held by this worker's session host, by health state."}, []string{"state"}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "session_reconnects_total",
			Help: "Connection attempts of held sources after each source's first attempt."}),
		revocationClose: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace,
			Name:    "revocation_close_latency_seconds",
			Help:    "From a revocation's commit to a subscription it named passing the close fence in this worker (R29), on the database clock.",
			Buckets: latencyBuckets}),
		state: map[int64]ledger.HealthState{},
	}
	m.notes.init()
	m.reg.MustRegister(m.versions, m.notFound, m.reads, m.notifyLatency, m.sessions, m.reconnects, m.revocationClose,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, s := range sessionStates {
		m.sessions.WithLabelValues(string(s))
	}
	for _, r := range mcpsync.ReadReasons {
		m.reads.WithLabelValues(string(r))
	}
	for _, o := range []mcpsync.Outcome{mcpsync.OutcomeAccepted, mcpsync.OutcomeRevalidated, mcpsync.OutcomeStale} {
		m.versions.WithLabelValues(string(o))
	}
	return m
}

// Registry returns the registry the instruments live in (for extra collectors and tests).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Accepted counts one answer offered to acceptResourceVersion (or recorded TOO_LARGE) under
// the ledger's outcome, and, for ACCEPTED and REVALIDATED, observes the notification →
// accepted latency of the notifications that read covers (see Notifications.Covered).
// workflowID is the subscription workflow's ID and sentAt when the host sent the read.
func (m *Metrics) Accepted(o mcpsync.Outcome, workflowID string, sentAt time.Time) {
	if m == nil || o == "" {
		return
	}
	m.versions.WithLabelValues(string(o)).Inc()
	if o != mcpsync.OutcomeAccepted && o != mcpsync.OutcomeRevalidated {
		return
	}
	if received, ok := m.notes.covered(workflowID, sentAt); ok {
		m.notifyLatency.WithLabelValues(string(o)).Observe(time.Since(received).Seconds())
	}
}

// NotFound counts one not-found answer under the ledger's outcome.
func (m *Metrics) NotFound(o mcpsync.Outcome) {
	if m == nil || o == "" {
		return
	}
	m.notFound.WithLabelValues(string(o)).Inc()
}

// ReadIssued counts one read ordinal issued for reason (only ALLOCATED outcomes are reads).
func (m *Metrics) ReadIssued(reason mcpsync.ReadReason) {
	if m == nil {
		return
	}
	if reason == "" {
		reason = mcpsync.ReasonNotification // the workflows' convention: empty means notification
	}
	if !reason.Valid() {
		reason = "other" // never an unbounded label
	}
	m.reads.WithLabelValues(string(reason)).Inc()
}

// Health records a session host's health report for a source it holds: the source counts in
// the sessions gauge under its newest state, and a report with Reconnects > 0 counts that
// many reconnects. An empty state means the host no longer holds the source.
func (m *Metrics) Health(sourceID int64, r ledger.HealthReport) {
	if m == nil {
		return
	}
	if r.Reconnects > 0 {
		m.reconnects.Add(float64(r.Reconnects))
	}
	m.smu.Lock()
	defer m.smu.Unlock()
	old, held := m.state[sourceID]
	if held && old == r.State {
		return
	}
	if held {
		m.sessions.WithLabelValues(string(old)).Dec()
	}
	if r.State == "" {
		delete(m.state, sourceID)
		return
	}
	m.state[sourceID] = r.State
	m.sessions.WithLabelValues(string(r.State)).Inc()
}

// RevocationClosed observes one revocation → close fence latency.
func (m *Metrics) RevocationClosed(d time.Duration) {
	if m == nil || d < 0 {
		return
	}
	m.revocationClose.Observe(d.Seconds())
}

// NotificationReceived remembers that the session host received a resources/updated
// notification for the subscription workflow workflowID at receivedAt (host clock), for the
// notification → accepted latency. Memory is bounded: see notifications.
func (m *Metrics) NotificationReceived(workflowID string, receivedAt time.Time) {
	if m == nil || workflowID == "" || receivedAt.IsZero() {
		return
	}
	m.notes.received(workflowID, receivedAt)
}

// Signaler is what the session host signals workflows through (mcphost.Signaler).
type Signaler interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// Updater is what the session host sends workflow updates through (mcphost.Updater).
type Updater interface {
	UpdateWorkflow(ctx context.Context, options client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error)
}

// Signaler returns next with every resources/updated signal's receipt time remembered for
// the notification → accepted latency (NotificationReceived) before it is sent; when next is
// also an Updater, so is the result, and every resources/updated workflow update's receipt
// time is remembered the same way. With a nil m it returns next.
func (m *Metrics) Signaler(next Signaler) Signaler {
	if m == nil {
		return next
	}
	if u, ok := next.(Updater); ok {
		return updatingSignaler{signaler: signaler{m: m, next: next}, next: u}
	}
	return signaler{m: m, next: next}
}

type signaler struct {
	m    *Metrics
	next Signaler
}

type updatingSignaler struct {
	signaler
	next Updater
}

func (s updatingSignaler) UpdateWorkflow(ctx context.Context, o client.UpdateWorkflowOptions) (client.WorkflowUpdateHandle, error) {
	if o.UpdateName == contract.UpdateResourceUpdated && len(o.Args) == 1 {
		if u, ok := o.Args[0].(contract.ResourceUpdated); ok {
			s.m.NotificationReceived(o.WorkflowID, u.ReceivedAt)
		}
	}
	return s.next.UpdateWorkflow(ctx, o)
}

func (s signaler) SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error {
	if u, ok := arg.(contract.ResourceUpdated); ok && signalName == contract.SignalResourceUpdated {
		s.m.NotificationReceived(workflowID, u.ReceivedAt)
	}
	return s.next.SignalWorkflow(ctx, workflowID, runID, signalName, arg)
}

// revocationQueryTimeout bounds the revocation latency query after a close fence.
const revocationQueryTimeout = time.Second

// CloseFencePassed observes the revocation → close fence latency of subscription id
// (generation gen) that just passed the close fence, if a revocation named it
// (RevocationLatency). It is best effort: a failed or slow query observes nothing.
func (m *Metrics) CloseFencePassed(ctx context.Context, pool *pgxpool.Pool, id, gen int64) {
	if m == nil || pool == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), revocationQueryTimeout)
	defer cancel()
	if d, ok, err := RevocationLatency(ctx, pool, id, gen); err == nil && ok {
		m.RevocationClosed(d)
	}
}
