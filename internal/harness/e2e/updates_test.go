package e2e_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/common/dynamicconfig"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// maxUpdatesPerRun makes the server admit at most n workflow updates per run
// (history.maxTotalUpdates); it suggests continue-as-new at 90 % of n.
func maxUpdatesPerRun(n int) stackOption {
	return func(c *stackConfig) {
		c.dc[dynamicconfig.WorkflowExecutionMaxTotalUpdates.Key()] = []dynamicconfig.ConstrainedValue{{Value: n}}
	}
}

// 2,000 notifications delivered as workflow updates (issue 16), 8 at a time, to one
// subscription on a real Temporal server that admits 400 updates per run: the workflow
// continues as new several times (the server suggests it at 360), each notification is
// delivered once — as an update, or as a signal when a run is at the server's limit — and
// counted once; reads stay coalesced.
func TestContinueAsNewUnderUpdateStorm(t *testing.T) {
	s := newStack(t, maxUpdatesPerRun(400))
	s.startChaosHTTP("ustorm", map[string]string{"demo://notes/1": "v1"})
	s.mustCLI("subscribe", "ustorm", "demo://notes/1")
	sub := s.waitDigest("ustorm", "demo://notes/1", ledger.Digest([]byte("v1")))

	var signalled atomic.Int64
	v, sent, counted := s.storm(sub, 2000, 4, func(u contract.ResourceUpdated) error {
		byUpdate, err := mcphost.DeliverNotification(s.ctx, s.tc, s.tc, sub.WorkflowID, u)
		if err == nil && !byUpdate {
			signalled.Add(1)
		}
		return err
	})
	t.Logf("2,000 notifications delivered in %s (%d as signals), all counted after %s; %d continue-as-new; %d reads",
		sent.Round(time.Millisecond), signalled.Load(), counted.Round(time.Millisecond), v.ContinuedAsNew, v.Counters.Reads)
}

// legacySubscription stands for a subscription workflow built before notifications came as
// workflow updates: it has no update handler and returns the first resource-updated signal.
func legacySubscription(ctx workflow.Context) (contract.ResourceUpdated, error) {
	var u contract.ResourceUpdated
	workflow.GetSignalChannel(ctx, contract.SignalResourceUpdated).Receive(ctx, &u)
	return u, nil
}

// During a rolling upgrade a workflow task may run on a worker without the update handler: the
// real worker rejects the update and the notification goes as the signal instead, which that
// workflow takes. Once the workflow has completed, a notification for it ends with NotFound.
func TestRejectedUpdateBecomesSignal(t *testing.T) {
	s := newStack(t, withoutWorker())
	const queue = "legacy"
	w := worker.New(s.tc, queue, worker.Options{})
	w.RegisterWorkflowWithOptions(legacySubscription, workflow.RegisterOptions{Name: "LegacySubscription"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	run, err := s.tc.ExecuteWorkflow(s.ctx, client.StartWorkflowOptions{ID: "legacy-1", TaskQueue: queue}, "LegacySubscription")
	if err != nil {
		t.Fatal(err)
	}
	sent := contract.ResourceUpdated{SessionGeneration: 3, Seq: 7, ServerURI: "demo://notes/1", Pulses: 2, ReceivedAt: time.Now().UTC().Round(0)}
	byUpdate, err := mcphost.DeliverNotification(s.ctx, s.tc, s.tc, "legacy-1", sent)
	if err != nil || byUpdate {
		t.Fatalf("delivered by update %v, error %v; want the signal after the rejection", byUpdate, err)
	}
	var got contract.ResourceUpdated
	if err := run.Get(s.ctx, &got); err != nil {
		t.Fatal(err)
	}
	if !got.ReceivedAt.Equal(sent.ReceivedAt) || got.Seq != sent.Seq || got.Pulses != sent.Pulses || got.ServerURI != sent.ServerURI {
		t.Errorf("the workflow received %+v, want %+v", got, sent)
	}
	_, err = mcphost.DeliverNotification(s.ctx, s.tc, s.tc, "legacy-1", contract.ResourceUpdated{SessionGeneration: 3, Seq: 8})
	if _, ok := errors.AsType[*serviceerror.NotFound](err); !ok {
		t.Errorf("delivering to a completed workflow: %v, want NotFound", err)
	}
}
