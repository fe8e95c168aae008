package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/histstats"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/searchattr"
	"github.com/mcpsync/mcpsync/internal/workerapp"
	"github.com/mcpsync/mcpsync/workflows"
)

// localReadChange is the change ID of the local-read patch (workflows/subscription_reads.go,
// versionLocalRead).
const localReadChange = "local-read"

// updateCosts makes n notified updates of uri on srv, each awaited until accepted, then
// unsubscribes, waits for the workflow to complete, and returns what each update cost in its
// history (internal/harness/histstats) with the final counters.
func (s *stack) updateCosts(source, uri string, set func(body string), n int) ([]histstats.Update, contract.StateView, string) {
	s.t.Helper()
	var sub ledger.Subscription
	for i := 2; i < n+2; i++ {
		body := fmt.Sprintf("v%d", i)
		set(body)
		sub = s.waitDigest(source, uri, ledger.Digest([]byte(body)))
	}
	v := s.waitView(sub.WorkflowID, "every read settled", func(v contract.StateView) bool {
		return v.State == mcpsync.StateActive &&
			v.Counters.Reads == v.Counters.Accepted+v.Counters.Revalidated+v.Counters.Refused+v.Counters.NotFound+v.Counters.ReadFailures
	})
	s.mustCLI("unsubscribe", source, uri)
	eventually(s.t, 60*time.Second, "the subscription workflow completed", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, sub.WorkflowID, "")
		if err != nil {
			return false, err.Error()
		}
		st := d.GetWorkflowExecutionInfo().GetStatus()
		return st == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, st.String()
	})
	us, err := histstats.Updates(s.history(sub.WorkflowID))
	if err != nil {
		s.t.Fatal(err)
	}
	return us, v, sub.WorkflowID
}

// Issue 16 item 2: on the worker that holds the session, a notified update costs ONE workflow
// task: the workflow task that accepts the notification's workflow update runs the fast path
// (allocate, read, accept in one local activity) and nothing else. Counted in the real
// history: WorkflowTaskCompleted events from each notification to its accepted version; every
// notification came as a workflow update, none as a signal. With -record-histories the
// subscription's history is written to workflows/testdata/histories as local-read-update-v1-NN
// (local-read-v1-NN is the same test's history from when notifications were signals).
func TestHistoriesLocalRead(t *testing.T) {
	s := newStack(t)
	const uri = "demo://notes/1"
	srv := s.startChaosHTTP("fast", map[string]string{uri: "v1"})
	s.mustCLI("subscribe", "fast", uri)
	s.waitDigest("fast", uri, ledger.Digest([]byte("v1")))

	const n = 5
	us, v, wfID := s.updateCosts("fast", uri, func(b string) { srv.Set(uri, b, "text/plain") }, n)
	if n := s.replayHistories(map[string]string{contract.SubscriptionWorkflowName: "local-read-update-v1"})[contract.SubscriptionWorkflowName]; n != 1 {
		t.Errorf("%d subscription executions, want 1", n)
	}
	if signals, updates := notificationsIn(s.history(wfID)); signals != 0 || updates < n {
		t.Errorf("%d resource-updated signals and %d workflow updates in the history, want none and at least %d", signals, updates, n)
	}
	if diff := cmp.Diff([]string{localReadChange + "=1"}, versionMarkers(t, s.history(wfID), localReadChange)); diff != "" {
		t.Errorf("version markers (-want +got):\n%s", diff)
	}
	if len(us) < n {
		t.Fatalf("%d accepted updates found in the history, want %d: %+v", len(us), n, us)
	}
	for i, u := range us {
		if !u.Local || u.WorkflowTasks != 1 {
			t.Errorf("update %d: local %v, %d workflow tasks, %d events; want the fast path in one workflow task", i, u.Local, u.WorkflowTasks, u.Events)
		}
	}
	events, wfts := histstats.Mean(us)
	t.Logf("fast path: %d accepted updates, %.1f history events and %.1f workflow tasks per update (%+v)", len(us), events, wfts, us)
	if v.Counters.ReadsLocal != v.Counters.Reads {
		t.Errorf("reads %d, of which on the fast path %d: want all", v.Counters.Reads, v.Counters.ReadsLocal)
	}
}

// Issue 16 item 2, the fallback: when the worker running the workflow task does not hold the
// session (it is on another worker), the fast path only allocates and the read goes to the
// session's host queue as before: two workflow tasks per update, every version accepted.
// Worker A runs only the session host and its host-queue activities; worker B runs the
// workflows and the ledger activities, and holds no session.
func TestLocalReadFallbackOnAnotherWorker(t *testing.T) {
	s := newStack(t, withoutWorker())
	if err := searchattr.Ensure(s.ctx, s.tc, s.ts.GetDefaultNamespace()); err != nil {
		t.Fatal(err)
	}
	queue := "host-a-" + strings.ReplaceAll(t.Name(), "/", "-")
	host := mcphost.New(mcphost.Options{Store: s.st, Signaler: s.tc, Queue: queue, Logger: s.log,
		SourceEvents:  workerapp.SourceEventSignaler(s.tc, s.log),
		ClaimInterval: 200 * time.Millisecond, Lease: 3 * time.Second,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, KeepAlive: stackKeepAlive})
	hctx, cancel := context.WithCancel(s.ctx)
	hostDone := make(chan struct{})
	go func() {
		defer close(hostDone)
		_ = host.Run(hctx)
	}()
	t.Cleanup(func() { cancel(); <-hostDone })
	a := worker.New(s.tc, queue, worker.Options{})
	(&activities.Session{Host: host, Store: s.st}).Register(a)
	(&activities.Discovery{Host: host, Store: s.st}).Register(a)
	b := worker.New(s.tc, contract.TaskQueue, worker.Options{})
	b.RegisterWorkflowWithOptions(workflows.SubscriptionWorkflow, workflow.RegisterOptions{Name: contract.SubscriptionWorkflowName})
	b.RegisterWorkflowWithOptions(workflows.SourceWorkflow, workflow.RegisterOptions{Name: contract.SourceWorkflowName})
	b.RegisterWorkflowWithOptions(workflows.DiscoveryScanWorkflow, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
	led := &activities.Ledger{Store: s.st}
	led.Register(b)
	(&activities.Catalog{Store: s.st}).Register(b)
	(&activities.LocalRead{Session: &activities.Session{Store: s.st}, Ledger: led}).Register(b)
	for _, w := range []worker.Worker{a, b} {
		if err := w.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(w.Stop)
	}

	const uri = "demo://notes/1"
	srv := s.startChaosHTTP("remote", map[string]string{uri: "v1"})
	s.mustCLI("subscribe", "remote", uri)
	s.waitDigest("remote", uri, ledger.Digest([]byte("v1")))
	const n = 3
	us, v, _ := s.updateCosts("remote", uri, func(b string) { srv.Set(uri, b, "text/plain") }, n)
	if len(us) < n {
		t.Fatalf("%d accepted updates found in the history, want %d: %+v", len(us), n, us)
	}
	for i, u := range us {
		if u.Local || u.WorkflowTasks != 2 {
			t.Errorf("update %d: local %v, %d workflow tasks, %d events; want the host queue in two workflow tasks", i, u.Local, u.WorkflowTasks, u.Events)
		}
	}
	events, wfts := histstats.Mean(us)
	t.Logf("fallback: %d accepted updates, %.1f history events and %.1f workflow tasks per update (%+v)", len(us), events, wfts, us)
	if v.Counters.ReadsLocal != 0 || v.Counters.Accepted < n+1 {
		t.Errorf("counters %+v: want every read on the host queue and every version accepted", v.Counters)
	}
	s.checkInvariants()
}

// notificationsIn counts the resource-updated signals and accepted workflow updates in hist.
func notificationsIn(hist *historypb.History) (signals, updates int) {
	for _, ev := range hist.GetEvents() {
		if a := ev.GetWorkflowExecutionSignaledEventAttributes(); a != nil && a.GetSignalName() == contract.SignalResourceUpdated {
			signals++
		}
		if a := ev.GetWorkflowExecutionUpdateAcceptedEventAttributes(); a != nil && a.GetAcceptedRequest().GetInput().GetName() == contract.UpdateResourceUpdated {
			updates++
		}
	}
	return signals, updates
}
