package workflows_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// modernSession opens a 2026-07-28 session for the harness's source (subscriptions ride on
// subscriptions/listen there) and makes the fake subscribe answer notAcknowledged.
func (h *harness) modernSession(notAcknowledged bool) {
	h.t.Helper()
	sess, _, err := h.st.OpenSession(h.ctx, h.src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20260728, Resources: true, Subscribe: true})
	if err != nil {
		h.t.Fatal(err)
	}
	h.sess = sess
	h.env.RegisterActivityWithOptions(func(ctx context.Context, c contract.SessionCall) (contract.SubscribeOutput, error) {
		if err := h.mcp.subscribe(ctx, c); err != nil {
			return contract.SubscribeOutput{}, err
		}
		return contract.SubscribeOutput{NotAcknowledged: notAcknowledged}, nil
	}, activity.RegisterOptions{Name: contract.ActMCPSubscribe, DisableAlreadyRegisteredCheck: true})
}

// Issue 13 item 3 (R9, R11): a URI the server left out of its subscriptions/listen
// acknowledgement is not watched: the subscription polls at the poll period (not the
// backstop), the ledger records it as not acknowledged, and closing still releases the URI
// from the host's listen set (an unsubscribe is sent to the host).
func TestNotAcknowledgedPolls(t *testing.T) {
	h := newHarness(t)
	h.modernSession(true)
	h.at(150*time.Second, func() { h.mcp.set("v2") })
	var during ledger.Subscription
	h.at(9*time.Minute, func() { during = h.sub() })
	h.at(10*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	in := h.input()
	in.BackstopSeconds, in.PollSeconds = 3600, 60
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if !during.NotAcknowledged || during.State != mcpsync.StateActive {
		t.Errorf("ledger while live: state %s, not acknowledged %v; want ACTIVE, true", during.State, during.NotAcknowledged)
	}
	reasons := h.dispatchReasons(h.sub().ID)
	if len(reasons) < 8 || reasons[0] != mcpsync.ReasonInitial {
		t.Fatalf("reads %v: want initial then a poll about every 48-72s for 10 minutes", reasons)
	}
	for _, r := range reasons[1:] {
		if r != mcpsync.ReasonPoll {
			t.Errorf("read reason %q, want poll", r)
		}
	}
	if got := len(h.versionDigests(h.sub().ID)); got != 2 {
		t.Errorf("versions %d, want 2 (v1, then v2 picked up by polling)", got)
	}
	if len(h.mcp.subscribes) != 1 || len(h.mcp.unsubscribes) != 1 {
		t.Errorf("subscribes %d, unsubscribes %d; want 1 and 1", len(h.mcp.subscribes), len(h.mcp.unsubscribes))
	}
}

// Issue 13 item 4 (R12): a listen stream that ended without its complete result is a new
// epoch on the same session generation: the subscription subscribes again on that generation
// and re-reads (reason session_change), picking up a change whose notification was lost; a
// repeated or older epoch does nothing more.
func TestListenEpochReestablishes(t *testing.T) {
	h := newHarness(t)
	h.modernSession(false)
	gen := h.sess.Generation
	h.at(time.Minute, func() {
		h.mcp.set("v2") // changed while the stream was down: its notification is lost
		h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: gen, ListenEpoch: 1})
	})
	h.at(2*time.Minute, func() {
		h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: gen, ListenEpoch: 1})     // repeated
		h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: gen - 1, ListenEpoch: 9}) // older generation
	})
	h.at(3*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	h.run()
	sub := h.sub()
	if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonSessionChange}, h.dispatchReasons(sub.ID)); diff != "" {
		t.Errorf("reads (-want +got):\n%s", diff)
	}
	if len(h.mcp.subscribes) != 2 || h.mcp.subscribes[1].SessionGeneration != gen {
		t.Errorf("subscribes %+v: want a second one on generation %d", h.mcp.subscribes, gen)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v2"))}, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if got := h.receiptKinds(sub.ID)[mcpsync.ReceiptReconciliationRequired]; got != 1 {
		t.Errorf("%d RECONCILIATION_REQUIRED receipts, want 1 (the epoch fences the reads in flight)", got)
	}
}
