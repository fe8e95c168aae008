package e2e_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/api/history/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/workflows"
)

var recordHistories = flag.Bool("record-histories", false,
	"write the histories of this test's workflows to workflows/testdata/histories, for the replay test")

// Runs subscriptions through their main paths on a real server (notifications, a lost
// unsubscribe acknowledgement, continue-as-new), then replays every history with the current
// workflow code. With -record-histories the histories are also written where the workflows
// package's replay test reads them, so a later change that breaks determinism fails there.
func TestHistoriesReplay(t *testing.T) {
	s := newStack(t, suggestContinueAsNewAt(300))
	srv := s.startChaosHTTP("rec", map[string]string{"demo://notes/1": "v1", "demo://notes/2": "w1"})
	s.mustCLI("subscribe", "rec", "demo://notes/1")
	s.mustCLI("subscribe", "rec", "demo://notes/2")
	for i := 2; i <= 40; i++ {
		srv.Set("demo://notes/1", fmt.Sprintf("v%d", i), "text/plain")
		s.waitDigest("rec", "demo://notes/1", ledger.Digest([]byte(fmt.Sprintf("v%d", i))))
	}
	s.mustCLI("unsubscribe", "rec", "demo://notes/1")
	srv.SetUnsubscribeMode(chaosmcp.UnsubscribeLoseResponse)
	_, _, _ = s.cli("unsubscribe", "rec", "demo://notes/2", "--wait", "15s")
	srv.SetUnsubscribeMode(chaosmcp.UnsubscribeNormal)
	eventually(t, 90*time.Second, "notes/2 closed after the lost acknowledgement", func() (bool, string) {
		sub := s.sub("rec", "demo://notes/2")
		return sub.State == ledger.StateClosed, string(sub.State) + ": " + sub.StateReason
	})

	resp, err := s.tc.ListWorkflow(s.ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: s.ts.GetDefaultNamespace()})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.GetExecutions()); n < 3 {
		t.Fatalf("%d executions, want both subscriptions and at least one continue-as-new", n)
	}
	replayer := worker.NewWorkflowReplayer()
	replayer.RegisterWorkflowWithOptions(workflows.SubscriptionWorkflow, workflow.RegisterOptions{Name: contract.SubscriptionWorkflowName})
	replayer.RegisterWorkflowWithOptions(workflows.SourceWorkflow, workflow.RegisterOptions{Name: contract.SourceWorkflowName})
	replayer.RegisterWorkflowWithOptions(workflows.DiscoveryScanWorkflow, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
	dir := filepath.Join("..", "..", "..", "workflows", "testdata", "histories")
	for i, ex := range resp.GetExecutions() {
		hist := &history.History{}
		it := s.tc.GetWorkflowHistory(s.ctx, ex.GetExecution().GetWorkflowId(), ex.GetExecution().GetRunId(), false, 0)
		for it.HasNext() {
			ev, err := it.Next()
			if err != nil {
				t.Fatal(err)
			}
			hist.Events = append(hist.Events, ev)
		}
		if err := replayer.ReplayWorkflowHistory(logging.Temporal(s.log), hist); err != nil {
			t.Errorf("replaying %s/%s: %v", ex.GetExecution().GetWorkflowId(), ex.GetExecution().GetRunId(), err)
		}
		if *recordHistories {
			b, err := protojson.MarshalOptions{Indent: " "}.Marshal(hist)
			if err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("subscription-%02d-%s.json", i, ex.GetStatus().String())
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("recorded %s (%d events)", name, len(hist.Events))
		}
	}
}
