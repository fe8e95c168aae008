package workflows_test

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/histstats"
)

// Issue 16 item 2: what an accepted update costs Temporal, read from recorded real histories:
// before the local-read patch (the three-step path: two workflow tasks, an activity task and
// the memo) and after it (the fast path: the signal's workflow task and one local activity
// marker), with the notification as a signal and as a workflow update. The figures are printed for the bench table.
func TestEventsPerAcceptedUpdate(t *testing.T) {
	tests := []struct {
		file          string
		events, tasks int
		local         bool
	}{
		{file: "cover-after-read-v1-00-Completed.json", events: 13, tasks: 2, local: false},
		{file: "local-read-v1-00-Completed.json", events: 5, tasks: 1, local: true},
		// Notifications as workflow updates: the accepting task's three events, the update's
		// accepted and completed events and the marker; the server persists them once.
		{file: "local-read-update-v1-00-Completed.json", events: 6, tasks: 1, local: true},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			_, hist := readHistory(t, filepath.Join("testdata", "histories", tt.file))
			us, err := histstats.Updates(hist)
			if err != nil {
				t.Fatal(err)
			}
			if len(us) == 0 {
				t.Fatalf("%s has no accepted update after a signal", tt.file)
			}
			type cost struct {
				Events, Tasks int
				Local         bool
			}
			for i, u := range us {
				if diff := cmp.Diff(cost{tt.events, tt.tasks, tt.local}, cost{u.Events, u.WorkflowTasks, u.Local}); diff != "" {
					t.Errorf("update %d (-want +got):\n%s", i, diff)
				}
			}
			events, tasks := histstats.Mean(us)
			t.Logf("%s: %d accepted updates, %.1f history events and %.1f workflow tasks per update", tt.file, len(us), events, tasks)
		})
	}
}
