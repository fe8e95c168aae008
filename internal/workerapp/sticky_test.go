package workerapp_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.temporal.io/server/temporaltest"

	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// stickyHold is how long the blocker's workflow task keeps its workflow-task slot: longer
// than the SDK's default sticky schedule-to-start timeout (5 s), shorter than mcpsync's.
const stickyHold = 9 * time.Second

// stickyWaiter ends on its signal "go".
func stickyWaiter(ctx workflow.Context) error {
	workflow.GetSignalChannel(ctx, "go").Receive(ctx, nil)
	return nil
}

// stickyBlocker, on its signal "block", holds the slot of its workflow task for stickyHold:
// its code does not yield meanwhile.
func stickyBlocker(ctx workflow.Context) error {
	workflow.GetSignalChannel(ctx, "block").Receive(ctx, nil)
	time.Sleep(stickyHold)
	return nil
}

// TestStickyTaskWaitsForABusyWorker: a workflow task queued on the worker's sticky queue while
// the worker is too busy to poll it for longer than the SDK's default sticky schedule-to-start
// timeout (5 s) waits for the worker, as under a sustained overload: it is not timed out and
// handed to the normal queue, where it would make a worker replay the workflow's whole history
// (the costly path behind the throughput bench's slow regime, issue 16). The worker runs with
// mcpsync's options but two workflow-task slots and two pollers: at rest one polls the sticky
// queue and one the normal queue, so when the blocker's task takes the sticky poller's slot,
// nothing polls the sticky queue until it ends.
func TestStickyTaskWaitsForABusyWorker(t *testing.T) {
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	c := ts.NewClientWithOptions(client.Options{Namespace: ts.GetDefaultNamespace()})
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	const queue = "sticky-test"
	opts := workerapp.WorkerOptions()
	opts.MaxConcurrentWorkflowTaskExecutionSize = 2
	opts.MaxConcurrentWorkflowTaskPollers = 2
	opts.DeadlockDetectionTimeout = time.Minute // the blocker does not yield, on purpose
	w := worker.New(c, queue, opts)
	w.RegisterWorkflow(stickyWaiter)
	w.RegisterWorkflow(stickyBlocker)
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)

	runs := map[string]client.WorkflowRun{}
	for id, wf := range map[string]any{"waiter": stickyWaiter, "blocker": stickyBlocker} {
		run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: queue,
			WorkflowTaskTimeout: time.Minute}, wf)
		if err != nil {
			t.Fatal(err)
		}
		runs[id] = run
		// Its first task ran on this worker, which now holds the workflow (sticky).
		waitForEvents(ctx, t, c, id, enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 1)
	}
	if err := c.SignalWorkflow(ctx, "blocker", "", "block", nil); err != nil {
		t.Fatal(err)
	}
	waitForEvents(ctx, t, c, "blocker", enumspb.EVENT_TYPE_WORKFLOW_TASK_STARTED, 2)
	signalled := time.Now()
	if err := c.SignalWorkflow(ctx, "waiter", "", "go", nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"waiter", "blocker"} {
		if err := runs[id].Get(ctx, nil); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if id == "waiter" {
			t.Logf("the waiter's signal was handled %s after it was sent", time.Since(signalled).Round(time.Millisecond))
		}
	}

	var scheduled []enumspb.TaskQueueKind
	it := c.GetWorkflowHistory(ctx, "waiter", "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch e.GetEventType() {
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
			scheduled = append(scheduled, e.GetWorkflowTaskScheduledEventAttributes().GetTaskQueue().GetKind())
		case enumspb.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
			t.Errorf("the waiter's workflow task timed out (%s) while the worker was busy",
				e.GetWorkflowTaskTimedOutEventAttributes().GetTimeoutType())
		}
	}
	// The first task on the normal queue, the signal's on the worker's sticky queue.
	want := []enumspb.TaskQueueKind{enumspb.TASK_QUEUE_KIND_NORMAL, enumspb.TASK_QUEUE_KIND_STICKY}
	if diff := cmp.Diff(want, scheduled); diff != "" {
		t.Errorf("queues of the waiter's workflow tasks (-want +got):\n%s", diff)
	}
}

// waitForEvents waits until workflow id's history has n events of type et.
func waitForEvents(ctx context.Context, t *testing.T, c client.Client, id string, et enumspb.EventType, n int) {
	t.Helper()
	for {
		it := c.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		seen := 0
		for it.HasNext() {
			e, err := it.Next()
			if err != nil {
				t.Fatal(err)
			}
			if e.GetEventType() == et {
				seen++
			}
		}
		if seen >= n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("workflow %s: %d %s events, want %d: %v", id, seen, et, n, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
