package workflows_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
)

// R3, R6: a list_changed that arrives after round B of a scan ended, before its catalog is
// published, is recorded in the ledger even though an earlier list_changed of the same scan
// (arriving before round A began) was recorded already: the catalog is not served as valid
// (the publication or the record invalidates it, whichever commits second), and the scan
// that follows supersedes it.
func TestListChangedBeforePublishInvalidates(t *testing.T) {
	h := newDiscoveryHarness(t, false)
	f := &fakeRounds{store: h.st, plays: []scripted{{set: "S"}, {set: "S"}, {set: "S"}, {set: "S"}}}
	var mu sync.Mutex
	records := 0
	firstRecord := make(chan struct{})
	realInvalidate := (&activities.Catalog{Store: h.st}).InvalidateCatalogs
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in contract.InvalidateInput) (int64, error) {
		n, err := realInvalidate(ctx, in)
		mu.Lock()
		records++
		if records == 1 {
			close(firstRecord)
		}
		mu.Unlock()
		return n, err
	}, activity.RegisterOptions{Name: contract.ActInvalidateCatalogs, DisableAlreadyRegisteredCheck: true})
	rounds := 0
	registerRounds(h.env, h.st, func(ctx context.Context, in contract.RoundInput) (contract.RoundResult, error) {
		mu.Lock()
		rounds++
		n := rounds
		mu.Unlock()
		if n == 1 {
			// The first list_changed of the scan is recorded before round A begins.
			h.env.SignalWorkflow(contract.SignalListChanged, contract.ListChanged{SessionGeneration: in.SessionGeneration, Count: 1})
			select {
			case <-firstRecord:
			case <-ctx.Done():
				return contract.RoundResult{}, ctx.Err()
			}
		}
		r, err := f.round(ctx, in)
		if err == nil && n == 2 {
			// The second one arrives after round B ended, before the catalog is published.
			h.env.SignalWorkflow(contract.SignalListChanged, contract.ListChanged{SessionGeneration: in.SessionGeneration, Count: 2})
		}
		return r, err
	})
	h.env.RegisterWorkflowWithOptions(workflows.SourceWorkflow, workflow.RegisterOptions{Name: contract.SourceWorkflowName})
	h.env.RegisterWorkflowWithOptions(workflows.DiscoveryScanWorkflow, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
	h.env.RegisterDelayedCallback(h.env.CancelWorkflow, 3*time.Minute)
	h.env.ExecuteWorkflow(contract.SourceWorkflowName, contract.SourceInput{SourceID: h.src.ID, Source: "demo", RecheckSeconds: 3600})
	if err := h.env.GetWorkflowError(); !temporal.IsCanceledError(err) {
		t.Fatalf("workflow ended with %v, want cancelled", err)
	}
	cats, err := h.st.Catalogs(h.ctx, h.src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(cats) != 2 {
		t.Fatalf("%d catalogs, want the scan's and the follow-up scan's", len(cats))
	}
	first, rescan := cats[1], cats[0]
	if first.InvalidatedAt == nil {
		t.Errorf("catalog %d (%s) published valid although a list_changed arrived before its publication", first.ID, first.Level)
	}
	if rescan.InvalidatedAt != nil || rescan.Level != ledger.ProofSnapshotUnproven {
		t.Errorf("follow-up catalog %d: %s, invalidated %v (%s)", rescan.ID, rescan.Level, rescan.InvalidatedAt, rescan.InvalidatedReason)
	}
	if records != 2 {
		t.Errorf("list_changed recorded %d times, want 2", records)
	}
}
