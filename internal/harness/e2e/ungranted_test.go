package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	workflowpb "go.temporal.io/api/workflow/v1"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// closeUngrantedChange is the change ID of the close-ungranted patch (workflows/subscription.go,
// versionCloseUngranted).
const closeUngrantedChange = "close-ungranted"

// R23, R18: a subscription whose workflow ended while ACTIVE (terminated here) cannot be told
// of its principal's revocation — revoke says so and points at `mcpsync reconcile` — and the
// workflow reconcile restarts finds the row open with no standing grant. A run of the current
// code goes through the close-ungranted patch (a version marker): it passes the close fence
// with the revoke reason, unsubscribes on the live session and completes, the row CLOSED. With
// -pre-patch, on the code before the patch, the restarted workflow fails and leaves the row
// ACTIVE with no workflow. With -record-histories the restarted run's history is written to
// workflows/testdata/histories as close-ungranted-v1-NN (or -v0-NN with -pre-patch).
func TestHistoriesCloseUngranted(t *testing.T) {
	s := newStack(t)
	const uri = "demo://kb/1"
	srv := s.startChaosHTTP("kb", map[string]string{uri: "one"})
	s.mustCLI("grant", "alice", "kb")
	s.mustCLI("subscribe", "kb", uri, "--principal", "alice")
	sub := s.waitAccepted("alice", "kb", uri, "one")
	if err := s.tc.TerminateWorkflow(s.ctx, sub.WorkflowID, "", "test: the workflow dies"); err != nil {
		t.Fatal(err)
	}
	s.expectCode(cli.ExitFailure, "could not be signalled", "revoke", "alice", "kb", "--wait", "0")
	if out := s.mustCLI("reconcile", "kb"); !strings.Contains(out, "restarted workflow") {
		t.Fatalf("reconcile output:\n%s", out)
	}
	want := enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED
	if *prePatch {
		want = enumspb.WORKFLOW_EXECUTION_STATUS_FAILED
	}
	eventually(t, 60*time.Second, "the restarted workflow ended", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, sub.WorkflowID, "")
		if err != nil {
			return false, err.Error()
		}
		st := d.GetWorkflowExecutionInfo().GetStatus()
		return st == want, st.String()
	})
	hist := s.history(sub.WorkflowID)
	after, err := s.st.SubscriptionByKey(s.ctx, "alice", "kb", uri)
	if err != nil {
		t.Fatal(err)
	}

	prefix := "close-ungranted-v1"
	if *prePatch {
		prefix = "close-ungranted-v0"
	}
	// The terminated run is an ordinary subscription's: recorded elsewhere.
	s.skipRecording = func(ex *workflowpb.WorkflowExecutionInfo) bool {
		return ex.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED
	}
	if n := s.replayHistories(map[string]string{contract.SubscriptionWorkflowName: prefix})[contract.SubscriptionWorkflowName]; n != 2 {
		t.Errorf("%d subscription executions, want 2 (the terminated run and the restarted one)", n)
	}

	type branch struct {
		Markers          []string
		State            mcpsync.State
		Revoked          bool // the row's reason is the revoke reason
		MCPUnsubscribes  int  // by the restarted run
		ServerUnsubcribe int  // unsubscribe calls the server saw
	}
	wantBranch := branch{Markers: []string{closeUngrantedChange + "=1"}, State: mcpsync.StateClosed, Revoked: true,
		MCPUnsubscribes: 1, ServerUnsubcribe: 1}
	if *prePatch {
		wantBranch = branch{State: mcpsync.StateActive}
	}
	got := branch{Markers: versionMarkers(t, hist, closeUngrantedChange), State: after.State,
		Revoked: strings.HasPrefix(after.StateReason, "revoked: no standing grant"), MCPUnsubscribes: mcpUnsubscribes(hist),
		ServerUnsubcribe: srv.Stats().UnsubscribeCalls}
	if diff := cmp.Diff(wantBranch, got); diff != "" {
		t.Errorf("branch taken by the restarted run (-want +got):\n%s\nledger reason %q", diff, after.StateReason)
	}
	if after.Generation != sub.Generation || after.LastAcceptedOrdinal != sub.LastAcceptedOrdinal {
		t.Errorf("row generation %d, accepted %d after the run; want %d and %d (nothing reopened or read)",
			after.Generation, after.LastAcceptedOrdinal, sub.Generation, sub.LastAcceptedOrdinal)
	}
	// Nothing opens without the grant: a subscribe of alice is refused, and granting again
	// opens the next generation.
	s.expectCode(cli.ExitDenied, "no standing grant", "subscribe", "kb", uri, "--principal", "alice")
	if !*prePatch {
		s.mustCLI("grant", "alice", "kb")
		s.mustCLI("subscribe", "kb", uri, "--principal", "alice")
		again := s.waitAccepted("alice", "kb", uri, "one")
		if again.Generation != sub.Generation+1 {
			t.Errorf("subscribed again under generation %d, want %d", again.Generation, sub.Generation+1)
		}
	}
	s.checkInvariants()
	t.Logf("%d events in the restarted run", len(hist.GetEvents()))
}
