package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// shouldContinueAsNew reports whether this run's history is long enough to continue as new.
// It reads the workflow info only, so it emits no command.
func (w *subscription) shouldContinueAsNew() bool {
	info := workflow.GetInfo(w.ctx)
	return info.GetContinueAsNewSuggested() || info.GetCurrentHistoryLength() >= HistoryThreshold ||
		w.signalsThisRun >= SignalThreshold || w.updatesThisRun >= UpdateThreshold
}

// continueAsNew continues as new from any state but CLOSED, carrying the whole state: the
// machine as (SubscriptionState.Machine, SubscriptionState.Dirty), which comes back through
// fsm.Resume, the reason of the next read, a failed reconciliation mark, a close request whose
// fence failed (with its failure count, so its backoff goes on), the retry counters and the
// signal IDs seen. Reads a closed subscription still waits for are settled first (R19).
// Pending signals and updates are drained into the state; if a drained one needs action first
// (a new close request, a session change), it returns nil and the loop handles it.
func (w *subscription) continueAsNew() error {
	w.settleLateReads()
	// Update handlers first: a handler that runs while this waits queues its notification,
	// which the drain below records. Nothing yields between the drain and the return, so no
	// handler can run after it.
	if err := workflow.Await(w.ctx, func() bool { return workflow.AllHandlersFinished(w.ctx) }); err != nil {
		return err
	}
	w.drainSignals()
	if w.st.PendingSessionChange > 0 || w.st.PendingUnsubscribe != "" && w.st.CloseFenceFailures == 0 && !w.m.State().Closing() {
		return nil
	}
	if w.refreshCancel != nil {
		w.refreshCancel()
	}
	w.st.Machine, w.st.Dirty = w.m.State(), w.m.Dirty()
	w.st.NextReason = w.nextReason
	w.st.ContinuedAsNew++
	next := w.in
	next.State = w.st
	return workflow.NewContinueAsNewError(w.ctx, contract.SubscriptionWorkflowName, next)
}

// settleLateReads waits for the reads still in flight when the close fence passed and offers
// each answer to the acceptance point, which only records STALE_AFTER_CLOSE (R19): a run
// cannot hand an activity it started to the next one. Each read ends within its activity
// timeouts.
func (w *subscription) settleLateReads() {
	for _, r := range w.lateReads {
		w.await(r.future)
		w.settleRead(r.future, r.ordinal, r.reqID)
	}
	w.lateReads = nil
}
