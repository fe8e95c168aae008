package workflows_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	uri       = "demo://notes/1"
	hostQueue = "host-test"
)

// fakeMCP stands in for the session-bound activities: it serves bodies from a map, stores
// them in the real blob table like the real read does, and records every call.
type fakeMCP struct {
	store *ledger.Store

	mu           sync.Mutex
	bodies       map[string]string
	reads        []contract.ReadInput
	subscribes   []contract.SessionCall
	unsubscribes []contract.SessionCall
	// unsubscribeErrs are returned by the next unsubscribe calls, in order.
	unsubscribeErrs []error
	notFound        bool
	// sentAt is the host-clock send time reads report.
	sentAt time.Time
}

func (f *fakeMCP) register(env *testsuite.TestWorkflowEnvironment) {
	env.RegisterActivityWithOptions(f.subscribe, activity.RegisterOptions{Name: contract.ActMCPSubscribe})
	env.RegisterActivityWithOptions(f.unsubscribe, activity.RegisterOptions{Name: contract.ActMCPUnsubscribe})
	env.RegisterActivityWithOptions(f.read, activity.RegisterOptions{Name: contract.ActMCPRead})
}

func (f *fakeMCP) set(body string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bodies[uri] = body
}

func (f *fakeMCP) setSentAt(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sentAt = t
}

func (f *fakeMCP) subscribe(_ context.Context, c contract.SessionCall) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subscribes = append(f.subscribes, c)
	return nil
}

func (f *fakeMCP) unsubscribe(_ context.Context, c contract.SessionCall) (contract.UnsubscribeOutput, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unsubscribes = append(f.unsubscribes, c)
	if len(f.unsubscribeErrs) > 0 {
		err := f.unsubscribeErrs[0]
		f.unsubscribeErrs = f.unsubscribeErrs[1:]
		return contract.UnsubscribeOutput{Sent: true}, err
	}
	return contract.UnsubscribeOutput{Acked: true, Sent: true}, nil
}

func (f *fakeMCP) read(ctx context.Context, in contract.ReadInput) (contract.ReadOutput, error) {
	f.mu.Lock()
	f.reads = append(f.reads, in)
	f.mu.Unlock()
	return f.readBody(ctx, in.ServerURI)
}

// readBody serves serverURI's body as a read does, without recording a host-queue read.
func (f *fakeMCP) readBody(ctx context.Context, serverURI string) (contract.ReadOutput, error) {
	f.mu.Lock()
	body, notFound, sentAt := f.bodies[serverURI], f.notFound, f.sentAt
	f.mu.Unlock()
	if notFound {
		return contract.ReadOutput{}, nil
	}
	d, err := f.store.PutBlob(ctx, []byte(body), "text/plain")
	if err != nil {
		return contract.ReadOutput{}, err
	}
	return contract.ReadOutput{Found: true, Digest: d, MIMEType: "text/plain", Size: int64(len(body)), ServerName: "fake", SentAt: sentAt}, nil
}

// registerLedger registers the ledger activities and the read and subscribe fast paths of a
// worker that holds no session (activities.LocalRead without a Session: it allocates, and the
// read goes to the host queue as on the regular path; activities.LocalSubscribe without one:
// the subscribe goes to the host queue).
func registerLedger(env *testsuite.TestWorkflowEnvironment, st *ledger.Store) {
	led := &activities.Ledger{Store: st}
	led.Register(env)
	(&activities.LocalRead{Ledger: led}).Register(env)
	(&activities.LocalSubscribe{}).Register(env)
}

type harness struct {
	t    *testing.T
	ctx  context.Context
	env  *testsuite.TestWorkflowEnvironment
	st   *ledger.Store
	src  ledger.Source
	sess ledger.Session
	mcp  *fakeMCP
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "demo", Transport: ledger.TransportStdio, Command: []string{"demo"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, hostQueue, time.Hour); err != nil {
		t.Fatal(err)
	}
	sess, _, err := st.OpenSession(ctx, src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		t.Fatal(err)
	}
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestWorkflowEnvironment()
	env.SetTestTimeout(60 * time.Second)
	env.RegisterWorkflowWithOptions(workflows.SubscriptionWorkflow, workflow.RegisterOptions{Name: contract.SubscriptionWorkflowName})
	registerLedger(env, st)
	f := &fakeMCP{store: st, bodies: map[string]string{uri: "v1"}}
	f.register(env)
	return &harness{t: t, ctx: ctx, env: env, st: st, src: src, sess: sess, mcp: f}
}

// fresh returns a harness on the same ledger, source and session with a new test
// environment, for the next run after continue-as-new.
func (h *harness) fresh() *harness {
	var ts testsuite.WorkflowTestSuite
	env := ts.NewTestWorkflowEnvironment()
	env.SetTestTimeout(60 * time.Second)
	env.RegisterWorkflowWithOptions(workflows.SubscriptionWorkflow, workflow.RegisterOptions{Name: contract.SubscriptionWorkflowName})
	registerLedger(env, h.st)
	h.mcp.register(env)
	n := *h
	n.env = env
	return &n
}

func (h *harness) input() contract.SubscriptionInput {
	return contract.SubscriptionInput{Principal: "default", Source: "demo", SourceID: h.src.ID, URI: uri, ServerURI: uri,
		BackstopSeconds: 3600, PollSeconds: 3600}
}

func (h *harness) at(d time.Duration, fn func()) { h.env.RegisterDelayedCallback(fn, d) }

func (h *harness) signal(name string, arg any) { h.env.SignalWorkflow(name, arg) }

func (h *harness) run() contract.StateView {
	h.t.Helper()
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, h.input())
	if !h.env.IsWorkflowCompleted() {
		h.t.Fatal("workflow did not complete")
	}
	if err := h.env.GetWorkflowError(); err != nil {
		h.t.Fatalf("workflow error: %v", err)
	}
	var v contract.StateView
	if err := h.env.GetWorkflowResult(&v); err != nil {
		h.t.Fatal(err)
	}
	return v
}

func (h *harness) sub() ledger.Subscription {
	h.t.Helper()
	s, err := h.st.SubscriptionByKey(h.ctx, "default", "demo", uri)
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) versionDigests(subID int64) []string {
	h.t.Helper()
	vs, err := h.st.Versions(h.ctx, subID)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, v := range vs {
		out = append(out, v.Digest)
	}
	return out
}

func (h *harness) receiptKinds(subID int64) map[mcpsync.ReceiptKind]int {
	h.t.Helper()
	rs, err := h.st.Receipts(h.ctx, subID)
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[mcpsync.ReceiptKind]int{}
	for _, r := range rs {
		out[r.Kind]++
	}
	return out
}

func (h *harness) dispatchReasons(subID int64) []mcpsync.ReadReason {
	h.t.Helper()
	rows, err := h.st.Pool().Query(h.ctx, `SELECT reason FROM read_dispatches WHERE subscription_id = $1 ORDER BY ordinal`, subID)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rows.Close()
	var out []mcpsync.ReadReason
	for rows.Next() {
		var r mcpsync.ReadReason
		if err := rows.Scan(&r); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// Subscribe → initial read accepted → notification → new content accepted → unsubscribe →
// CLOSED, with bodies only as digests.
func TestSubscriptionHappyPath(t *testing.T) {
	h := newHarness(t)
	h.at(time.Minute, func() {
		h.mcp.set("v2")
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
	})
	h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	v := h.run()
	if v.State != mcpsync.StateClosed {
		t.Errorf("final state %s, want CLOSED", v.State)
	}
	sub := h.sub()
	want := []string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v2"))}
	if diff := cmp.Diff(want, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("accepted digests (-want +got):\n%s", diff)
	}
	if sub.State != mcpsync.StateClosed || sub.LastAcceptedOrdinal != 2 || *sub.CloseOrdinal != 2 {
		t.Errorf("ledger: state %s watermark %d close ordinal %v", sub.State, sub.LastAcceptedOrdinal, *sub.CloseOrdinal)
	}
	if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification}, h.dispatchReasons(sub.ID)); diff != "" {
		t.Errorf("read reasons (-want +got):\n%s", diff)
	}
	if len(h.mcp.subscribes) != 1 || len(h.mcp.unsubscribes) != 1 {
		t.Errorf("MCP subscribe/unsubscribe calls: %d/%d, want 1/1", len(h.mcp.subscribes), len(h.mcp.unsubscribes))
	}
	if v.Counters.Accepted != 2 || v.Counters.Reads != 2 || v.Counters.Notifications != 1 {
		t.Errorf("counters: %+v", v.Counters)
	}
}

// R13: a hundred pulses arriving together cause the read they trigger plus exactly one
// follow-up read, however many arrive while it is in flight.
func TestPulsesDuringReadCoalesce(t *testing.T) {
	h := newHarness(t)
	h.at(time.Minute, func() {
		h.mcp.set("v2")
		for i := int64(1); i <= 100; i++ {
			h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: i, ServerURI: uri})
		}
	})
	h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	v := h.run()
	if v.Counters.Notifications != 100 {
		t.Errorf("notifications counted %d, want 100", v.Counters.Notifications)
	}
	got := h.dispatchReasons(h.sub().ID)
	if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification, mcpsync.ReasonNotification}, got); diff != "" {
		t.Errorf("reads (-want +got):\n%s", diff)
	}
}

// R13, R27: pulses that reached the host before it sent the read are covered by that read —
// a storm of duplicates costs one read; a pulse that arrived after the read was sent still
// causes exactly one follow-up read.
func TestPulsesCoveredByReadAreNotReread(t *testing.T) {
	sent := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		arrivals  []time.Duration // relative to the read's send time
		wantReads []mcpsync.ReadReason
		covered   int64
	}{
		{"100 duplicates before the read was sent", repeat(-time.Millisecond, 100), []mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification}, 99},
		{"one pulse after the read was sent", append(repeat(-time.Millisecond, 50), time.Millisecond), []mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification, mcpsync.ReasonNotification}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			// The initial read was sent long before the pulses; the reads they trigger at sent.
			h.mcp.sentAt = sent.Add(-time.Hour)
			h.at(time.Minute, func() {
				h.mcp.set("v2")
				h.mcp.setSentAt(sent)
				for i, d := range tt.arrivals {
					h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation,
						Seq: int64(i + 1), ServerURI: uri, Pulses: 1, ReceivedAt: sent.Add(d)})
				}
			})
			h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
			v := h.run()
			if diff := cmp.Diff(tt.wantReads, h.dispatchReasons(h.sub().ID)); diff != "" {
				t.Errorf("reads (-want +got):\n%s", diff)
			}
			if v.Counters.PulsesCovered != tt.covered {
				t.Errorf("covered pulses %d, want %d", v.Counters.PulsesCovered, tt.covered)
			}
		})
	}
}

// R13, R27: copies of a notification that the host received before it sent a read, but that
// reach the workflow only after that read answered, are covered by it: they cost no read of
// their own. A copy received after the read was sent still causes one.
func TestPulsesDeliveredAfterTheReadAreCovered(t *testing.T) {
	sent := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		late      []time.Duration // host arrival of the late copies, relative to the read's send time
		wantReads []mcpsync.ReadReason
		covered   int64
	}{
		{"late copies received before the read was sent", repeat(-time.Millisecond, 20),
			[]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification}, 20},
		{"a copy received after the read was sent", []time.Duration{time.Millisecond},
			[]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification, mcpsync.ReasonNotification}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.mcp.sentAt = sent.Add(-time.Hour)
			h.at(time.Minute, func() {
				h.mcp.set("v2")
				h.mcp.setSentAt(sent)
				h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation,
					Seq: 1, ServerURI: uri, Pulses: 1, ReceivedAt: sent.Add(-2 * time.Millisecond)})
			})
			h.at(time.Minute+10*time.Second, func() {
				for i, d := range tt.late {
					h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation,
						Seq: int64(i + 2), ServerURI: uri, Pulses: 1, ReceivedAt: sent.Add(d)})
				}
			})
			h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
			v := h.run()
			if diff := cmp.Diff(tt.wantReads, h.dispatchReasons(h.sub().ID)); diff != "" {
				t.Errorf("reads (-want +got):\n%s", diff)
			}
			if v.Counters.PulsesCovered != tt.covered {
				t.Errorf("covered pulses %d, want %d", v.Counters.PulsesCovered, tt.covered)
			}
		})
	}
}

func repeat(d time.Duration, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = d
	}
	return out
}

// R18, R19: an unsubscribe arriving while a read is in flight passes the close fence first;
// the read's late content only leaves a STALE_AFTER_CLOSE receipt.
func TestCloseRacingAccept(t *testing.T) {
	h := newHarness(t)
	h.at(time.Minute, func() {
		h.mcp.set("v2")
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
		h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"})
	})
	v := h.run()
	sub := h.sub()
	if v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
		t.Fatalf("state %s / ledger %s, want CLOSED", v.State, sub.State)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1"))}, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if *sub.CloseOrdinal != 2 || sub.LastIssuedOrdinal != 2 {
		t.Errorf("close ordinal %d, last issued %d: the racing read (2) was dispatched before the fence", *sub.CloseOrdinal, sub.LastIssuedOrdinal)
	}
	if k := h.receiptKinds(sub.ID); k[mcpsync.ReceiptKind(mcpsync.OutcomeStaleAfterClose)] != 1 || k[mcpsync.ReceiptKind(mcpsync.OutcomeAccepted)] != 1 {
		t.Errorf("receipts %v: want one ACCEPTED and one STALE_AFTER_CLOSE", k)
	}
}

// R20: a lost unsubscribe acknowledgement leads to UNSUBSCRIBE_UNKNOWN, silent locally, and a
// retry on the same session closes; the subscription is never ACTIVE again.
func TestUnsubscribeAckLost(t *testing.T) {
	h := newHarness(t)
	h.mcp.unsubscribeErrs = []error{errors.New("timeout waiting for the unsubscribe response")}
	h.at(time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	h.at(90*time.Second, func() {
		// A notification while UNSUBSCRIBE_UNKNOWN causes nothing.
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
	})
	v := h.run()
	sub := h.sub()
	if v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
		t.Fatalf("state %s / ledger %s", v.State, sub.State)
	}
	if len(h.mcp.unsubscribes) != 2 {
		t.Errorf("unsubscribe attempts %d, want 2", len(h.mcp.unsubscribes))
	}
	for _, c := range h.mcp.unsubscribes {
		if c.SessionGeneration != h.sess.Generation {
			t.Errorf("unsubscribe retried on generation %d, want the same session %d", c.SessionGeneration, h.sess.Generation)
		}
	}
	if k := h.receiptKinds(sub.ID); k[mcpsync.ReceiptUnsubscribeUnknown] != 1 || k[mcpsync.ReceiptClosed] != 1 {
		t.Errorf("receipts %v", k)
	}
	if len(h.mcp.reads) != 1 {
		t.Errorf("reads %d: a notification after the close fence caused a read", len(h.mcp.reads))
	}
}

// R12: a new session generation makes the subscription re-subscribe on it and re-read with
// reason session_change.
func TestSessionChangeResubscribes(t *testing.T) {
	h := newHarness(t)
	var next ledger.Session
	h.at(time.Minute, func() {
		var err error
		next, _, err = h.st.OpenSession(h.ctx, h.src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
		if err != nil {
			t.Error(err)
		}
		h.mcp.set("v2")
		h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: next.Generation})
	})
	h.at(2*time.Minute, func() {
		// A late notification of the old session is ignored.
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 7, ServerURI: uri})
	})
	h.at(3*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	v := h.run()
	sub := h.sub()
	if sub.SessionGeneration != next.Generation {
		t.Errorf("bound to session %d, want %d", sub.SessionGeneration, next.Generation)
	}
	if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonSessionChange}, h.dispatchReasons(sub.ID)); diff != "" {
		t.Errorf("reads (-want +got):\n%s", diff)
	}
	if len(h.mcp.subscribes) != 2 || h.mcp.subscribes[1].SessionGeneration != next.Generation {
		t.Errorf("subscribes: %+v", h.mcp.subscribes)
	}
	if v.Counters.NotificationsStale != 1 {
		t.Errorf("stale notifications %d, want 1", v.Counters.NotificationsStale)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v2"))}, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
}

// Subscribing to a source without a live session waits, then proceeds once one exists.
func TestWaitsForSession(t *testing.T) {
	h := newHarness(t)
	if err := h.st.EndSession(h.ctx, h.src.ID, h.sess.Generation, "test"); err != nil {
		t.Fatal(err)
	}
	h.at(time.Minute, func() {
		s, _, err := h.st.OpenSession(h.ctx, h.src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
		if err != nil {
			t.Error(err)
		}
		h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: s.Generation})
	})
	h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	h.run()
	if got := h.versionDigests(h.sub().ID); len(got) != 1 {
		t.Errorf("versions %v, want the initial one after the session appeared", got)
	}
	if h.sub().SessionGeneration != h.sess.Generation+1 {
		t.Errorf("session generation %d", h.sub().SessionGeneration)
	}
}

// Backstop re-reads converge a lost notification (R28), without new versions when unchanged.
func TestBackstopReads(t *testing.T) {
	h := newHarness(t)
	h.at(10*time.Second, func() { h.mcp.set("v2") }) // changed, notification lost
	h.at(5*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	in := h.input()
	in.BackstopSeconds = 60
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	sub := h.sub()
	reasons := h.dispatchReasons(sub.ID)
	if len(reasons) < 4 || reasons[1] != mcpsync.ReasonBackstop {
		t.Errorf("reads %v: want initial then backstop reads about every 60s", reasons)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v2"))}, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if k := h.receiptKinds(sub.ID); k[mcpsync.ReceiptKind(mcpsync.OutcomeRevalidated)] != len(reasons)-2 {
		t.Errorf("receipts %v for %d reads: unchanged backstop reads should revalidate", k, len(reasons))
	}
}
