package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	sdkpb "go.temporal.io/api/sdk/v1"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Issue 17 part 7: a subscription workflow started by `mcpsync subscribe` carries a static
// summary and static details (user metadata, returned by DescribeWorkflowExecution), and
// current details that follow its state and last accepted version (the metadata query the
// Temporal UI asks), so the UI's list and detail page read without decoding payloads.
func TestSubscriptionUIMetadata(t *testing.T) {
	s := newStack(t)
	const uri = "demo://notes/1"
	srv := s.startChaosHTTP("ui", map[string]string{uri: "v1"})
	s.mustCLI("subscribe", "ui", uri)
	sub := s.waitDigest("ui", uri, ledger.Digest([]byte("v1")))

	d, err := s.tc.DescribeWorkflow(s.ctx, sub.WorkflowID, "")
	if err != nil {
		t.Fatal(err)
	}
	summary, err := d.GetStaticSummary()
	if err != nil {
		t.Fatal(err)
	}
	if want := "ui demo://notes/1 for default"; summary != want {
		t.Errorf("static summary %q, want %q", summary, want)
	}
	details, err := d.GetStaticDetails()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"**Source** `ui` (id ", "**URI** `demo://notes/1`", "**Principal** `default`", "**Refresh** backstop "} {
		if !strings.Contains(details, want) {
			t.Errorf("static details %q lack %q", details, want)
		}
	}

	short := func(body string) string { return "`" + ledger.Digest([]byte(body))[:len("sha256:")+12] + "…`" }
	s.waitCurrentDetails(sub.WorkflowID, "**ACTIVE** · version #1 "+short("v1")+" · current as of ")
	srv.Set(uri, "v2", "text/plain")
	s.waitDigest("ui", uri, ledger.Digest([]byte("v2")))
	got := s.waitCurrentDetails(sub.WorkflowID, "**ACTIVE** · version #2 "+short("v2")+" · current as of ")
	if want := "ui demo://notes/1 for default · session generation "; !strings.Contains(got, want) {
		t.Errorf("current details %q lack %q", got, want)
	}

	s.mustCLI("unsubscribe", "ui", uri)
	eventually(t, 60*time.Second, "the subscription workflow completed", func() (bool, string) {
		d, err := s.tc.DescribeWorkflowExecution(s.ctx, sub.WorkflowID, "")
		if err != nil {
			return false, err.Error()
		}
		st := d.GetWorkflowExecutionInfo().GetStatus()
		return st == enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED, st.String()
	})
	s.waitCurrentDetails(sub.WorkflowID, "**CLOSED** · version #2 "+short("v2"))
}

// waitCurrentDetails waits until the current details of workflow wfID start with prefix, and
// returns them.
func (s *stack) waitCurrentDetails(wfID, prefix string) string {
	s.t.Helper()
	var got string
	eventually(s.t, 60*time.Second, "current details "+prefix, func() (bool, string) {
		res, err := s.tc.QueryWorkflow(s.ctx, wfID, "", "__temporal_workflow_metadata")
		if err != nil {
			return false, err.Error()
		}
		var md sdkpb.WorkflowMetadata
		if err := res.Get(&md); err != nil {
			return false, err.Error()
		}
		got = md.GetCurrentDetails()
		return strings.HasPrefix(got, prefix), fmt.Sprintf("%q", got)
	})
	return got
}
