package histstats_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/harness/histstats"
)

// Issue 16 item 4: what a subscription's start costs, read from histories recorded on a real
// server (workflows/testdata/histories): three workflow tasks and two activity tasks on the
// host queue (subscribe, read) before the read fast path, two and one (the subscribe) with it,
// and one workflow task and no activity task with the subscribe fast path too.
func TestStart(t *testing.T) {
	tests := []struct {
		file string
		want histstats.StartCost
	}{
		{"subscription-00-Completed.json", histstats.StartCost{Events: 24, WorkflowTasks: 3, ActivityTasks: 2}},
		{"local-read-v1-00-Completed.json", histstats.StartCost{Events: 19, WorkflowTasks: 2, ActivityTasks: 1}},
		{"local-subscribe-v1-00-Completed.json", histstats.StartCost{Events: 16, WorkflowTasks: 1, ActivityTasks: 0, LocalSubscribe: true}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := os.Open(filepath.Join("..", "..", "..", "workflows", "testdata", "histories", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			hist, err := client.HistoryFromJSON(r, client.HistoryJSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			got, ok, err := histstats.Start(hist)
			if err != nil || !ok {
				t.Fatalf("start cost %+v, accepted %v: %v", got, ok, err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("start cost (-want +got):\n%s", diff)
			}
		})
	}
}
