package workflows_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdkpb "go.temporal.io/api/sdk/v1"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// metadataQuery is the SDK's built-in query that serves a workflow's current details (the
// Temporal UI asks it; the SDK does not export its name).
const metadataQuery = "__temporal_workflow_metadata"

// currentDetails returns the current details of the harness's workflow, as the Temporal UI
// reads them (the SDK's workflow metadata query).
func (h *harness) currentDetails() string {
	h.t.Helper()
	res, err := h.env.QueryWorkflow(metadataQuery)
	if err != nil {
		h.t.Fatalf("metadata query: %v", err)
	}
	var md sdkpb.WorkflowMetadata
	if err := res.Get(&md); err != nil {
		h.t.Fatalf("metadata query: %v", err)
	}
	return md.GetCurrentDetails()
}

// Issue 17 part 7: the current details follow the state and the last accepted version (its
// ordinal and short digest, and when the read that found it was sent), and name the
// subscription (a run that continued as new has no static summary of its own).
func TestCurrentDetailsFollowTheSubscription(t *testing.T) {
	h := newHarness(t)
	sent := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	h.mcp.sentAt = sent
	var got []string
	look := func() { got = append(got, h.currentDetails()) }
	h.at(30*time.Second, look)
	h.at(time.Minute, func() {
		h.mcp.set("v2")
		h.mcp.setSentAt(sent.Add(time.Minute))
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
	})
	h.at(90*time.Second, look)
	h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	if v := h.run(); v.State != mcpsync.StateClosed {
		t.Fatalf("final state %s", v.State)
	}
	look()

	short := func(body string) string { return "`" + ledger.Digest([]byte(body))[:len("sha256:")+12] + "…`" }
	wantFirstLines := []string{
		"**ACTIVE** · version #1 " + short("v1") + " · current as of 2026-01-01T12:00:00Z  ",
		"**ACTIVE** · version #2 " + short("v2") + " · current as of 2026-01-01T12:01:00Z  ",
		"**CLOSED** · version #2 " + short("v2") + " · current as of 2026-01-01T12:01:00Z  ",
	}
	var first []string
	for _, d := range got {
		line, _, _ := strings.Cut(d, "\n")
		first = append(first, line)
		if want := "demo demo://notes/1 for default · session generation"; !strings.Contains(d, want) {
			t.Errorf("details %q do not name the subscription (%q)", d, want)
		}
	}
	if diff := cmp.Diff(wantFirstLines, first); diff != "" {
		t.Errorf("current details, first lines (-want +got):\n%s", diff)
	}
	if !strings.Contains(got[2], "**Reason** unsubscribed") {
		t.Errorf("closed details %q do not say why", got[2])
	}
}

// A continued run (the state carried in its input) sets its current details at once, from
// the carried state, before anything else happens.
func TestCurrentDetailsAfterContinueAsNew(t *testing.T) {
	h := newHarness(t)
	in := h.input()
	in.State = &contract.SubscriptionState{
		SubscriptionID: 1, Generation: 1, Machine: mcpsync.StateReconciliationRequired, Reason: "session changed to generation 7",
		LastAcceptedOrdinal: 41, LastAcceptedDigest: ledger.Digest([]byte("x")), ContinuedAsNew: 3,
		Counters: contract.Counters{ReadsByReason: map[mcpsync.ReadReason]int64{}},
	}
	var got string
	h.at(time.Millisecond, func() {
		got = h.currentDetails()
		h.env.CancelWorkflow()
	})
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, in)
	for _, want := range []string{
		"**RECONCILIATION_REQUIRED** · version #41 `" + ledger.Digest([]byte("x"))[:19] + "…`",
		"**Reason** session changed to generation 7",
		"demo demo://notes/1 for default",
		"continued as new 3 times",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("details %q lack %q", got, want)
		}
	}
}
