package tracing_test

import (
	"os"
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/tracing"
	"github.com/mcpsync/mcpsync/workflows"
)

// The tracing interceptors keep workflows deterministic: every history recorded without them
// (workflows/testdata/histories) replays with them installed, as a worker upgraded to tracing
// replays its open workflows.
func TestRecordedHistoriesReplayWithTracing(t *testing.T) {
	tp, _ := tracing.NewInMemory()
	defer tracing.Install(tp)()
	ics, err := tracing.TemporalInterceptors()
	if err != nil {
		t.Fatal(err)
	}
	var wics []interceptor.WorkerInterceptor
	for _, ic := range ics {
		wics = append(wics, ic)
	}
	fns := workflows.ByType
	files, err := filepath.Glob(filepath.Join("..", "..", "workflows", "testdata", "histories", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded histories: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			hist, err := client.HistoryFromJSON(r, client.HistoryJSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			typ := hist.GetEvents()[0].GetWorkflowExecutionStartedEventAttributes().GetWorkflowType().GetName()
			fn, ok := fns[typ]
			if !ok {
				t.Fatalf("unknown workflow type %q", typ)
			}
			rep, err := worker.NewWorkflowReplayerWithOptions(worker.WorkflowReplayerOptions{Interceptors: wics})
			if err != nil {
				t.Fatal(err)
			}
			rep.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: typ})
			if err := rep.ReplayWorkflowHistory(nil, hist); err != nil {
				t.Fatalf("replaying %s with tracing: %v", f, err)
			}
		})
	}
}
