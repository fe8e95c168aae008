package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/histstats"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// localSubscribeChange is the change ID of the local-subscribe patch
// (workflows/subscription_establish.go, versionLocalSubscribe).
const localSubscribeChange = "local-subscribe"

// Issue 16 item 4: on the worker that holds the session, a subscription's start — ensure,
// BeginSubscribe, the subscribe on the session, Activate, and the first read allocated, read
// and accepted — costs ONE workflow task and no activity task: the subscribe runs as a local
// activity (LocalSubscribe) in the workflow task that the start scheduled, and the first read's
// fast path follows it there. Counted in the real history, from the start to the first
// accepted version. With -record-histories the history is written to
// workflows/testdata/histories as local-subscribe-v1-NN.
func TestHistoriesLocalSubscribe(t *testing.T) {
	s := newStack(t)
	const uri = "demo://notes/1"
	srv := s.startChaosHTTP("fast", map[string]string{uri: "v1"})
	// Subscribed once the session is live, in the ledger and on the host: a start before that
	// waits for it, which is a workflow task of its own.
	src := s.source("fast")
	gen := s.liveSession(s.worker(), src.ID, 0).Generation()
	eventually(t, 30*time.Second, "the ledger's live session", func() (bool, string) {
		sess, err := s.st.CurrentSession(s.ctx, src.ID)
		if err != nil {
			return false, err.Error()
		}
		return sess.Generation == gen, fmt.Sprintf("generation %d, want %d", sess.Generation, gen)
	})
	s.mustCLI("subscribe", "fast", uri)
	sub := s.waitDigest("fast", uri, ledger.Digest([]byte("v1")))
	s.mustCLI("unsubscribe", "fast", uri)
	eventually(t, 60*time.Second, "the subscription workflow completed", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, sub.WorkflowID, "")
		if err != nil {
			return false, err.Error()
		}
		st := d.GetWorkflowExecutionInfo().GetStatus()
		return st == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, st.String()
	})
	if n := s.replayHistories(map[string]string{contract.SubscriptionWorkflowName: "local-subscribe-v1"})[contract.SubscriptionWorkflowName]; n != 1 {
		t.Errorf("%d subscription executions, want 1", n)
	}
	hist := s.history(sub.WorkflowID)
	if diff := cmp.Diff([]string{localSubscribeChange + "=1"}, versionMarkers(t, hist, localSubscribeChange)); diff != "" {
		t.Errorf("version markers (-want +got):\n%s", diff)
	}
	cost, ok, err := histstats.Start(hist)
	if err != nil || !ok {
		t.Fatalf("start cost: %+v, accepted %v, %v", cost, ok, err)
	}
	t.Logf("start on the fast path: %d workflow tasks, %d activity tasks, %d history events to the first accepted version", cost.WorkflowTasks, cost.ActivityTasks, cost.Events)
	want := histstats.StartCost{Events: cost.Events, WorkflowTasks: 1, ActivityTasks: 0, LocalSubscribe: true}
	if diff := cmp.Diff(want, cost); diff != "" {
		t.Errorf("start cost (-want +got):\n%s", diff)
	}
	if st := srv.Stats(); st.SubscribeCalls != 1 {
		t.Errorf("%d resources/subscribe calls, want 1", st.SubscribeCalls)
	}
	s.checkInvariants()
}
