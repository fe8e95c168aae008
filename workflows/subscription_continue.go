package workflows

import (
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

func (w *subscription) shouldContinueAsNew() bool {
	info := workflow.GetInfo(w.ctx)
	return info.GetContinueAsNewSuggested() || info.GetCurrentHistoryLength() >= HistoryThreshold ||
		w.signalsThisRun >= SignalThreshold
}

// continueAsNew drains pending signals into the state and continues as new with it; if a
// drained signal needs action first, it returns nil and the loop handles it. The machine
// travels as (SubscriptionState.Machine, SubscriptionState.Dirty) and comes back through
// fsm.Resume.
func (w *subscription) continueAsNew() error {
	w.drainSignals()
	if s := w.m.State(); w.st.PendingUnsubscribe != "" || w.st.PendingSessionChange > 0 ||
		s != mcpsync.StateActive && s != mcpsync.StateUpdateSeen {
		return nil
	}
	if err := workflow.Await(w.ctx, func() bool { return workflow.AllHandlersFinished(w.ctx) }); err != nil {
		return err
	}
	if w.refreshCancel != nil {
		w.refreshCancel()
	}
	w.st.Machine, w.st.Dirty = w.m.State(), w.m.Dirty()
	w.st.ContinuedAsNew++
	next := w.in
	next.State = w.st
	return workflow.NewContinueAsNewError(w.ctx, contract.SubscriptionWorkflowName, next)
}
