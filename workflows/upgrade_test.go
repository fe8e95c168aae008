package workflows_test

import (
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/workflows"
)

// patchHistories names, for every patch (workflows.Patches), the recorded histories that reach
// its change: pre were recorded with the code before the patch (no version marker: replaying
// them must take the old branch), post with the code after it (version 1). docs/UPGRADE.md
// says how to record them.
var patchHistories = map[string]struct{ pre, post []string }{
	// Recorded by internal/harness/e2e TestHistoriesListChangedDuringScan: -pre-patch on d9eceaa
	// with the workflows/source.go of f773392~1 (two list_changed during one scan: only the
	// first recorded), and on the current code (each recorded). source-01 (recorded at bb9454b,
	// one list_changed while idle) reaches the change too, but both branches replay it alike.
	"record-every-list-changed": {
		pre:  []string{"record-every-list-changed-v0-01-ContinuedAsNew.json", "source-01-ContinuedAsNew.json"},
		post: []string{"record-every-list-changed-v1-01-ContinuedAsNew.json"},
	},
	// Recorded by internal/harness/e2e TestHistoriesCoverAfterRead: -pre-patch on d9eceaa with
	// the workflows of d9eceaa~1, and on the current code.
	"cover-after-read": {
		pre:  []string{"cover-after-read-v0-00-Completed.json"},
		post: []string{"cover-after-read-v1-00-Completed.json"},
	},
	// Recorded by internal/harness/e2e TestHistoriesCloseOnEndedSession: -pre-patch on 893e321
	// with the workflows of dffcd2d~1 (the unsubscribe after the session's end goes to
	// UNSUBSCRIBE_UNKNOWN and is retried until the source's next session closes it), and on
	// the current code (closed at once).
	"close-on-ended-session": {
		pre:  []string{"close-on-ended-session-v0-00-Completed.json"},
		post: []string{"close-on-ended-session-v1-00-Completed.json"},
	},
	// Issue 16 item 2. Every subscription history recorded before the patch reads on the
	// three-step path (allocate, MCPRead on the host queue, accept); cover-after-read-v1-00 was
	// recorded at d9eceaa and subscription-00 earlier. local-read-v1-00 is recorded by
	// internal/harness/e2e TestHistoriesLocalRead on the current code (the fast path).
	"local-read": {
		pre:  []string{"cover-after-read-v1-00-Completed.json", "subscription-00-Completed.json"},
		post: []string{"local-read-v1-00-Completed.json"},
	},
	// Issue 16 item 4. Every subscription history recorded before the patch subscribes on the
	// host queue (MCPSubscribe); local-read-v1-00 was recorded with the local-read patch, and
	// subscription-00 earlier. local-subscribe-v1-00 is recorded by internal/harness/e2e
	// TestHistoriesLocalSubscribe on the current code (the fast path: one workflow task from
	// the start to the first accepted version).
	"local-subscribe": {
		pre:  []string{"local-read-v1-00-Completed.json", "subscription-00-Completed.json"},
		post: []string{"local-subscribe-v1-00-Completed.json"},
	},
	// Issue 16 item 5. Every discovery scan history recorded before the patch runs each round
	// in an activity of its own (discoveryscan-00 and -01: rounds 1-2 and 1-3).
	// round-pair-v1-00 is recorded by internal/harness/e2e TestHistoriesRoundPair on the
	// current code (rounds A and B in one activity).
	"round-pair": {
		pre:  []string{"discoveryscan-00-Completed.json", "discoveryscan-01-Completed.json"},
		post: []string{"round-pair-v1-00-Completed.json"},
	},
	// Recorded by internal/harness/e2e TestHistoriesCloseUngranted: -pre-patch with the
	// workflows of 5bdacd4 and the current activities (whose refusal for want of a grant
	// carries the open row; the old run fails all the same and leaves the row ACTIVE), and on
	// the current code (the restarted run closes the row through the close fence).
	"close-ungranted": {
		pre:  []string{"close-ungranted-v0-00-Failed.json"},
		post: []string{"close-ungranted-v1-00-Completed.json"},
	},
}

// distinguishing are the pre-patch histories that the new branch of their patch cannot replay:
// they prove that the replay test catches the change made without workflow.GetVersion.
var distinguishing = map[string]string{
	"record-every-list-changed": "record-every-list-changed-v0-01-ContinuedAsNew.json",
	"cover-after-read":          "cover-after-read-v0-00-Completed.json",
	"close-on-ended-session":    "close-on-ended-session-v0-00-Completed.json",
	"local-read":                "cover-after-read-v1-00-Completed.json",
	"local-subscribe":           "local-read-v1-00-Completed.json",
	"round-pair":                "discoveryscan-00-Completed.json",
	"close-ungranted":           "close-ungranted-v0-00-Failed.json",
}

// Issue 17 part 5: every patch has a history recorded before it, which carries no marker of
// the patch and replays against the current code (the old branch); a history recorded after
// it carries version 1 of the patch (a new run takes the new branch) and replays too.
func TestPatchesReplayTheirRecordedHistories(t *testing.T) {
	var names []string
	for name := range patchHistories {
		names = append(names, name)
	}
	sort.Strings(names)
	want := append([]string(nil), workflows.Patches...)
	sort.Strings(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("patches without recorded histories here, or histories of unknown patches (-patches +here):\n%s", diff)
	}
	for _, change := range workflows.Patches {
		h := patchHistories[change]
		if len(h.pre) == 0 {
			t.Errorf("patch %s has no history recorded before it", change)
		}
		for _, f := range h.pre {
			t.Run(change+"/"+f, func(t *testing.T) {
				hist := replayFile(t, f)
				if got := markers(t, hist, change); len(got) != 0 {
					t.Errorf("pre-patch history %s has markers %v of %s", f, got, change)
				}
			})
		}
		for _, f := range h.post {
			t.Run(change+"/"+f, func(t *testing.T) {
				hist := replayFile(t, f)
				if diff := cmp.Diff([]int{1}, markers(t, hist, change)); diff != "" {
					t.Errorf("post-patch history %s: versions of %s (-want +got):\n%s", f, change, diff)
				}
			})
		}
	}
}

// Every patch has a pre-patch history that reaches its change: replayed by code that takes
// the new branch without workflow.GetVersion (what the change would have been unguarded), it
// is non-deterministic, so the replay test above would have caught an unguarded change.
func TestUnguardedPatchesBreakTheirPrePatchHistories(t *testing.T) {
	defer workflows.SetUnguardedPatches(true)()
	for _, change := range workflows.Patches {
		f, ok := distinguishing[change]
		if !ok {
			t.Errorf("patch %s has no pre-patch history that its new branch cannot replay", change)
			continue
		}
		typ, hist := readHistory(t, filepath.Join("testdata", "histories", f))
		rep := worker.NewWorkflowReplayer()
		rep.RegisterWorkflowWithOptions(replayed[typ], workflow.RegisterOptions{Name: typ})
		err := rep.ReplayWorkflowHistory(nil, hist)
		if err == nil || !strings.Contains(err.Error(), "[TMPRL1100]") {
			t.Errorf("unguarded replay of %s (%s): %v, want a nondeterminism error ([TMPRL1100])", f, change, err)
		}
	}
}

// replayFile replays the recorded history f (in testdata/histories) against the current code
// and returns it.
func replayFile(t *testing.T, f string) *historypb.History {
	t.Helper()
	typ, hist := readHistory(t, filepath.Join("testdata", "histories", f))
	rep := worker.NewWorkflowReplayer()
	rep.RegisterWorkflowWithOptions(replayed[typ], workflow.RegisterOptions{Name: typ})
	if err := rep.ReplayWorkflowHistory(nil, hist); err != nil {
		t.Fatalf("replaying %s (%s): %v", f, typ, err)
	}
	return hist
}

// markers lists the versions that the version markers (workflow.GetVersion) of change in
// hist record.
func markers(t *testing.T, hist *historypb.History, change string) []int {
	t.Helper()
	var out []int
	dc := converter.GetDefaultDataConverter()
	for _, ev := range hist.GetEvents() {
		m := ev.GetMarkerRecordedEventAttributes()
		if m == nil || m.GetMarkerName() != "Version" {
			continue
		}
		var id string
		var version int
		if err := dc.FromPayloads(m.GetDetails()["change-id"], &id); err != nil {
			t.Fatalf("version marker of event %d: %v", ev.GetEventId(), err)
		}
		if err := dc.FromPayloads(m.GetDetails()["version"], &version); err != nil {
			t.Fatalf("version marker of event %d: %v", ev.GetEventId(), err)
		}
		if id == change {
			out = append(out, version)
		}
	}
	return out
}
