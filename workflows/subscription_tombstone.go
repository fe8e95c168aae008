package workflows

import (
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// reconcileTombstone confirms or clears a TOMBSTONE_PENDING subscription by list
// reconciliation (R21): a discovery scan of the source, started after the not-found read, is
// offered to the ledger's ConfirmTombstone. A catalog without the URI confirms the deletion:
// the ledger writes the tombstone and its invalidation and passes the close fence at once, and
// the subscription then unsubscribes and closes. A catalog that lists the URI brings the
// subscription back to ACTIVE and re-reads it. Anything else scans again, with backoff.
func (w *subscription) reconcileTombstone() {
	attempt := w.st.TombstoneAttempts
	f := StartReconciliationScan(w.ctx, contract.ReconcileScanRequest{
		SourceID: w.in.SourceID, Source: w.in.Source, SubscriptionID: w.st.SubscriptionID,
		Generation: w.st.Generation, ReadOrdinal: w.st.LastAcceptedOrdinal, Attempt: attempt,
	})
	w.await(f)
	if w.m.State() != mcpsync.StateTombstonePending {
		return // closed, or the session changed, while the scan ran
	}
	retry := func(reason string) {
		w.st.TombstoneAttempts++
		w.st.Reason = reasonf(nil, "tombstone pending: %s", reason)
		w.sleep(backoff(w.st.TombstoneAttempts, 2*time.Second, EstablishRetryMax))
	}
	var res contract.DiscoveryScanResult
	if err := f.Get(w.ctx, &res); err != nil {
		retry(reasonf(err, "reconciliation scan failed"))
		return
	}
	var out contract.ConfirmTombstoneOutput
	if err := w.local(contract.ActConfirmTombstone, contract.ConfirmTombstoneInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation, CatalogID: res.CatalogID,
	}, &out); err != nil {
		retry(reasonf(err, "confirming failed"))
		return
	}
	switch {
	case out.Outcome.OK():
		w.st.CloseEpoch, w.st.TombstoneAttempts = out.CloseEpoch, 0
		w.st.Reason = reasonf(nil, "deleted: read %d answered not found and catalog %d (%s) does not list it", out.ReadOrdinal, res.CatalogID, res.Level)
		w.apply(fsm.TombstoneConfirmed)
	case out.Refusal == mcpsync.TombstoneResourcePresent:
		var tr contract.TransitionOutput
		if err := w.local(contract.ActRestoreFromTombstone, w.transition(0, ""), &tr); err != nil {
			retry(reasonf(err, "resource listed again, restoring failed"))
			return
		}
		if !tr.Outcome.OK() {
			retry(reasonf(nil, "resource listed again, restoring refused (%s %s)", tr.Outcome, tr.State))
			return
		}
		w.st.TombstoneAttempts, w.st.Reason = 0, ""
		w.nextReason = mcpsync.ReasonReconcile
		w.apply(fsm.ResourcePresent)
	case out.Refusal == mcpsync.TombstoneNotPending || out.Refusal == mcpsync.TombstoneOldGeneration:
		// The ledger moved on (a session change or a close): follow it.
		if ref, err := w.ledgerState(); err == nil && ref.State != mcpsync.StateTombstonePending {
			if ref.State.Closing() {
				w.adopt(ref.State) // the ledger passed the close fence (R18)
			} else {
				w.apply(fsm.IdentityUnknown)
			}
			return
		}
		retry(reasonf(nil, "ledger refused: %s", out.Refusal))
	default:
		retry(reasonf(nil, "catalog %d (%s) cannot confirm: %s", res.CatalogID, res.Level, out.Refusal))
	}
}
