package e2e_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/converter"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// startChaosHTTP starts a fault-injecting server over streamable HTTP with the given
// resources, registers it as source name, and returns it.
func (s *stack) startChaosHTTP(name string, resources map[string]string) *chaosmcp.Server {
	s.t.Helper()
	srv := chaosmcp.New(chaosmcp.Options{Name: name, Version: "1.0.0"})
	s.t.Cleanup(func() { srv.Close() })
	for uri, body := range resources {
		srv.Set(uri, body, "text/plain")
	}
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { h.Close() })
	s.mustCLI("source", "add", name, "--url", h.URL)
	return srv
}

// queryState asks a subscription workflow for its state.
func (s *stack) queryState(wfID string) (contract.StateView, error) {
	var v contract.StateView
	res, err := s.tc.QueryWorkflow(s.ctx, wfID, "", contract.QueryState)
	if err != nil {
		return v, err
	}
	return v, res.Get(&v)
}

// 10,000 notification signals sent concurrently to one subscription on a real Temporal
// server: the workflow continues as new several times, draining signals that arrive in the
// same workflow task as the switch, and counts every one of them; reads stay coalesced.
func TestContinueAsNewUnderSignalStorm(t *testing.T) {
	s := newStack(t, suggestContinueAsNewAt(1500))
	s.startChaosHTTP("storm", map[string]string{"demo://notes/1": "v1"})
	s.mustCLI("subscribe", "storm", "demo://notes/1")
	sub := s.waitDigest("storm", "demo://notes/1", ledger.Digest([]byte("v1")))
	v, sent, counted := s.storm(sub, 10000, 2, func(u contract.ResourceUpdated) error {
		return s.tc.SignalWorkflow(s.ctx, sub.WorkflowID, "", contract.SignalResourceUpdated, u)
	})
	t.Logf("10,000 signals sent in %s, all counted after %s; %d continue-as-new; %d reads",
		sent.Round(time.Millisecond), counted.Round(time.Millisecond), v.ContinuedAsNew, v.Counters.Reads)
}

// storm sends total notifications of sub's URI to its workflow from 8 goroutines (send
// delivers one), waits until the workflow has counted every one of them exactly, and checks
// that it continued as new at least minContinued times, that reads stayed coalesced and that
// the server lists one run per continue-as-new and the current one. It returns the workflow's
// final view, how long sending took and how long until all were counted.
func (s *stack) storm(sub ledger.Subscription, total, minContinued int, send func(contract.ResourceUpdated) error) (v contract.StateView, sent, counted time.Duration) {
	t := s.t
	t.Helper()
	const senders = 8
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Go(func() {
			for i := g; i < total; i += senders {
				u := contract.ResourceUpdated{SessionGeneration: sub.SessionGeneration, Seq: int64(1_000_000 + i), ServerURI: sub.ServerURI}
				if err := send(u); err != nil {
					errs <- fmt.Errorf("notification %d: %w", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sent = time.Since(start)
	eventually(t, 2*time.Minute, "all notifications counted", func() (bool, string) {
		var err error
		v, err = s.queryState(sub.WorkflowID)
		if err != nil {
			return false, err.Error()
		}
		return v.Counters.Notifications == int64(total) && v.State == mcpsync.StateActive,
			fmt.Sprintf("counted %d of %d, state %s, runs %d", v.Counters.Notifications, total, v.State, v.ContinuedAsNew+1)
	})
	counted = time.Since(start)
	if v.ContinuedAsNew < minContinued {
		t.Errorf("continued as new %d times, want at least %d", v.ContinuedAsNew, minContinued)
	}
	if v.Counters.Reads >= int64(total/2) {
		t.Errorf("%d reads for %d notifications: pulses were not coalesced", v.Counters.Reads, total)
	}
	resp, err := s.tc.ListWorkflow(s.ctx, &workflowservice.ListWorkflowExecutionsRequest{
		Namespace: s.ts.GetDefaultNamespace(), Query: fmt.Sprintf("WorkflowId = %q", sub.WorkflowID),
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(resp.GetExecutions()); got != v.ContinuedAsNew+1 {
		t.Errorf("%d runs listed, workflow counted %d continue-as-new", got, v.ContinuedAsNew)
	}
	return v, sent, counted
}

// The Temporal UI finds a subscription by source, URI, state and principal (search
// attributes). The last accepted digest is on its detail page (current details,
// TestSubscriptionUIMetadata); since the local-read patch (issue 16 item 2) the memo no longer
// mirrors it, which saves a history event per update.
func TestSearchAttributesAndMemo(t *testing.T) {
	s := newStack(t)
	s.startChaosHTTP("ui", map[string]string{"demo://notes/1": "v1"})
	s.mustCLI("subscribe", "ui", "demo://notes/1")
	sub := s.waitDigest("ui", "demo://notes/1", ledger.Digest([]byte("v1")))
	query := `McpsyncSource = "ui" AND McpsyncURI = "demo://notes/1" AND McpsyncState = "ACTIVE" AND McpsyncPrincipal = "default"`
	eventually(t, 30*time.Second, "visibility query", func() (bool, string) {
		resp, err := s.tc.ListWorkflow(s.ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: s.ts.GetDefaultNamespace(), Query: query})
		if err != nil {
			return false, err.Error()
		}
		for _, ex := range resp.GetExecutions() {
			if ex.GetExecution().GetWorkflowId() != sub.WorkflowID {
				continue
			}
			if p := ex.GetMemo().GetFields()["lastAcceptedDigest"]; p != nil {
				var digest string
				_ = converter.GetDefaultDataConverter().FromPayload(p, &digest)
				return false, "the memo still mirrors the accepted digest " + digest
			}
			return true, ""
		}
		return false, fmt.Sprintf("%d executions match, none is %s", len(resp.GetExecutions()), sub.WorkflowID)
	})
	s.mustCLI("unsubscribe", "ui", "demo://notes/1")
	eventually(t, 30*time.Second, "state CLOSED in visibility", func() (bool, string) {
		resp, err := s.tc.ListWorkflow(s.ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: s.ts.GetDefaultNamespace(),
			Query: `McpsyncSource = "ui" AND McpsyncState = "CLOSED"`})
		if err != nil {
			return false, err.Error()
		}
		return len(resp.GetExecutions()) == 1, fmt.Sprintf("%d executions", len(resp.GetExecutions()))
	})
}

// A subscription whose workflow died (terminated here) while the ledger says ACTIVE is
// restarted by `mcpsync reconcile`: it re-subscribes on the live session and keeps accepting.
// status shows why a subscription is not ACTIVE and the staleness bound of active ones.
func TestReconcileRestartsFailedSubscription(t *testing.T) {
	s := newStack(t)
	srv := s.startChaosHTTP("rec", map[string]string{"demo://notes/1": "v1"})
	s.mustCLI("subscribe", "rec", "demo://notes/1")
	sub := s.waitDigest("rec", "demo://notes/1", ledger.Digest([]byte("v1")))
	if out := s.mustCLI("status", "rec"); !strings.Contains(out, "notify, stale <= 36s") {
		t.Errorf("status does not show the freshness of an active subscription:\n%s", out)
	}
	if err := s.tc.TerminateWorkflow(s.ctx, sub.WorkflowID, "", "test: the workflow dies"); err != nil {
		t.Fatal(err)
	}
	out := s.mustCLI("reconcile", "rec")
	if !strings.Contains(out, "restarted workflow") {
		t.Fatalf("reconcile output:\n%s", out)
	}
	eventually(t, 30*time.Second, "re-subscribed", func() (bool, string) {
		cur := s.sub("rec", "demo://notes/1")
		reasons := s.readReasons(cur.ID)
		v, qerr := s.queryState(cur.WorkflowID)
		return cur.State == mcpsync.StateActive && len(reasons) >= 2 && reasons[len(reasons)-1] == mcpsync.ReasonReconcile,
			fmt.Sprintf("state %s reasons %v; workflow %+v %v", cur.State, reasons, v, qerr)
	})
	srv.Set("demo://notes/1", "v2", "text/plain")
	s.waitDigest("rec", "demo://notes/1", ledger.Digest([]byte("v2")))
	if out := s.mustCLI("reconcile", "rec", "demo://notes/1"); !strings.Contains(out, "none (active)") {
		t.Errorf("reconcile of a healthy subscription:\n%s", out)
	}
}

// readReasons lists the reasons of a subscription's read dispatches in ordinal order.
func (s *stack) readReasons(subID int64) []mcpsync.ReadReason {
	s.t.Helper()
	rows, err := s.st.Pool().Query(s.ctx, `SELECT reason FROM read_dispatches WHERE subscription_id = $1 ORDER BY ordinal`, subID)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var out []mcpsync.ReadReason
	for rows.Next() {
		var r mcpsync.ReadReason
		if err := rows.Scan(&r); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}
