package workflows_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// templateScan stands in for DiscoveryScanWorkflow: it publishes an unproven catalog of two
// rounds that lists no resource and one resource template producing the test URI.
func (h *harness) templateScan(ctx workflow.Context, in contract.DiscoveryScanInput) (contract.DiscoveryScanResult, error) {
	run := fmt.Sprintf("template-scan/%s", workflow.GetInfo(ctx).WorkflowExecution.RunID)
	var basis []int64
	for n := 1; n <= 2; n++ {
		id, _, err := h.st.BeginScan(h.ctx, ledger.ScanStart{Key: fmt.Sprintf("%s/%d", run, n), Run: run, ScanWorkflowID: run,
			Round: n, SourceID: h.src.ID, SessionGeneration: h.sess.Generation})
		if err != nil {
			return contract.DiscoveryScanResult{}, err
		}
		tpl := "demo://notes/{id}"
		if _, err := h.st.EndScan(h.ctx, ledger.ScanEnd{ScanID: id, SetDigest: "sha256:templates",
			Progress: ledger.ScanProgress{ResourcePages: 1, TemplatePages: 1, Templates: 1}, ResourceCursorDigests: []string{"c"}},
			[]ledger.ScanEntry{{Kind: ledger.EntryTemplate, URI: tpl, ServerURI: tpl, Name: "note"}}); err != nil {
			return contract.DiscoveryScanResult{}, err
		}
		basis = append(basis, id)
	}
	c, err := h.st.PublishCatalog(h.ctx, ledger.PublishRequest{Key: run, ScanWorkflowID: run, SourceID: h.src.ID,
		SessionGeneration: h.sess.Generation, Level: ledger.ProofSnapshotUnproven, Reason: "test", RoundsUsed: 2,
		BasisScanIDs: basis, Recheck: time.Hour})
	if err != nil {
		return contract.DiscoveryScanResult{}, err
	}
	return contract.DiscoveryScanResult{CatalogID: c.ID, Level: string(c.Level), SessionGeneration: h.sess.Generation, Rounds: 2}, nil
}

// R21: the deletion of a URI only a resource template produces is not confirmed by its
// absence from a catalog (TEMPLATE_URI); the workflow confirms it by repeated not-found
// reads spaced over about two minutes (receipt reason 'repeated_not_found'), and a read that
// finds the resource again restores the subscription instead.
func TestTemplateURITombstoneConfirmedByReads(t *testing.T) {
	tests := []struct {
		name string
		// foundAfter: the resource answers again from this many probe reads on (0: never).
		foundAfter int
		state      mcpsync.State // when the test unsubscribes; "": the workflow closes by itself before
		want       map[mcpsync.ReceiptKind]int
	}{
		{name: "three not-found reads confirm", want: map[mcpsync.ReceiptKind]int{
			mcpsync.ReceiptTombstoneProbeNotFound: 3, mcpsync.ReceiptTombstoneConfirmed: 1, mcpsync.ReceiptTombstoneCleared: 0,
		}},
		{name: "a read that finds the resource restores", foundAfter: 2, state: mcpsync.StateActive, want: map[mcpsync.ReceiptKind]int{
			mcpsync.ReceiptTombstoneProbeNotFound: 1, mcpsync.ReceiptTombstoneConfirmed: 0, mcpsync.ReceiptTombstoneCleared: 1,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			(&activities.Catalog{Store: h.st}).Register(h.env)
			h.env.RegisterWorkflowWithOptions(h.templateScan, workflow.RegisterOptions{Name: contract.DiscoveryScanWorkflowName})
			h.at(time.Minute, func() {
				h.mcp.mu.Lock()
				h.mcp.notFound = true
				h.mcp.mu.Unlock()
				h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
			})
			if tt.foundAfter > 0 {
				// Reads 1 and 2 are the initial read and the not-found; probes follow.
				var poll func()
				poll = func() {
					h.mcp.mu.Lock()
					if len(h.mcp.reads) >= 2+tt.foundAfter-1 {
						h.mcp.notFound = false
						h.mcp.mu.Unlock()
						return
					}
					h.mcp.mu.Unlock()
					h.at(time.Second, poll)
				}
				h.at(time.Minute+time.Second, poll)
			}
			var seen mcpsync.State
			h.at(20*time.Minute, func() {
				seen = h.sub().State
				h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u-final"})
			})
			v := h.run()
			if v.State != mcpsync.StateClosed {
				t.Errorf("final state %s, want CLOSED", v.State)
			}
			if seen != tt.state { // the confirmation closes the subscription by itself
				t.Errorf("state before the unsubscribe %s, want %s", seen, tt.state)
			}
			sub := h.sub()
			kinds := h.receiptKinds(sub.ID)
			got := map[mcpsync.ReceiptKind]int{}
			for k := range tt.want {
				got[k] = kinds[k]
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("receipts (-want +got):\n%s", diff)
			}
			var refusals, byReads int
			if err := h.st.Pool().QueryRow(h.ctx, `SELECT
					(SELECT count(*) FROM catalog_consumptions WHERE subscription_id = $1 AND purpose = 'tombstone' AND refusal = 'TEMPLATE_URI'),
					(SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'TOMBSTONE_CONFIRMED' AND detail->>'reason' = 'repeated_not_found')`,
				sub.ID).Scan(&refusals, &byReads); err != nil {
				t.Fatal(err)
			}
			if refusals != 1 || byReads != tt.want[mcpsync.ReceiptTombstoneConfirmed] {
				t.Errorf("TEMPLATE_URI consumptions %d (want 1), confirmations by reads %d", refusals, byReads)
			}
		})
	}
}
