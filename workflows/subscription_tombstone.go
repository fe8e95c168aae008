package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// reconcileTombstone confirms or clears a TOMBSTONE_PENDING subscription by list
// reconciliation (R21): a discovery scan of the source, started after the not-found read, is
// offered to the ledger's ConfirmTombstone. A catalog without the URI confirms the deletion:
// the ledger writes the tombstone and its invalidation and passes the close fence at once, and
// the subscription then unsubscribes and closes. A catalog that lists the URI brings the
// subscription back to ACTIVE and re-reads it. A catalog whose resource templates produce the
// URI proves nothing (TEMPLATE_URI): the deletion is then confirmed by repeated not-found
// reads instead (probeTombstone). Anything else scans again, with backoff.
func (w *subscription) reconcileTombstone() {
	if w.st.TombstoneByReadsAt == w.st.Counters.NotFound+1 {
		w.probeTombstone()
		return
	}
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
		w.restoreFromTombstone("resource listed again", retry)
	case out.Refusal == mcpsync.TombstoneTemplateURI:
		// Absence from a list proves nothing for a URI a template produces (R21).
		w.st.TombstoneAttempts, w.st.TombstoneProbes = 0, 0
		w.st.TombstoneByReadsAt = w.st.Counters.NotFound + 1
		w.st.Reason = reasonf(nil, "tombstone pending: a resource template of catalog %d produces the URI; confirming by repeated reads", res.CatalogID)
	case out.Refusal == mcpsync.TombstoneNotPending || out.Refusal == mcpsync.TombstoneOldGeneration:
		w.followLedger(out.Refusal, retry)
	default:
		retry(reasonf(nil, "catalog %d (%s) cannot confirm: %s", res.CatalogID, res.Level, out.Refusal))
	}
}

// restoreFromTombstone brings a TOMBSTONE_PENDING subscription whose resource exists again
// back to ACTIVE, with a reconciliation read next; why says what showed it exists.
func (w *subscription) restoreFromTombstone(why string, retry func(string)) {
	var tr contract.TransitionOutput
	if err := w.local(contract.ActRestoreFromTombstone, w.transition(0, ""), &tr); err != nil {
		retry(reasonf(err, "%s, restoring failed", why))
		return
	}
	if !tr.Outcome.OK() {
		retry(reasonf(nil, "%s, restoring refused (%s %s)", why, tr.Outcome, tr.State))
		return
	}
	w.st.TombstoneAttempts, w.st.TombstoneProbes, w.st.TombstoneByReadsAt, w.st.Reason = 0, 0, 0, ""
	w.nextReason = mcpsync.ReasonReconcile
	w.apply(fsm.ResourcePresent)
}

// followLedger follows a ledger that refused a tombstone confirmation because it moved on (a
// session change or a close); while it still says TOMBSTONE_PENDING, it retries.
func (w *subscription) followLedger(refusal mcpsync.TombstoneRefusal, retry func(string)) {
	if ref, err := w.ledgerState(); err == nil && ref.State != mcpsync.StateTombstonePending {
		if ref.State.Closing() {
			w.adopt(ref.State) // the ledger passed the close fence (R18)
		} else {
			w.apply(fsm.IdentityUnknown)
		}
		return
	}
	retry(reasonf(nil, "ledger refused: %s", refusal))
}

// Spacing of the not-found reads that confirm a deletion no list can prove (R21): the k-th
// read waits TombstoneProbeSpacing·2^(k-1), at most TombstoneProbeSpacingMax, so the ledger's
// three reads span about two minutes after the first not-found, never more than a few.
const (
	TombstoneProbeSpacing    = 15 * time.Second
	TombstoneProbeSpacingMax = 2 * time.Minute
)

// probeTombstone runs one spaced probe of a TOMBSTONE_PENDING subscription whose URI only a
// resource template produces (R21): it waits, reads the URI again on the session, and a
// resource that answers brings the subscription back to ACTIVE (restoreFromTombstone). A
// not-found answer is recorded in the ledger (RecordTombstoneProbe); once the ledger holds
// the required number, ConfirmTombstoneByReads writes the tombstone with receipt reason
// 'repeated_not_found' and passes the close fence. A failed read counts for nothing either
// way: it is retried at the next spacing.
func (w *subscription) probeTombstone() {
	w.sleep(backoff(w.st.TombstoneProbes, TombstoneProbeSpacing, TombstoneProbeSpacingMax))
	if w.m.State() != mcpsync.StateTombstonePending {
		return // closed, or the session changed, while waiting
	}
	retry := func(reason string) {
		w.st.Reason = reasonf(nil, "tombstone pending: %s", reason)
	}
	w.st.ReadSeq++
	reqID := fmt.Sprintf("%s/%s/r%d", w.wfID, workflow.GetInfo(w.ctx).WorkflowExecution.RunID, w.st.ReadSeq)
	f := workflow.ExecuteActivity(w.hostCtx(30*time.Second, 3), contract.ActMCPRead, contract.ReadInput{
		SourceID: w.in.SourceID, SessionGeneration: w.st.SessionGeneration, ServerURI: w.in.ServerURI,
		Ordinal: w.st.LastAcceptedOrdinal, RequestID: reqID,
	})
	w.await(f)
	if w.m.State() != mcpsync.StateTombstonePending {
		return
	}
	w.st.Counters.Reads++
	var read contract.ReadOutput
	if err := f.Get(w.ctx, &read); err != nil {
		w.st.Counters.ReadFailures++
		retry(reasonf(err, "repeated read failed"))
		return
	}
	if read.Found {
		w.restoreFromTombstone("resource readable again", retry)
		return
	}
	var probe contract.TombstoneProbeOutput
	if err := w.local(contract.ActRecordTombstoneProbe, contract.TombstoneProbeInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: w.st.SessionGeneration, RequestID: reqID,
	}, &probe); err != nil {
		retry(reasonf(err, "recording the repeated not-found failed"))
		return
	}
	if probe.Outcome == mcpsync.OutcomeRefused {
		w.followLedger(mcpsync.TombstoneNotPending, retry)
		return
	}
	w.st.TombstoneProbes = int(probe.Probes)
	if probe.Probes < probe.Required {
		retry(fmt.Sprintf("%d of %d repeated reads answered not found", probe.Probes, probe.Required))
		return
	}
	var out contract.ConfirmTombstoneOutput
	if err := w.local(contract.ActConfirmTombstoneByReads, contract.ConfirmByReadsInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
	}, &out); err != nil {
		retry(reasonf(err, "confirming by repeated reads failed"))
		return
	}
	switch {
	case out.Outcome.OK():
		w.st.CloseEpoch, w.st.TombstoneProbes, w.st.TombstoneByReadsAt = out.CloseEpoch, 0, 0
		w.st.Reason = reasonf(nil, "deleted: read %d and %d repeated reads answered not found", out.ReadOrdinal, probe.Probes)
		w.apply(fsm.TombstoneConfirmed)
	case out.Refusal == mcpsync.TombstoneNotPending || out.Refusal == mcpsync.TombstoneOldGeneration:
		w.followLedger(out.Refusal, retry)
	default:
		retry(reasonf(nil, "ledger refused the confirmation by reads: %s", out.Refusal))
	}
}
