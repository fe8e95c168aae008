package workflows_test

import (
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/workflows"
)

// replayed are the workflow functions by registered type name, as the worker registers them.
// Every type needs at least one recorded history.
var replayed = workflows.ByType

// Histories recorded from real runs on a real Temporal server, PostgreSQL ledger and MCP
// server (go test -count=1 ./internal/harness/e2e -run TestHistoriesReplay -record-histories,
// see internal/harness/e2e/histories_test.go) replay against the current code, each with the
// function of its own workflow type registered: a change that breaks determinism fails here
// and needs workflow.GetVersion, not a silent re-record. A history of a type this test does
// not know fails it.
func TestReplayRecordedHistories(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "histories", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			typ, hist := readHistory(t, f)
			seen[typ]++
			fn, ok := replayed[typ]
			if !ok {
				t.Fatalf("%s is a history of workflow type %q, which this test does not replay", f, typ)
			}
			rep := worker.NewWorkflowReplayer()
			rep.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: typ})
			if err := rep.ReplayWorkflowHistory(nil, hist); err != nil {
				t.Fatalf("replaying %s (%s): %v", f, typ, err)
			}
			t.Logf("replayed %s (%s, %d events)", f, typ, len(hist.GetEvents()))
		})
	}
	var missing []string
	for typ := range replayed {
		if seen[typ] == 0 {
			missing = append(missing, typ)
		}
	}
	sort.Strings(missing)
	if diff := cmp.Diff([]string(nil), missing); diff != "" {
		t.Errorf("workflow types without a recorded history (-want +got):\n%s", diff)
	}
}

// readHistory reads the history in file f and returns it with its workflow type.
func readHistory(t *testing.T, f string) (string, *historypb.History) {
	t.Helper()
	r, err := os.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	hist, err := client.HistoryFromJSON(r, client.HistoryJSONOptions{})
	if err != nil {
		t.Fatalf("reading %s: %v", f, err)
	}
	events := hist.GetEvents()
	if len(events) == 0 || events[0].GetWorkflowExecutionStartedEventAttributes() == nil {
		t.Fatalf("%s does not start with WorkflowExecutionStarted", f)
	}
	return events[0].GetWorkflowExecutionStartedEventAttributes().GetWorkflowType().GetName(), hist
}
