package workflows_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
)

// setTunables shortens the workflow tunables for one test and restores them afterwards.
func setTunables(t *testing.T, historyThreshold int, sessionWait, unsubscribeRetry, establishRetry time.Duration) {
	t.Helper()
	old := []any{workflows.HistoryThreshold, workflows.SessionWaitMax, workflows.UnsubscribeRetryMax, workflows.EstablishRetryMax}
	workflows.HistoryThreshold, workflows.SessionWaitMax = historyThreshold, sessionWait
	workflows.UnsubscribeRetryMax, workflows.EstablishRetryMax = unsubscribeRetry, establishRetry
	t.Cleanup(func() {
		workflows.HistoryThreshold, workflows.SessionWaitMax = old[0].(int), old[1].(time.Duration)
		workflows.UnsubscribeRetryMax, workflows.EstablishRetryMax = old[2].(time.Duration), old[3].(time.Duration)
	})
}

// meterHistory makes the test environment's history length grow the way a server's does
// while a workflow loops: every timer it starts stands for eventsPerTimer events (timer
// started and fired, workflow tasks, the look-ups between). The test environment keeps no
// history of its own.
func meterHistory(h *harness, eventsPerTimer int) {
	timers := 0
	h.env.SetOnTimerScheduledListener(func(string, time.Duration) {
		timers++
		h.env.SetCurrentHistoryLength(timers * eventsPerTimer)
	})
}

// failingScan stands in for the reconciliation scan of a source that stays offline.
func failingScan(workflow.Context, contract.DiscoveryScanInput) (contract.DiscoveryScanResult, error) {
	return contract.DiscoveryScanResult{}, errors.New("source offline")
}

// switchableTransition is a ledger transition activity failing (as when Postgres is
// unreachable for longer than the local activity's ScheduleToClose) until it is healed.
type switchableTransition struct {
	real   func(context.Context, contract.TransitionInput) (contract.TransitionOutput, error)
	mu     sync.Mutex
	broken bool
	calls  int
}

func (f *switchableTransition) call(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	f.mu.Lock()
	f.calls++
	broken := f.broken
	f.mu.Unlock()
	if broken {
		return contract.TransitionOutput{}, errInjected()
	}
	return f.real(ctx, in)
}

func (f *switchableTransition) set(broken bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.broken = broken
}

// A subscription parked in a waiting state (no session, an unsubscribe whose acknowledgement
// is unknown, a deletion that cannot be reconciled, a close fence the ledger cannot pass)
// loops for as long as the outage lasts. It must continue as new from there, carrying its
// whole state, or Temporal terminates it at the history limit. Every run here but the last
// must end in continue-as-new from the waiting state within a bounded number of loop turns;
// the last one is let out of the waiting state and must close normally, honouring what the
// earlier runs carried.
func TestContinueAsNewFromEveryWaitingState(t *testing.T) {
	const (
		runs           = 4
		eventsPerTimer = 10
		// turns bounds the loop turns (timers) a run may take before it continues as new.
		turns = 30
		// bound cancels a run that never continues as new; on a server it would go on
		// until terminated at the history limit.
		bound = 6 * time.Hour
	)
	type fixture struct {
		fence, mark *switchableTransition
	}
	tests := []struct {
		name  string
		state mcpsync.State
		// perRun registers this case's fakes on every run's environment.
		perRun func(h *harness, f *fixture)
		// enter drives the first run into the waiting state.
		enter func(h *harness, f *fixture)
		// carried checks what the case needs carried through each continue-as-new.
		carried func(t *testing.T, st *contract.SubscriptionState)
		// release lets the last run out of the waiting state and closes it.
		release func(h *harness, f *fixture)
		// final, when set, checks the ledger after the last run.
		final func(t *testing.T, h *harness)
	}{
		{
			name:  "RECONCILIATION_REQUIRED waiting for a session",
			state: mcpsync.StateReconciliationRequired,
			enter: func(h *harness, _ *fixture) {
				h.at(time.Minute, func() {
					if err := h.st.EndSession(h.ctx, h.src.ID, h.sess.Generation, "source offline"); err != nil {
						h.t.Error(err)
					}
					h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
				})
			},
			carried: func(t *testing.T, st *contract.SubscriptionState) {
				if st.PendingUnsubscribe != "" {
					t.Errorf("pending unsubscribe %q, want none", st.PendingUnsubscribe)
				}
			},
			release: func(h *harness, _ *fixture) {
				h.at(time.Minute, func() {
					s, _, err := h.st.OpenSession(h.ctx, h.src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
					if err != nil {
						h.t.Error(err)
					}
					h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: s.Generation})
				})
				h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u-final"}) })
			},
		},
		{
			name:  "RECONCILIATION_REQUIRED with an unsubscribe the close fence cannot pass",
			state: mcpsync.StateReconciliationRequired,
			perRun: func(h *harness, f *fixture) {
				h.env.RegisterActivityWithOptions(f.fence.call, activity.RegisterOptions{
					Name: contract.ActBeginUnsubscribe, DisableAlreadyRegisteredCheck: true})
			},
			enter: func(h *harness, f *fixture) {
				h.at(time.Minute, func() {
					if err := h.st.EndSession(h.ctx, h.src.ID, h.sess.Generation, "source offline"); err != nil {
						h.t.Error(err)
					}
					h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
				})
				h.at(2*time.Minute, func() {
					f.fence.set(true)
					h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1", Reason: "by the operator"})
				})
			},
			carried: func(t *testing.T, st *contract.SubscriptionState) {
				if st.PendingUnsubscribe != "unsubscribed: by the operator" || st.CloseFenceFailures == 0 {
					t.Errorf("pending unsubscribe %q after %d failed fences, want the operator's unsubscribe carried", st.PendingUnsubscribe, st.CloseFenceFailures)
				}
				if diff := cmp.Diff([]string{"u1"}, st.LastSignalIDs); diff != "" {
					t.Errorf("dedupe IDs (-want +got):\n%s", diff)
				}
			},
			// No new signal: the unsubscribe carried from the first run closes it.
			release: func(_ *harness, f *fixture) { f.fence.set(false) },
		},
		{
			name:  "RECONCILIATION_REQUIRED with a reconciliation mark the ledger cannot record",
			state: mcpsync.StateReconciliationRequired,
			perRun: func(h *harness, f *fixture) {
				h.env.RegisterActivityWithOptions(f.mark.call, activity.RegisterOptions{
					Name: contract.ActMarkReconciliationRequired, DisableAlreadyRegisteredCheck: true})
			},
			enter: func(h *harness, f *fixture) {
				// An earlier run left the ledger row ACTIVE; this one must mark it before it
				// may subscribe again (R12), and the ledger is unreachable.
				sub, err := h.st.EnsureSubscription(h.ctx, ledger.EnsureSpec{Principal: "default", SourceID: h.src.ID, URI: uri, ServerURI: uri, WorkflowID: "earlier-run"})
				if err != nil {
					h.t.Fatal(err)
				}
				for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){h.st.BeginSubscribe, h.st.Activate} {
					if r, err := step(h.ctx, sub.ID, sub.Generation, h.sess.Generation); err != nil || !r.Outcome.OK() {
						h.t.Fatalf("earlier run: %+v %v", r, err)
					}
				}
				f.mark.set(true)
			},
			carried: func(t *testing.T, st *contract.SubscriptionState) {
				if st.PendingMark == "" || st.NextReason != mcpsync.ReasonReconcile {
					t.Errorf("pending mark %q, next read reason %q: want the failed mark and the reconcile read carried", st.PendingMark, st.NextReason)
				}
			},
			release: func(h *harness, f *fixture) {
				f.mark.set(false)
				h.at(10*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u-final"}) })
			},
			final: func(t *testing.T, h *harness) {
				if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonReconcile}, h.dispatchReasons(h.sub().ID)); diff != "" {
					t.Errorf("read reasons (-want +got):\n%s", diff)
				}
				if len(h.mcp.subscribes) != 1 {
					t.Errorf("MCP subscribes %d, want 1: the subscription was not established again", len(h.mcp.subscribes))
				}
			},
		},
		{
			name:  "UNSUBSCRIBE_UNKNOWN",
			state: mcpsync.StateUnsubscribeUnknown,
			enter: func(h *harness, _ *fixture) {
				h.mcp.mu.Lock()
				for range 10000 {
					h.mcp.unsubscribeErrs = append(h.mcp.unsubscribeErrs, errors.New("timeout waiting for the unsubscribe response"))
				}
				h.mcp.mu.Unlock()
				h.at(time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
			},
			carried: func(t *testing.T, st *contract.SubscriptionState) {
				if st.UnsubscribeAttempts < 2 || st.CloseEpoch == 0 {
					t.Errorf("unsubscribe attempts %d, close epoch %d: the close was not carried", st.UnsubscribeAttempts, st.CloseEpoch)
				}
			},
			release: func(h *harness, _ *fixture) {
				h.mcp.mu.Lock()
				h.mcp.unsubscribeErrs = nil
				h.mcp.mu.Unlock()
			},
		},
		{
			name:  "TOMBSTONE_PENDING",
			state: mcpsync.StateTombstonePending,
			perRun: func(h *harness, _ *fixture) {
				h.env.RegisterWorkflowWithOptions(failingScan, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
			},
			enter: func(h *harness, _ *fixture) {
				h.at(time.Minute, func() {
					h.mcp.mu.Lock()
					h.mcp.notFound = true
					h.mcp.mu.Unlock()
					h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
				})
			},
			carried: func(t *testing.T, st *contract.SubscriptionState) {
				if st.TombstoneAttempts == 0 || st.LastAcceptedOrdinal != 1 {
					t.Errorf("tombstone attempts %d, watermark %d: the pending deletion was not carried", st.TombstoneAttempts, st.LastAcceptedOrdinal)
				}
			},
			release: func(h *harness, _ *fixture) {
				h.at(time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u-final"}) })
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setTunables(t, turns*eventsPerTimer, 30*time.Second, 30*time.Second, time.Minute)
			h := newHarness(t)
			led := &activities.Ledger{Store: h.st}
			f := &fixture{fence: &switchableTransition{real: led.BeginUnsubscribe}, mark: &switchableTransition{real: led.MarkReconciliationRequired}}
			in := h.input()
			attempts := 0
			for run := 1; run <= runs; run++ {
				if run > 1 {
					h = h.fresh()
				}
				if tt.perRun != nil {
					tt.perRun(h, f)
				}
				switch run {
				case 1:
					tt.enter(h, f)
				case runs:
					tt.release(h, f)
				}
				meterHistory(h, eventsPerTimer)
				h.at(bound, h.env.CancelWorkflow)
				h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
				if !h.env.IsWorkflowCompleted() {
					t.Fatalf("run %d did not complete", run)
				}
				err := h.env.GetWorkflowError()
				if run == runs {
					if err != nil {
						t.Fatalf("last run: %v", err)
					}
					var v contract.StateView
					if err := h.env.GetWorkflowResult(&v); err != nil {
						t.Fatal(err)
					}
					if sub := h.sub(); v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
						t.Errorf("last run ended %s / ledger %s, want CLOSED", v.State, sub.State)
					}
					if v.ContinuedAsNew != runs-1 {
						t.Errorf("continued as new %d times, want %d", v.ContinuedAsNew, runs-1)
					}
					if tt.final != nil {
						tt.final(t, h)
					}
					break
				}
				var can *workflow.ContinueAsNewError
				if !errors.As(err, &can) {
					t.Fatalf("run %d: no continue-as-new from %s within %d loop turns (%s of workflow time); ended with %v", run, tt.state, turns, bound, err)
				}
				var next contract.SubscriptionInput
				if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
					t.Fatal(err)
				}
				st := next.State
				if st == nil || st.Machine != tt.state || st.ContinuedAsNew != run || st.SubscriptionID != h.sub().ID {
					t.Fatalf("run %d carried %+v, want %s after %d continue-as-new", run, st, tt.state, run)
				}
				if st.TombstoneAttempts+st.UnsubscribeAttempts+st.EstablishFailures+st.CloseFenceFailures < attempts {
					t.Errorf("run %d: retry counters went back (%d < %d)", run, st.TombstoneAttempts+st.UnsubscribeAttempts+st.EstablishFailures+st.CloseFenceFailures, attempts)
				}
				attempts = st.TombstoneAttempts + st.UnsubscribeAttempts + st.EstablishFailures + st.CloseFenceFailures
				tt.carried(t, st)
				in = next
			}
		})
	}
}
