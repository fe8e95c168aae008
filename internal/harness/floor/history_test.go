package floor_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/floor"
)

// Add sums the counts by type; PerUpdate lists them per update, largest first, ties by name.
func TestHistoryPerUpdate(t *testing.T) {
	a := floor.History{Events: 5, WorkflowTasks: 1, Runs: 1, ByType: map[string]int{"WorkflowExecutionSignaled": 2, "MarkerRecorded": 2, "TimerStarted": 1}}
	b := floor.History{Events: 3, WorkflowTasks: 1, Runs: 1, ByType: map[string]int{"WorkflowExecutionSignaled": 2, "WorkflowTaskStarted": 1}}
	sum := a.Add(b)
	want := floor.History{Events: 8, WorkflowTasks: 2, Runs: 2, ByType: map[string]int{
		"WorkflowExecutionSignaled": 4, "MarkerRecorded": 2, "TimerStarted": 1, "WorkflowTaskStarted": 1}}
	if diff := cmp.Diff(want, sum); diff != "" {
		t.Errorf("Add (-want +got):\n%s", diff)
	}
	tests := []struct {
		h       floor.History
		updates int
		want    string
	}{
		{sum, 4, "WorkflowExecutionSignaled 1.00, MarkerRecorded 0.50, TimerStarted 0.25, WorkflowTaskStarted 0.25"},
		{floor.History{}, 0, ""},
		{floor.History{ByType: map[string]int{"MarkerRecorded": 3}}, 0, "MarkerRecorded 3.00"},
	}
	for _, tt := range tests {
		if got := tt.h.PerUpdate(tt.updates); got != tt.want {
			t.Errorf("PerUpdate(%d) = %q, want %q", tt.updates, got, tt.want)
		}
	}
}
