package workflows_test

import (
	"errors"
	"testing"
	"time"

	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R11: a server without resources.subscribe is polled with jitter; no subscribe is sent.
func TestPollingWithoutSubscribeCapability(t *testing.T) {
	h := newHarness(t)
	sess, _, err := h.st.OpenSession(h.ctx, h.src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true})
	if err != nil {
		t.Fatal(err)
	}
	h.sess = sess
	h.at(150*time.Second, func() { h.mcp.set("v2") })
	h.at(10*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	in := h.input()
	in.PollSeconds = 60
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
	if err := h.env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if len(h.mcp.subscribes) != 0 || len(h.mcp.unsubscribes) != 0 {
		t.Errorf("subscribe/unsubscribe sent to a server without the capability: %d/%d", len(h.mcp.subscribes), len(h.mcp.unsubscribes))
	}
	reasons := h.dispatchReasons(h.sub().ID)
	if len(reasons) < 8 || len(reasons) > 13 || reasons[0] != mcpsync.ReasonInitial {
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
}

// A long-lived subscription continues as new when the server suggests it and carries its whole
// state, counters included, so across 10,000 signals none is lost (counted by the workflow
// itself). The test environment delivers signals one at a time; draining signals that arrive
// in the same workflow task as the switch is proven on a real server (internal/harness/e2e).
func TestContinueAsNewLosesNoSignal(t *testing.T) {
	const total, perRun, batch = 10000, 2500, 50
	h := newHarness(t)
	in := h.input()
	sent := int64(0)
	runs := 0
	for {
		runs++
		if runs > 1 {
			h = h.fresh()
		}
		startCount := int64(0)
		if in.State != nil {
			startCount = in.State.Counters.Notifications
		}
		runSent := int64(0)
		last := sent == total
		var send func()
		send = func() {
			for i := 0; i < batch && sent < total; i++ {
				sent++
				runSent++
				h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: sent, ServerURI: uri})
			}
			switch {
			case sent == total:
				h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "final"})
			case runSent >= perRun:
				// The server suggests continuing as new; the next batch goes to the next run.
				h.at(time.Second, func() { h.env.SetContinueAsNewSuggested(true) })
			default:
				h.at(time.Second, send)
			}
		}
		if !last {
			h.at(time.Second, send)
		}
		h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
		err := h.env.GetWorkflowError()
		var can *workflow.ContinueAsNewError
		if errors.As(err, &can) {
			var next contract.SubscriptionInput
			if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
				t.Fatal(err)
			}
			got := next.State.Counters.Notifications - startCount
			if got != runSent {
				t.Fatalf("run %d: %d signals sent, %d counted in the carried state", runs, runSent, got)
			}
			in = next
			continue
		}
		if err != nil {
			t.Fatalf("run %d: %v", runs, err)
		}
		var v contract.StateView
		if err := h.env.GetWorkflowResult(&v); err != nil {
			t.Fatal(err)
		}
		if v.Counters.Notifications != total {
			t.Errorf("notifications counted %d, want %d", v.Counters.Notifications, total)
		}
		if v.State != mcpsync.StateClosed {
			t.Errorf("final state %s", v.State)
		}
		break
	}
	if runs < 4 {
		t.Errorf("%d runs, want at least 4 (continue-as-new every %d signals)", runs, perRun)
	}
	// Reads were coalesced: far fewer reads than notifications, each with a unique ordinal.
	reasons := h.dispatchReasons(h.sub().ID)
	if len(reasons) == 0 || len(reasons) > total/batch*2+runs*2 {
		t.Errorf("%d reads for %d notifications in batches of %d", len(reasons), total, batch)
	}
}
