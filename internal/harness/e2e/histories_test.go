package e2e_test

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/history/v1"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/workflows"
)

// Recording the histories that workflows/replay_test.go replays:
//
//	go test -count=1 ./internal/harness/e2e -run TestHistoriesReplay -record-histories
//
// records every scenario; -run 'TestHistoriesReplay$' (subscriptions) or -run
// TestHistoriesReplayDiscovery (sources and discovery scans) or -run
// TestHistoriesReplayStartBatch (a bulk subscribe's batch) records one. Each scenario
// replaces only the files of the prefixes it records.
var recordHistories = flag.Bool("record-histories", false,
	"write the histories of this test's workflows to workflows/testdata/histories, for the replay test")

// historyDir is where the workflows package's replay test reads recorded histories.
var historyDir = filepath.Join("..", "..", "..", "workflows", "testdata", "histories")

// maxHistoryBytes bounds one recorded history file: a scenario that records more is too big
// for the repository and should use fewer resources or updates.
const maxHistoryBytes = 300 << 10

// workflowFuncs are the workflow functions by registered type name, as the worker registers
// them.
var workflowFuncs = workflows.ByType

// Runs subscriptions through their main paths on a real server (notifications, a lost
// unsubscribe acknowledgement, continue-as-new), then replays every history with the current
// workflow code. With -record-histories the subscriptions' histories are also written where
// the workflows package's replay test reads them (subscription-NN-<status>.json), so a later
// change that breaks determinism fails there.
func TestHistoriesReplay(t *testing.T) {
	// 150 events: 40 updates on the fast path (issue 16 item 2, about 5 events each) still
	// continue as new.
	s := newStack(t, suggestContinueAsNewAt(150))
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
		return sub.State == mcpsync.StateClosed, string(sub.State) + ": " + sub.StateReason
	})

	got := s.replayHistories(map[string]string{contract.SubscriptionWorkflowName: "subscription"})
	if n := got[contract.SubscriptionWorkflowName]; n < 3 {
		t.Fatalf("%d subscription executions, want both subscriptions and at least one continue-as-new", n)
	}
}

// A bulk subscribe's batch of starts (StartBatchWorkflow) on a real server replays; with
// -record-histories it is written as start-batch-NN-<status>.json.
func TestHistoriesReplayStartBatch(t *testing.T) {
	s := newStack(t)
	s.startChaosHTTP("batch", map[string]string{"demo://b/1": "one", "demo://b/2": "two", "demo://b/3": "three"})
	s.mustCLI("subscribe", "batch", "demo://b/1", "demo://b/2", "demo://b/3", "--wait", "60s")
	got := s.replayHistories(map[string]string{contract.StartBatchWorkflowName: "start-batch"})
	if n := got[contract.StartBatchWorkflowName]; n < 1 {
		t.Errorf("replayed %d start batches, want at least 1 (counts %v)", n, got)
	}
}

// Runs a source's discovery on a real server and replays every history with the current
// workflow code:
//   - the first scan's rounds A and B agree and it publishes a SNAPSHOT_UNPROVEN catalog
//     (R6, R7); the SourceWorkflow then continues as new (the server suggests it early);
//   - a new resource's list_changed signals the source, which invalidates its catalogs (R3)
//     and runs a second scan; a resource created behind the cursor of that scan's round A,
//     with its own list_changed lost, makes rounds A and B disagree, so the scan waits, runs
//     round C and publishes from B and C; the source continues as new again.
//
// With -record-histories the closed executions' histories are written where the workflows
// package's replay test reads them (source-NN-<status>.json, discoveryscan-NN-<status>.json).
func TestHistoriesReplayDiscovery(t *testing.T) {
	s := newStack(t, suggestContinueAsNewAt(10))
	srv := chaosServer(t, 2, 3, chaosmcp.DefaultCapabilities)
	src := s.addChaos("chaos", srv)
	first := s.waitCatalog(src, "first catalog", anyCatalog)
	s.waitSourceIdle("chaos")

	// Round A of the next scan asks for its second page after this hook is installed.
	srv.OnBetweenPages(onceAt(chaosmcp.ListResources, 1, 1, func() {
		srv.SuppressListChanged(true)
		srv.Set("demo://r/0005", "behind the cursor", "text/plain")
	}))
	srv.Set("demo://r/0001", "new", "text/plain")
	second := s.waitCatalog(src, "catalog after list_changed", func(c ledger.Catalog) bool { return c.ID > first.ID })
	s.waitSourceIdle("chaos")

	type view struct {
		Level      ledger.ProofLevel
		RoundsUsed int
		Basis      []int
	}
	want := []view{{ledger.ProofSnapshotUnproven, 2, []int{1, 2}}, {ledger.ProofSnapshotUnproven, 3, []int{2, 3}}}
	gotViews := []view{{first.Level, first.RoundsUsed, s.basisRounds(first)}, {second.Level, second.RoundsUsed, s.basisRounds(second)}}
	if diff := cmp.Diff(want, gotViews); diff != "" {
		t.Errorf("catalogs (-want +got):\n%s\nreasons: %s | %s", diff, first.Reason, second.Reason)
	}
	if diff := cmp.Diff(srv.URIs(), s.entryURIs(second)); diff != "" {
		t.Errorf("second catalog (-server +catalog):\n%s", diff)
	}
	old, err := s.st.CatalogByID(s.ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if old.InvalidatedAt == nil {
		t.Errorf("first catalog not invalidated by list_changed: %+v", old)
	}

	eventually(t, 60*time.Second, "the source continued as new after each scan", func() (bool, string) {
		n := map[enumspb.WorkflowExecutionStatus]int{}
		for _, ex := range s.executions() {
			if ex.GetType().GetName() == contract.SourceWorkflowName {
				n[ex.GetStatus()]++
			}
		}
		if n[enumspb.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW] < 2 {
			return false, fmt.Sprint(n)
		}
		// The newest run's history is complete up to its last workflow task, so it replays.
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, contract.SourceWorkflowID("chaos"), "")
		if err != nil {
			return false, err.Error()
		}
		return d.GetPendingWorkflowTask() == nil, fmt.Sprintf("%v; newest run has a pending workflow task", n)
	})
	got := s.replayHistories(map[string]string{
		contract.SourceWorkflowName:        "source",
		contract.DiscoveryScanWorkflowName: "discoveryscan",
	})
	if got[contract.SourceWorkflowName] < 3 || got[contract.DiscoveryScanWorkflowName] < 2 {
		t.Fatalf("executions by type %v, want at least 3 source runs and 2 discovery scans", got)
	}
}

// waitSourceIdle waits until the source's workflow (its newest run) has no workflow task
// pending, runs no scan and has none due.
func (s *stack) waitSourceIdle(source string) {
	s.t.Helper()
	eventually(s.t, 60*time.Second, "source "+source+" idle", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, contract.SourceWorkflowID(source), "")
		if err != nil {
			return false, err.Error()
		}
		if d.GetPendingWorkflowTask() != nil {
			return false, "a workflow task is pending"
		}
		res, err := s.tc.QueryWorkflow(s.ctx, contract.SourceWorkflowID(source), "", contract.QuerySourceState)
		if err != nil {
			return false, err.Error()
		}
		var v contract.SourceView
		if err := res.Get(&v); err != nil {
			return false, err.Error()
		}
		return v.Running == "" && !v.Pending, fmt.Sprintf("%+v", v)
	})
}

// executions lists every workflow execution on the stack's server, in start order.
func (s *stack) executions() []*workflowpb.WorkflowExecutionInfo {
	s.t.Helper()
	var out []*workflowpb.WorkflowExecutionInfo
	var token []byte
	for {
		resp, err := s.tc.ListWorkflow(s.ctx, &workflowservice.ListWorkflowExecutionsRequest{
			Namespace: s.ts.GetDefaultNamespace(), NextPageToken: token,
		})
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, resp.GetExecutions()...)
		if token = resp.GetNextPageToken(); len(token) == 0 {
			break
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if !a.GetStartTime().AsTime().Equal(b.GetStartTime().AsTime()) {
			return a.GetStartTime().AsTime().Before(b.GetStartTime().AsTime())
		}
		return a.GetExecution().GetWorkflowId()+a.GetExecution().GetRunId() < b.GetExecution().GetWorkflowId()+b.GetExecution().GetRunId()
	})
	return out
}

// decidedHistory is the history of execution ex once its first workflow task has started: a
// run that a continue-as-new has just started may not have been given its first workflow task
// yet (its history then holds only its start and that task's scheduling, and the replayer
// refuses it: "at least 3 events expected"), so the history of a running execution with fewer
// than 3 events is read again until it has them.
func (s *stack) decidedHistory(ex *workflowpb.WorkflowExecutionInfo) *history.History {
	s.t.Helper()
	id, run := ex.GetExecution().GetWorkflowId(), ex.GetExecution().GetRunId()
	decided := func(h *history.History) bool { return len(h.GetEvents()) >= 3 }
	hist := s.historyOf(id, run)
	if ex.GetStatus() != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING || decided(hist) {
		return hist
	}
	eventually(s.t, 60*time.Second, fmt.Sprintf("the first workflow task of %s/%s started", id, run), func() (bool, string) {
		hist = s.historyOf(id, run)
		return decided(hist), fmt.Sprintf("%d events", len(hist.GetEvents()))
	})
	return hist
}

// replayHistories replays the history of every execution on the stack's server with the
// current workflow code, each with the function of its own type registered, and fails the
// test for any that does not replay or has an unknown type. It returns the number of
// executions of each type. With -record-histories, the history of every closed execution
// whose type is a key of record (and that s.skipRecording does not name) is written to historyDir as <prefix>-NN-<status>.json (NN
// counts that prefix's closed executions in start order), after removing that prefix's earlier
// files.
func (s *stack) replayHistories(record map[string]string) map[string]int {
	t := s.t
	t.Helper()
	if *recordHistories {
		if err := os.MkdirAll(historyDir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, prefix := range record {
			old, err := filepath.Glob(filepath.Join(historyDir, prefix+"-*.json"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range old {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	count := map[string]int{}
	recorded := map[string]int{}
	for _, ex := range s.executions() {
		typ := ex.GetType().GetName()
		count[typ]++
		id, run := ex.GetExecution().GetWorkflowId(), ex.GetExecution().GetRunId()
		fn, ok := workflowFuncs[typ]
		if !ok {
			t.Errorf("execution %s/%s has unknown workflow type %q", id, run, typ)
			continue
		}
		hist := s.decidedHistory(ex)
		replayer := worker.NewWorkflowReplayer()
		replayer.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: typ})
		if err := replayer.ReplayWorkflowHistory(logging.Temporal(s.log), hist); err != nil {
			t.Errorf("replaying %s %s/%s: %v", typ, id, run, err)
		}
		prefix, ok := record[typ]
		if !*recordHistories || !ok || ex.GetStatus() == enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING ||
			(s.skipRecording != nil && s.skipRecording(ex)) {
			continue
		}
		b, err := protojson.MarshalOptions{Indent: " "}.Marshal(hist)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > maxHistoryBytes {
			t.Errorf("history of %s/%s is %d bytes, more than %d: shrink the scenario", id, run, len(b), maxHistoryBytes)
		}
		name := fmt.Sprintf("%s-%02d-%s.json", prefix, recorded[prefix], ex.GetStatus().String())
		recorded[prefix]++
		if err := os.WriteFile(filepath.Join(historyDir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("recorded %s: %s %s/%s (%d events, %d bytes)", name, typ, id, run, len(hist.Events), len(b))
	}
	return count
}
