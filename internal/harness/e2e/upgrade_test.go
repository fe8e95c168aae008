package e2e_test

import (
	"errors"
	"flag"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/converter"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// prePatch says the workflow code under test predates the patch the test is about
// (TestHistoriesCoverAfterRead: d9eceaa; TestHistoriesListChangedDuringScan: f773392;
// TestHistoriesCloseOnEndedSession: dffcd2d): the
// test then expects the old branch and records its histories as the pre-patch ones
// (<change>-v0). See docs/UPGRADE.md for recording them from a worktree of the old commit.
var prePatch = flag.Bool("pre-patch", false,
	"the workflow code under test predates the patch of the test: expect the old branch and record as <change>-v0")

// coverAfterReadChange is the change ID of the cover-after-read patch
// (workflows/subscription_signals.go, versionCoverAfterRead).
const coverAfterReadChange = "cover-after-read"

// Issue 17 part 5: a copy of a notification that the host received before it sent the last
// read, delivered to an ACTIVE subscription only after that read answered, goes through the
// cover-after-read patch. A run started by the current code takes the new branch (a
// cover-after-read version marker, the pulse counted covered, no read of its own); with
// -pre-patch, on the code before the patch, it takes the old branch (no marker, one more
// notification read). With -record-histories its history is written to
// workflows/testdata/histories as cover-after-read-v1-NN (or -v0-NN with -pre-patch), where
// workflows/replay_test.go replays it against the current code.
func TestHistoriesCoverAfterRead(t *testing.T) {
	s := newStack(t)
	const uri = "demo://notes/1"
	srv := s.startChaosHTTP("up", map[string]string{uri: "v1"})
	s.mustCLI("subscribe", "up", uri)
	s.waitDigest("up", uri, ledger.Digest([]byte("v1")))

	// Every read from here on is sent after beforeRead, on the host's clock (this process).
	beforeRead := time.Now()
	srv.Set(uri, "v2", "text/plain")
	sub := s.waitDigest("up", uri, ledger.Digest([]byte("v2")))
	v := s.waitView(sub.WorkflowID, "ACTIVE after the read of v2", func(v contract.StateView) bool {
		return v.State == mcpsync.StateActive && v.LastAcceptedDigest == ledger.Digest([]byte("v2"))
	})
	readsBefore := v.Counters.ReadsByReason[mcpsync.ReasonNotification]

	// The late copy: the current session, a sequence number above every real one, received
	// by the host before the read of v2 was sent.
	if err := s.tc.SignalWorkflow(s.ctx, sub.WorkflowID, "", contract.SignalResourceUpdated, contract.ResourceUpdated{
		SessionGeneration: v.SessionGeneration, Seq: 1 << 40, ServerURI: sub.ServerURI, Pulses: 1, ReceivedAt: beforeRead,
	}); err != nil {
		t.Fatal(err)
	}
	notes := v.Counters.Notifications
	v = s.waitView(sub.WorkflowID, "the late copy handled", func(v contract.StateView) bool {
		return v.Counters.Notifications > notes && v.State == mcpsync.StateActive &&
			v.Counters.Reads == v.Counters.Accepted+v.Counters.Revalidated+v.Counters.Refused+v.Counters.NotFound+v.Counters.ReadFailures
	})
	extraReads := v.Counters.ReadsByReason[mcpsync.ReasonNotification] - readsBefore

	s.mustCLI("unsubscribe", "up", uri)
	eventually(t, 60*time.Second, "the subscription workflow completed", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, sub.WorkflowID, "")
		if err != nil {
			return false, err.Error()
		}
		st := d.GetWorkflowExecutionInfo().GetStatus()
		return st == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, st.String()
	})
	hist := s.history(sub.WorkflowID)
	markers := versionMarkers(t, hist, coverAfterReadChange)

	prefix := "cover-after-read-v1"
	if *prePatch {
		prefix = "cover-after-read-v0"
	}
	if n := s.replayHistories(map[string]string{contract.SubscriptionWorkflowName: prefix})[contract.SubscriptionWorkflowName]; n != 1 {
		t.Errorf("%d subscription executions, want 1", n)
	}

	type branch struct {
		Markers    []string
		ExtraReads int64
		Covered    int64
	}
	want := branch{Markers: []string{coverAfterReadChange + "=1"}, ExtraReads: 0, Covered: 1}
	if *prePatch {
		want = branch{Markers: nil, ExtraReads: 1, Covered: 0}
	}
	got := branch{Markers: markers, ExtraReads: extraReads, Covered: v.Counters.PulsesCovered}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("branch taken by the late copy (-want +got):\n%s", diff)
	}
}

// Issue 17 part 5: two list_changed that reach the source workflow one after the other while
// a scan runs go through the record-every-list-changed patch (workflows/source.go). A run of
// the current code records each in the ledger and carries version markers of the patch; with
// -pre-patch, on SourceWorkflow before f773392, only the first was recorded (no markers).
// With -record-histories the source's closed runs are written to workflows/testdata/histories
// as record-every-list-changed-v1-NN (or -v0-NN with -pre-patch) for workflows/replay_test.go.
func TestHistoriesListChangedDuringScan(t *testing.T) {
	s := newStack(t, suggestContinueAsNewAt(10))
	srv := chaosServer(t, 2, 3, chaosmcp.DefaultCapabilities)
	src := s.addChaos("chaos", srv)
	first := s.waitCatalog(src, "first catalog", anyCatalog)
	s.waitSourceIdle("chaos")

	// The next scan's round A and round B each ask for a second page: a new resource (and its
	// list_changed) before each, with time for the source to take the list_changed alone.
	var second atomic.Int32
	srv.OnBetweenPages(func(k chaosmcp.ListKind, page int) {
		if k != chaosmcp.ListResources || page != 1 {
			return
		}
		if n := second.Add(1); n <= 2 {
			srv.Set(fmt.Sprintf("demo://r/%04d", n+4), "during the scan", "text/plain")
			time.Sleep(500 * time.Millisecond)
		}
	})
	srv.Set("demo://r/0001", "new", "text/plain")
	s.waitCatalog(src, "a catalog listing every resource", func(c ledger.Catalog) bool {
		return c.ID > first.ID && len(s.entryURIs(c)) == 6
	})
	s.waitSourceIdle("chaos")
	var signals int64
	eventually(t, 60*time.Second, "three list_changed taken and the source continued as new", func() (bool, string) {
		res, err := s.tc.QueryWorkflow(s.ctx, contract.SourceWorkflowID("chaos"), "", contract.QuerySourceState)
		if err != nil {
			return false, err.Error()
		}
		var v contract.SourceView
		if err := res.Get(&v); err != nil {
			return false, err.Error()
		}
		signals = v.ListChangedSignals
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, contract.SourceWorkflowID("chaos"), "")
		if err != nil {
			return false, err.Error()
		}
		return signals >= 3 && d.GetPendingWorkflowTask() == nil, fmt.Sprintf("%+v", v)
	})

	prefix := "record-every-list-changed-v1"
	if *prePatch {
		prefix = "record-every-list-changed-v0"
	}
	s.replayHistories(map[string]string{contract.SourceWorkflowName: prefix})
	var markers []string
	for _, ex := range s.executions() {
		if ex.GetType().GetName() == contract.SourceWorkflowName {
			markers = append(markers, versionMarkers(t, s.historyOf(ex.GetExecution().GetWorkflowId(), ex.GetExecution().GetRunId()), "record-every-list-changed")...)
		}
	}
	if *prePatch && len(markers) != 0 || !*prePatch && len(markers) == 0 {
		t.Errorf("pre-patch %v: version markers %v", *prePatch, markers)
	}
	t.Logf("%d list_changed signals in the newest run, markers %v", signals, markers)
}

// closeOnEndedSessionChange is the change ID of the close-on-ended-session patch
// (workflows/subscription_close.go, versionCloseOnEndedSession).
const closeOnEndedSessionChange = "close-on-ended-session"

// R20, issue 17 part 5: a subscription whose source is removed loses its session (the host
// drops it and records its end, which fences the ACTIVE subscription but closes nothing);
// the unsubscribe that arrives afterwards finds the session gone (StaleSession). A run of the
// current code goes through the close-on-ended-session patch (a version marker) and closes at
// once: one MCP unsubscribe, no UNSUBSCRIBE_UNKNOWN. With -pre-patch, on the code before
// dffcd2d, it waits in UNSUBSCRIBE_UNKNOWN retrying the dead session until a new session of
// the source (the source added again) makes the ledger close it. With -record-histories the
// subscription's history is written to workflows/testdata/histories as
// close-on-ended-session-v1-NN (or -v0-NN with -pre-patch).
func TestHistoriesCloseOnEndedSession(t *testing.T) {
	s := newStack(t)
	const uri = "demo://notes/1"
	url := s.serveChaos("ended", uri, "v1")
	s.mustCLI("source", "add", "ended", "--url", url)
	s.mustCLI("subscribe", "ended", uri)
	sub := s.waitDigest("ended", uri, ledger.Digest([]byte("v1")))
	s.waitView(sub.WorkflowID, "ACTIVE", func(v contract.StateView) bool { return v.State == mcpsync.StateActive })

	// The source removed in the ledger only (what `source remove` does before it signals):
	// the host drops its session and records the end before any unsubscribe arrives.
	src, open, err := s.st.RemoveSource(s.ctx, "ended")
	if err != nil {
		t.Fatal(err)
	}
	if len(open) != 1 || open[0].WorkflowID != sub.WorkflowID {
		t.Fatalf("open subscriptions at removal: %+v, want only %s", open, sub.WorkflowID)
	}
	eventually(t, 30*time.Second, "the session's end recorded", func() (bool, string) {
		sess, err := s.st.CurrentSession(s.ctx, src.ID)
		return errors.Is(err, ledger.ErrNoSession), fmt.Sprintf("%+v %v", sess, err)
	})
	if got := s.sub("ended", uri); got.State != mcpsync.StateReconciliationRequired {
		t.Errorf("after the session ended the ledger has %s, want RECONCILIATION_REQUIRED (fenced, not closed)", got.State)
	}
	if err := s.tc.SignalWorkflow(s.ctx, sub.WorkflowID, "", contract.SignalUnsubscribe,
		contract.Unsubscribe{ID: fmt.Sprintf("source-remove/%d", src.ID), Reason: "source ended removed"}); err != nil {
		t.Fatal(err)
	}

	if *prePatch {
		// The old code retries the unsubscribe on the dead session; only a new session of the
		// source closes it in the ledger, and the retry then follows the ledger.
		s.waitView(sub.WorkflowID, "UNSUBSCRIBE_UNKNOWN, retried", func(v contract.StateView) bool {
			return v.State == mcpsync.StateUnsubscribeUnknown && mcpUnsubscribes(s.history(sub.WorkflowID)) >= 2
		})
		s.mustCLI("source", "add", "ended", "--url", url)
	}
	eventually(t, 60*time.Second, "the subscription workflow completed", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, sub.WorkflowID, "")
		if err != nil {
			return false, err.Error()
		}
		st := d.GetWorkflowExecutionInfo().GetStatus()
		return st == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, st.String()
	})
	if got := s.sub("ended", uri); got.State != mcpsync.StateClosed {
		t.Errorf("ledger state %s (%s), want CLOSED", got.State, got.StateReason)
	}
	hist := s.history(sub.WorkflowID)

	prefix := "close-on-ended-session-v1"
	if *prePatch {
		prefix = "close-on-ended-session-v0"
	}
	if n := s.replayHistories(map[string]string{contract.SubscriptionWorkflowName: prefix})[contract.SubscriptionWorkflowName]; n != 1 {
		t.Errorf("%d subscription executions, want 1", n)
	}

	type branch struct {
		Markers        []string
		WentUnknown    bool // an UNSUBSCRIBE_UNKNOWN receipt
		OneUnsubscribe bool // a single MCP unsubscribe, not retried
	}
	want := branch{Markers: []string{closeOnEndedSessionChange + "=1"}, WentUnknown: false, OneUnsubscribe: true}
	if *prePatch {
		want = branch{Markers: nil, WentUnknown: true, OneUnsubscribe: false}
	}
	unknown := s.count(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'UNSUBSCRIBE_UNKNOWN'`, sub.ID)
	n := mcpUnsubscribes(hist)
	got := branch{Markers: versionMarkers(t, hist, closeOnEndedSessionChange), WentUnknown: unknown > 0, OneUnsubscribe: n == 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("branch taken by the unsubscribe on the ended session (-want +got):\n%s", diff)
	}
	t.Logf("%d MCP unsubscribes, %d UNSUBSCRIBE_UNKNOWN receipts, %d events", n, unknown, len(hist.GetEvents()))
}

// mcpUnsubscribes counts the MCP unsubscribe activities scheduled in hist.
func mcpUnsubscribes(hist *history.History) int {
	n := 0
	for _, ev := range hist.GetEvents() {
		if ev.GetActivityTaskScheduledEventAttributes().GetActivityType().GetName() == contract.ActMCPUnsubscribe {
			n++
		}
	}
	return n
}

// waitView queries the subscription workflow wfID until cond holds for its state view.
func (s *stack) waitView(wfID, what string, cond func(contract.StateView) bool) contract.StateView {
	s.t.Helper()
	var v contract.StateView
	eventually(s.t, 60*time.Second, what, func() (bool, string) {
		res, err := s.tc.QueryWorkflow(s.ctx, wfID, "", contract.QueryState)
		if err != nil {
			return false, err.Error()
		}
		if err := res.Get(&v); err != nil {
			return false, err.Error()
		}
		return cond(v), fmt.Sprintf("%+v", v)
	})
	return v
}

// history returns the whole history of the newest run of workflow wfID.
func (s *stack) history(wfID string) *history.History { return s.historyOf(wfID, "") }

// historyOf returns the whole history of run runID of workflow wfID (the newest when empty).
func (s *stack) historyOf(wfID, runID string) *history.History {
	s.t.Helper()
	hist := &history.History{}
	it := s.tc.GetWorkflowHistory(s.ctx, wfID, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		ev, err := it.Next()
		if err != nil {
			s.t.Fatal(err)
		}
		hist.Events = append(hist.Events, ev)
	}
	return hist
}

// versionMarkers lists the version markers (workflow.GetVersion) of change in hist, as
// "change=version".
func versionMarkers(t *testing.T, hist *history.History, change string) []string {
	t.Helper()
	var out []string
	for _, ev := range hist.GetEvents() {
		m := ev.GetMarkerRecordedEventAttributes()
		if m == nil || m.GetMarkerName() != "Version" {
			continue
		}
		var id string
		var version int
		dc := converter.GetDefaultDataConverter()
		if err := dc.FromPayloads(m.GetDetails()["change-id"], &id); err != nil {
			t.Fatalf("version marker of event %d: %v", ev.GetEventId(), err)
		}
		if err := dc.FromPayloads(m.GetDetails()["version"], &version); err != nil {
			t.Fatalf("version marker of event %d: %v", ev.GetEventId(), err)
		}
		if id == change {
			out = append(out, fmt.Sprintf("%s=%d", id, version))
		}
	}
	return out
}
