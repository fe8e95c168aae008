package workflows_test

import (
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows"
)

// Histories recorded from real runs (go test ./internal/harness/e2e -run TestHistoriesReplay
// -record-histories) replay against the current code: a change that breaks determinism fails
// here and needs workflow.GetVersion, not a silent re-record.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "histories", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found %d recorded histories, want at least 3", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(workflows.SubscriptionWorkflow, workflow.RegisterOptions{Name: contract.SubscriptionWorkflowName})
			r.RegisterWorkflowWithOptions(workflows.SourceWorkflow, workflow.RegisterOptions{Name: contract.SourceWorkflowName})
			r.RegisterWorkflowWithOptions(workflows.DiscoveryScanWorkflow, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
			if err := r.ReplayWorkflowHistoryFromJSONFile(nil, f); err != nil {
				t.Fatalf("replay %s: %v", f, err)
			}
		})
	}
}
