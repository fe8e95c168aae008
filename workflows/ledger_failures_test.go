package workflows_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// failingTransition is a ledger transition activity failing its first calls with a permanent
// error (so the local activity does not retry them itself).
type failingTransition struct {
	real     func(context.Context, contract.TransitionInput) (contract.TransitionOutput, error)
	mu       sync.Mutex
	failures int
	calls    int
}

func (f *failingTransition) call(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
	f.mu.Lock()
	f.calls++
	fail := f.calls <= f.failures
	f.mu.Unlock()
	if fail {
		return contract.TransitionOutput{}, temporal.NewNonRetryableApplicationError("injected ledger failure", contract.ErrTypePermanent, nil)
	}
	return f.real(ctx, in)
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

// R18: an unsubscribe whose close fence fails is not dropped: the fence is tried again on the
// next turn (here the next backstop pulse) and the subscription closes.
func TestFailedCloseFenceIsRetried(t *testing.T) {
	h := newHarness(t)
	fence := &failingTransition{real: (&activities.Ledger{Store: h.st}).BeginUnsubscribe, failures: 1}
	h.env.RegisterActivityWithOptions(fence.call, activity.RegisterOptions{
		Name: contract.ActBeginUnsubscribe, DisableAlreadyRegisteredCheck: true})
	h.at(time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	// A dropped fence would leave the subscription ACTIVE for ever: give up after half an hour.
	h.at(30*time.Minute, h.env.CancelWorkflow)
	in := h.input()
	in.BackstopSeconds = 60
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
	if !h.env.IsWorkflowCompleted() {
		t.Fatal("workflow did not complete")
	}
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatalf("workflow error (the close fence was not retried): %v", err)
	}
	var v contract.StateView
	if err := h.env.GetWorkflowResult(&v); err != nil {
		t.Fatal(err)
	}
	if sub := h.sub(); v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
		t.Errorf("state %s / ledger %s, want CLOSED", v.State, sub.State)
	}
	if fence.calls != 2 {
		t.Errorf("BeginUnsubscribe called %d times, want 2", fence.calls)
	}
	if len(h.mcp.unsubscribes) != 1 {
		t.Errorf("MCP unsubscribes %d, want 1", len(h.mcp.unsubscribes))
	}
}
