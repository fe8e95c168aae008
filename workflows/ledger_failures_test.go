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
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
)

// failingTransition is a ledger transition activity failing its first calls with a permanent
// error (so the local activity does not retry them itself).
type failingTransition struct {
	real     func(context.Context, contract.TransitionInput) (contract.TransitionOutput, error)
	mu       sync.Mutex
	failures int
	calls    int
	// now, when set, is the test environment's clock; the time of each call goes to at.
	now func() time.Time
	at  []time.Time
}

func (f *failingTransition) call(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	f.mu.Lock()
	f.calls++
	if f.now != nil {
		f.at = append(f.at, f.now())
	}
	fail := f.calls <= f.failures
	f.mu.Unlock()
	if fail {
		return contract.TransitionOutput{}, errInjected()
	}
	return f.real(ctx, in)
}

// errInjected is a ledger failure the local activity does not retry itself, as after its
// ScheduleToClose ran out with Postgres unreachable.
func errInjected() error {
	return temporal.NewNonRetryableApplicationError("injected ledger failure", contract.ErrTypePermanent, nil)
}

// A run started over a ledger row an earlier run left ACTIVE marks it RECONCILIATION_REQUIRED
// and subscribes again with a reconcile read (R12). A mark that fails is retried before the
// next subscribe attempt: were it dropped, the ledger would stay ACTIVE and refuse every
// BeginSubscribe, and the subscription would never be established again.
func TestFailedReconciliationMarkIsRetried(t *testing.T) {
	tests := []struct {
		name     string
		failures int
	}{
		{"mark succeeds", 0},
		{"first mark fails", 1},
		{"first two marks fail", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			sub, err := h.st.EnsureSubscription(h.ctx, ledger.EnsureSpec{Principal: "default", SourceID: h.src.ID, URI: uri, ServerURI: uri, WorkflowID: "earlier-run"})
			if err != nil {
				t.Fatal(err)
			}
			for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){h.st.BeginSubscribe, h.st.Activate} {
				if r, err := step(h.ctx, sub.ID, sub.Generation, h.sess.Generation); err != nil || !r.Outcome.OK() {
					t.Fatalf("earlier run: %+v %v", r, err)
				}
			}
			marks := &failingTransition{real: (&activities.Ledger{Store: h.st}).MarkReconciliationRequired, failures: tt.failures}
			h.env.RegisterActivityWithOptions(marks.call, activity.RegisterOptions{
				Name: contract.ActMarkReconciliationRequired, DisableAlreadyRegisteredCheck: true})
			h.at(10*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
			v := h.run()
			if v.State != mcpsync.StateClosed {
				t.Errorf("final state %s, want CLOSED", v.State)
			}
			if marks.calls != tt.failures+1 {
				t.Errorf("MarkReconciliationRequired called %d times, want %d", marks.calls, tt.failures+1)
			}
			if len(h.mcp.subscribes) != 1 {
				t.Errorf("MCP subscribes %d, want 1: the subscription was not established again", len(h.mcp.subscribes))
			}
			if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonReconcile}, h.dispatchReasons(sub.ID)); diff != "" {
				t.Errorf("read reasons (-want +got):\n%s", diff)
			}
			if k := h.receiptKinds(sub.ID); k[mcpsync.ReceiptReconciliationRequired] != 1 {
				t.Errorf("receipts %v: want one RECONCILIATION_REQUIRED", k)
			}
		})
	}
}

// R18: an unsubscribe or revocation whose close fence fails is never dropped: the fence is
// tried again after a capped backoff (1 s doubling to UnsubscribeRetryMax), not on some
// later pulse (the backstop here is an hour), until it passes; a close still pending when the
// run continues as new is carried and passed by the next run, with no new signal. Times are
// the test environment's clock.
func TestFailedCloseFenceIsRetried(t *testing.T) {
	const retryMax = 4 * time.Second
	tests := []struct {
		name     string
		signal   string
		failures int
		// canAfter, when set, has the server suggest continue-as-new this long after the
		// close request, while the fence is still failing.
		canAfter time.Duration
		// wantGaps are the backoffs between attempts.
		wantGaps []time.Duration
	}{
		{"unsubscribe, fence fails once", contract.SignalUnsubscribe, 1, 0, []time.Duration{time.Second}},
		{"revoke, fence fails five times, backoff capped", contract.SignalRevoke, 5, 0,
			[]time.Duration{time.Second, 2 * time.Second, retryMax, retryMax, retryMax}},
		{"fence still failing at continue-as-new", contract.SignalUnsubscribe, 3, 2 * time.Second, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setTunables(t, workflows.HistoryThreshold, workflows.SessionWaitMax, retryMax, workflows.EstablishRetryMax)
			h := newHarness(t)
			fence := &failingTransition{real: (&activities.Ledger{Store: h.st}).BeginUnsubscribe, failures: tt.failures}
			in := h.input()
			in.BackstopSeconds = 3600
			var requested time.Time
			runs := 0
			for {
				runs++
				if runs > 1 {
					h = h.fresh()
				}
				env := h.env
				fence.mu.Lock()
				fence.now = env.Now
				fence.mu.Unlock()
				h.env.RegisterActivityWithOptions(fence.call, activity.RegisterOptions{
					Name: contract.ActBeginUnsubscribe, DisableAlreadyRegisteredCheck: true})
				if runs == 1 {
					h.at(time.Minute, func() {
						requested = env.Now()
						h.signal(tt.signal, contract.Unsubscribe{ID: "c1"})
					})
					if tt.canAfter > 0 {
						h.at(time.Minute+tt.canAfter, func() { env.SetContinueAsNewSuggested(true) })
					}
				}
				// A dropped close would leave the subscription ACTIVE: give up after an hour.
				h.at(time.Hour, h.env.CancelWorkflow)
				h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
				if !h.env.IsWorkflowCompleted() {
					t.Fatal("workflow did not complete")
				}
				err := h.env.GetWorkflowError()
				var can *workflow.ContinueAsNewError
				if errors.As(err, &can) && runs == 1 {
					var next contract.SubscriptionInput
					if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
						t.Fatal(err)
					}
					if st := next.State; st == nil || st.PendingUnsubscribe == "" || st.CloseFenceFailures == 0 || st.Machine != mcpsync.StateActive {
						t.Fatalf("continued as new with %+v, want the failed close request carried", st)
					}
					in = next
					continue
				}
				if err != nil {
					t.Fatalf("run %d: workflow error (the close fence was not retried): %v", runs, err)
				}
				break
			}
			var v contract.StateView
			if err := h.env.GetWorkflowResult(&v); err != nil {
				t.Fatal(err)
			}
			if sub := h.sub(); v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
				t.Errorf("state %s / ledger %s, want CLOSED", v.State, sub.State)
			}
			if fence.calls != tt.failures+1 {
				t.Errorf("BeginUnsubscribe called %d times, want %d", fence.calls, tt.failures+1)
			}
			if len(h.mcp.unsubscribes) != 1 {
				t.Errorf("MCP unsubscribes %d, want 1", len(h.mcp.unsubscribes))
			}
			if tt.canAfter > 0 {
				if runs != 2 {
					t.Errorf("%d runs, want the close carried into a second run", runs)
				}
				return
			}
			if len(fence.at) == 0 || !fence.at[0].Equal(requested) {
				t.Fatalf("attempts at %v, want the first at the request (%v)", fence.at, requested)
			}
			var gaps []time.Duration
			for i := 1; i < len(fence.at); i++ {
				gaps = append(gaps, fence.at[i].Sub(fence.at[i-1]).Round(time.Second))
			}
			if diff := cmp.Diff(tt.wantGaps, gaps); diff != "" {
				t.Errorf("backoff between close fence attempts (-want +got):\n%s", diff)
			}
		})
	}
}
