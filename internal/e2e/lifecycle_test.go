package e2e_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/mcpsync/mcpsync/internal/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
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
	old := workflows.HistoryThreshold
	workflows.HistoryThreshold = 1500
	t.Cleanup(func() { workflows.HistoryThreshold = old })
	s := newStack(t)
	s.startChaosHTTP("storm", map[string]string{"demo://notes/1": "v1"})
	s.mustCLI("subscribe", "storm", "demo://notes/1")
	sub := s.waitDigest("storm", "demo://notes/1", ledger.Digest([]byte("v1")))

	const total, senders = 10000, 8
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := 0; g < senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < total; i += senders {
				err := s.tc.SignalWorkflow(s.ctx, sub.WorkflowID, "", contract.SignalResourceUpdated,
					contract.ResourceUpdated{SessionGeneration: sub.SessionGeneration, Seq: int64(1_000_000 + i), ServerURI: "demo://notes/1"})
				if err != nil {
					errs <- fmt.Errorf("signal %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sent := time.Since(start)
	var v contract.StateView
	eventually(t, 2*time.Minute, "all signals counted", func() (bool, string) {
		var err error
		v, err = s.queryState(sub.WorkflowID)
		if err != nil {
			return false, err.Error()
		}
		return v.Counters.Notifications == total && v.State == "ACTIVE",
			fmt.Sprintf("counted %d of %d, state %s, runs %d", v.Counters.Notifications, total, v.State, v.ContinuedAsNew+1)
	})
	t.Logf("10,000 signals sent in %s, all counted after %s; %d continue-as-new; %d reads",
		sent.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), v.ContinuedAsNew, v.Counters.Reads)
	if v.ContinuedAsNew < 2 {
		t.Errorf("continued as new %d times, want at least 2", v.ContinuedAsNew)
	}
	if v.Counters.Reads >= total/2 {
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
}
