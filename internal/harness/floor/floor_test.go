package floor_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/temporaltest"

	"github.com/mcpsync/mcpsync/internal/harness/floor"
)

// TestRunEverySignalRunsItsLocalActivity drives the floor against a real in-process
// Temporal server and checks the bookkeeping, not the speed: every acknowledged signal's
// local activity ran, exactly once, also across continue-as-new (signals pending at the
// switch are carried over), and the history counter sees the workflow tasks. With
// Options.Update, every completed workflow update ran its local activity once and is in the
// history as a completed update.
func TestRunEverySignalRunsItsLocalActivity(t *testing.T) {
	tests := []struct {
		name        string
		suggestCAN  int     // 0: server default
		rate        float64 // signals/s over all entities
		wantRunsMin int     // runs read by CountHistory, summed over the entities
		// mayRepeat: a continue-as-new that the server rejects because a signal arrived during
		// its workflow task (UnhandledCommand) discards that task's local-activity markers, and
		// the retried task runs those local activities again; no signal is lost either way.
		mayRepeat bool
		update    bool
	}{
		{name: "one run", rate: 60, wantRunsMin: 4},
		{name: "workflow updates", rate: 60, wantRunsMin: 4, update: true},
		// Bursts: signals queue up behind a workflow task and some are pending at the switch.
		{name: "continue-as-new every ~40 events", suggestCAN: 40, rate: 400, wantRunsMin: 5, mayRepeat: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The transfer queue polled fast, one partition per task queue (as the stacks).
			dc := dynamicconfig.StaticClient{
				dynamicconfig.TransferProcessorMaxPollRPS.Key():         []dynamicconfig.ConstrainedValue{{Value: 1000}},
				dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  []dynamicconfig.ConstrainedValue{{Value: 1}},
				dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): []dynamicconfig.ConstrainedValue{{Value: 1}},
			}
			if tt.suggestCAN > 0 {
				dc[dynamicconfig.HistoryCountSuggestContinueAsNew.Key()] = []dynamicconfig.ConstrainedValue{{Value: tt.suggestCAN}}
			}
			ts := temporaltest.NewServer(temporaltest.WithT(t), temporaltest.WithBaseServerOptions(temporal.WithDynamicConfigClient(dc)))
			c := ts.NewClientWithOptions(client.Options{Namespace: ts.GetDefaultNamespace()})
			t.Cleanup(c.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			t.Cleanup(cancel)

			const n = 4
			res, err := floor.RunWithOptions(ctx, c, "floor-test", n, tt.rate, 1500*time.Millisecond, floor.Options{Keep: true, Update: tt.update})
			if err != nil {
				t.Fatal(err)
			}
			if res.Sent == 0 {
				t.Fatal("no signal was sent")
			}
			perWorkflow := 0
			for _, k := range res.PerWorkflow {
				perWorkflow += k
			}
			type counts struct{ Accepted, Missing, Repeated, SignalErrors, PerWorkflow, IDs int }
			got := counts{res.Accepted, res.Missing, res.Repeated, res.SignalErrors, perWorkflow, len(res.WorkflowIDs)}
			want := counts{Accepted: res.Sent, PerWorkflow: res.Sent, IDs: n}
			if tt.mayRepeat {
				want.Repeated = got.Repeated
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after %d signals (-want +got):\n%s", res.Sent, diff)
			}

			// Every accepted signal is at least a Signaled event and a MarkerRecorded event,
			// and every batch of signals needs a workflow task. A local activity is done (and
			// counted accepted) before the workflow task that ran it is completed and its
			// marker written: on a loaded machine the last markers land seconds after Run
			// returns, so the history is read again until they are all there.
			var total floor.History
			for settle := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				total = floor.History{}
				for _, id := range res.WorkflowIDs {
					h, err := floor.CountHistory(ctx, c, id, res.Start, time.Now())
					if err != nil {
						t.Fatal(err)
					}
					total = total.Add(h)
				}
				if total.Events >= 2*res.Accepted || time.Now().After(settle) {
					break
				}
			}
			if total.Events < 2*res.Accepted || total.WorkflowTasks == 0 || total.Runs < tt.wantRunsMin {
				t.Errorf("history in the window: %+v for %d accepted signals; want >= %d events, > 0 workflow tasks, >= %d runs",
					total, res.Accepted, 2*res.Accepted, tt.wantRunsMin)
			}
			// The events by type add up to the events, and every accepted signal is among them.
			// Markers are not counted against the signals: a workflow task can fail (6 did in
			// one run here), and its local activities' markers are then not recorded.
			byType := 0
			for _, k := range total.ByType {
				byType += k
			}
			delivered := "WorkflowExecutionSignaled"
			if tt.update {
				delivered = "WorkflowExecutionUpdateCompleted"
			}
			if byType != total.Events || total.ByType[delivered] < res.Accepted {
				t.Errorf("events by type %v (sum %d) for %d events and %d accepted %s", total.ByType, byType, total.Events, res.Accepted, delivered)
			}
		})
	}
}

// TestStarts: every entity started is up (its start-up local activity ran) before Starts
// returns, each counted once; a deadline already passed starts nothing and is not an error.
func TestStarts(t *testing.T) {
	ts := temporaltest.NewServer(temporaltest.WithT(t))
	c := ts.NewClientWithOptions(client.Options{Namespace: ts.GetDefaultNamespace()})
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)

	type counts struct{ Workflows, Started, Up int }
	for _, tc := range []struct {
		name string
		n    int
		opts floor.StartOptions
		want counts
	}{
		{"all up", 12, floor.StartOptions{Parallel: 4}, counts{12, 12, 12}},
		{"window of 3", 12, floor.StartOptions{Parallel: 8, Window: 3}, counts{12, 12, 12}},
		{"deadline passed", 5, floor.StartOptions{Deadline: time.Now()}, counts{5, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := floor.Starts(ctx, c, "floor-starts-"+strings.ReplaceAll(tc.name, " ", "-"), tc.n, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, counts{res.Workflows, res.Started, res.Up}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if res.Up > 0 && (res.Elapsed <= 0 || res.PerSec <= 0) {
				t.Errorf("elapsed %s, %.1f/s for %d up", res.Elapsed, res.PerSec, res.Up)
			}
		})
	}
}
