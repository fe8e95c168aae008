package workflows_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows"
)

// update delivers u as the resource-updated workflow update and fails the test if the
// workflow rejects it or its handler fails.
func (h *harness) update(id string, u contract.ResourceUpdated) {
	h.env.UpdateWorkflow(contract.UpdateResourceUpdated, id, &testsuite.TestUpdateCallback{
		OnReject: func(err error) { h.t.Errorf("update %s rejected: %v", id, err) },
		OnAccept: func() {},
		OnComplete: func(_ any, err error) {
			if err != nil {
				h.t.Errorf("update %s failed: %v", id, err)
			}
		},
	}, u)
}

// A notification delivered as a workflow update (issue 16) is recorded as the signal of the
// same name is: each case runs once with signals and once with updates and must end with the
// same reads and counters.
func TestResourceUpdatedAsWorkflowUpdate(t *testing.T) {
	type send func(h *harness, id string, u contract.ResourceUpdated)
	deliveries := []struct {
		name string
		send send
	}{
		{"signal", func(h *harness, _ string, u contract.ResourceUpdated) { h.signal(contract.SignalResourceUpdated, u) }},
		{"update", func(h *harness, id string, u contract.ResourceUpdated) { h.update(id, u) }},
	}
	tests := []struct {
		name string
		// at sends the case's notifications one minute in, with new content on the server.
		at    func(h *harness, send send)
		reads []mcpsync.ReadReason
	}{
		{
			name: "one notification: one read of the new content",
			at: func(h *harness, send send) {
				send(h, "n1", contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
			},
			reads: []mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification},
		},
		{
			name: "reordered and duplicated: the older and the repeated one are stale",
			at: func(h *harness, send send) {
				send(h, "n3", contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 3, ServerURI: uri})
				send(h, "n2", contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 2, ServerURI: uri})
				send(h, "n3-again", contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 3, ServerURI: uri})
			},
			reads: []mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification},
		},
		{
			name: "a burst of fifty: one read and one follow-up (R13)",
			at: func(h *harness, send send) {
				for i := int64(1); i <= 50; i++ {
					send(h, fmt.Sprintf("n%d", i), contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: i, ServerURI: uri})
				}
			},
			reads: []mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification, mcpsync.ReasonNotification},
		},
	}
	for _, tt := range tests {
		results := map[string]string{}
		for _, d := range deliveries {
			t.Run(tt.name+"/"+d.name, func(t *testing.T) {
				h := newHarness(t)
				h.at(time.Minute, func() {
					h.mcp.set("v2")
					tt.at(h, d.send)
				})
				h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
				v := h.run()
				if v.State != mcpsync.StateClosed {
					t.Errorf("final state %s, want CLOSED", v.State)
				}
				sub := h.sub()
				if diff := cmp.Diff(tt.reads, h.dispatchReasons(sub.ID)); diff != "" {
					t.Errorf("read reasons (-want +got):\n%s", diff)
				}
				if got := h.versionDigests(sub.ID); len(got) != 2 {
					t.Errorf("accepted %d versions, want the initial one and the new content's", len(got))
				}
				c := v.Counters
				results[d.name] = fmt.Sprintf("notifications %d stale %d accepted %d", c.Notifications, c.NotificationsStale, c.Accepted)
			})
		}
		if diff := cmp.Diff(results["signal"], results["update"]); diff != "" {
			t.Errorf("%s: counters with signals and with updates differ (-signal +update):\n%s", tt.name, diff)
		}
	}
}

// A run continues as new once it has received UpdateThreshold updates, below the server's
// limit of updates per run, with every update it accepted recorded in the state it carries.
func TestUpdatesContinueAsNew(t *testing.T) {
	old := workflows.UpdateThreshold
	workflows.UpdateThreshold = 5
	t.Cleanup(func() { workflows.UpdateThreshold = old })
	h := newHarness(t)
	h.at(time.Minute, func() {
		for i := int64(1); i <= 5; i++ {
			h.update(fmt.Sprintf("n%d", i), contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: i, ServerURI: uri})
		}
	})
	h.at(time.Hour, h.env.CancelWorkflow)
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, h.input())
	var can *workflow.ContinueAsNewError
	if err := h.env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("run ended with %v, want continue-as-new after 5 updates", err)
	}
	var next contract.SubscriptionInput
	if err := converter.GetDefaultDataConverter().FromPayloads(can.Input, &next); err != nil {
		t.Fatal(err)
	}
	st := next.State
	if st == nil {
		t.Fatal("no state carried")
	}
	if st.LastNotificationSeq != 5 || st.Counters.Notifications != 5 {
		t.Errorf("carried last notification seq %d and %d notifications, want 5 and 5", st.LastNotificationSeq, st.Counters.Notifications)
	}
}
