package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// beginClose passes the close fence in the ledger (R18) and moves to UNSUBSCRIBING, or to
// the further closing state the ledger answers with. A close fence that failed stays pending
// and is tried again when its backoff timer fires (armCloseRetry), in this run or, carried in
// the state, the next one.
func (w *subscription) beginClose(reason string) {
	if w.refreshCancel != nil {
		w.refreshCancel()
		w.refresh, w.refreshCancel = nil, nil
	}
	var tr contract.TransitionOutput
	if err := w.local(contract.ActBeginUnsubscribe, w.transition(0, reason), &tr); err != nil {
		w.st.Reason = reasonf(err, "close fence failed")
		w.st.PendingUnsubscribe = reason
		w.st.CloseFenceFailures++
		w.armCloseRetry()
		return
	}
	w.st.CloseFenceFailures = 0
	w.st.CloseEpoch = tr.CloseEpoch
	w.st.Reason = reason
	switch tr.State {
	case mcpsync.StateClosed, mcpsync.StateUnsubscribeUnknown:
		// The ledger's close is further along than this run knew (R20).
		w.adopt(tr.State)
	default:
		if !w.apply(fsm.Unsubscribe) {
			// The ledger passed the fence: the subscription is closing whatever the machine
			// thought (R18).
			w.adopt(mcpsync.StateUnsubscribing)
		}
	}
}

// closePending reports whether a close request waits for its close fence: one that failed
// and waits for its backoff (R18).
func (w *subscription) closePending() bool {
	return w.st.PendingUnsubscribe != "" && !w.m.State().Closing()
}

// armCloseRetry starts the backoff timer after the close fence failed for the
// st.CloseFenceFailures-th time in a row: CloseRetryBase doubling up to UnsubscribeRetryMax.
func (w *subscription) armCloseRetry() {
	w.stopCloseRetry()
	ctx, cancel := workflow.WithCancel(w.ctx)
	d := backoff(w.st.CloseFenceFailures-1, CloseRetryBase, UnsubscribeRetryMax)
	w.closeRetry, w.closeRetryCancel = workflow.NewTimer(ctx, d), cancel
}

// closeRetryDue reports whether a pending close may be tried now: its backoff is over, or it
// has not failed in this run.
func (w *subscription) closeRetryDue() bool {
	return w.closeRetry == nil || w.closeRetry.IsReady()
}

// stopCloseRetry drops the backoff timer of a close fence, cancelling it if it still runs.
func (w *subscription) stopCloseRetry() {
	if w.closeRetry != nil && !w.closeRetry.IsReady() {
		w.closeRetryCancel()
	}
	w.closeRetry, w.closeRetryCancel = nil, nil
}

// addCloseRetry makes sel wake when the backoff of a failed close fence is over, so that the
// fence is tried again within its backoff whatever the workflow is waiting for (R18).
func (w *subscription) addCloseRetry(sel workflow.Selector) {
	if w.closeRetry != nil && !w.closeRetry.IsReady() {
		sel.AddFuture(w.closeRetry, func(workflow.Future) {})
	}
}

// awaitCloseRetry waits for the backoff of a failed close fence, recording signals meanwhile.
func (w *subscription) awaitCloseRetry() {
	if w.closeRetryDue() {
		return
	}
	sel := workflow.NewSelector(w.ctx)
	w.addCloseRetry(sel)
	w.addSignals(sel)
	sel.Select(w.ctx)
}

// unsubscribeOnServer sends the MCP unsubscribe on the session the subscription lives on. An
// acknowledgement closes; a lost or timed-out one leads to UNSUBSCRIBE_UNKNOWN (R20).
func (w *subscription) unsubscribeOnServer() {
	if w.st.SessionGeneration == 0 || !w.st.CanSubscribe {
		w.completeClose()
		return
	}
	w.callUnsubscribe()
}

func (w *subscription) callUnsubscribe() {
	w.st.UnsubscribeAttempts++
	f := workflow.ExecuteActivity(w.hostCtx(UnsubscribeTimeout, 1), contract.ActMCPUnsubscribe, w.sessionCall())
	w.await(f)
	var out contract.UnsubscribeOutput
	err := f.Get(w.ctx, &out)
	switch {
	case err == nil:
		w.completeClose()
	case isStaleSession(err) || isScheduleTimeout(err):
		// The session (or the host holding it) is gone, and the server-side subscription
		// with it: the ledger closes it when the session's end is recorded.
		w.closeIfLedgerClosed(reasonf(nil, "session gone before the unsubscribe was acknowledged"))
		if w.m.State() != mcpsync.StateClosed && w.boundSessionEnded() {
			// Its end was recorded before the close fence passed (a removed source, a server
			// that went away): no later session end will close it, and no server-side
			// subscription outlives its session (R20). Complete the close here.
			w.completeClose()
		}
		if w.m.State() != mcpsync.StateClosed {
			w.markUnknown(reasonf(err, "session unreachable"))
		}
	default:
		w.markUnknown(reasonf(err, "unsubscribe acknowledgement lost"))
	}
}

// markUnknown records a lost unsubscribe acknowledgement: UNSUBSCRIBE_UNKNOWN in the ledger
// and the machine (R20), or CLOSED when the ledger already closed with the session. When the
// ledger cannot be reached the machine still goes to UNSUBSCRIBE_UNKNOWN: the unsubscribe is
// retried from there, and CompleteUnsubscribe closes from either closing state.
func (w *subscription) markUnknown(reason string) {
	if w.m.State() == mcpsync.StateUnsubscribeUnknown {
		w.st.Reason = reason
		return
	}
	var tr contract.TransitionOutput
	err := w.local(contract.ActMarkUnsubscribeUnknown, w.transition(0, reason), &tr)
	if err == nil && tr.State == mcpsync.StateClosed {
		w.apply(fsm.SessionEnded)
		return
	}
	w.apply(fsm.UnsubscribeLost)
	w.st.Reason = reason
	if err != nil {
		w.st.Reason = reasonf(err, "%s; recording it failed", reason)
	}
}

// retryUnsubscribe retries the unsubscribe on the same session; when that session ends the
// ledger closes the subscription (R20). It never goes back to ACTIVE.
func (w *subscription) retryUnsubscribe() {
	w.sleep(backoff(w.st.UnsubscribeAttempts, 2*time.Second, UnsubscribeRetryMax))
	w.applyPending()
	if w.m.State() != mcpsync.StateUnsubscribeUnknown {
		return
	}
	w.closeIfLedgerClosed(reasonf(nil, "session ended"))
	if w.m.State() == mcpsync.StateUnsubscribeUnknown {
		w.callUnsubscribe()
	}
}

func (w *subscription) completeClose() {
	var tr contract.TransitionOutput
	if err := w.local(contract.ActCompleteUnsubscribe, w.transition(0, ""), &tr); err != nil {
		w.st.Reason = reasonf(err, "completing the close failed")
		w.sleep(5 * time.Second)
		return
	}
	if tr.State == mcpsync.StateClosed && !w.apply(fsm.UnsubscribeAcked) {
		w.adopt(mcpsync.StateClosed) // the ledger closed: so does the machine (R20)
	}
}

// closeIfLedgerClosed follows the ledger to CLOSED when it closed the subscription with its
// session (R20); a failed look leaves the machine as it is, and the caller goes on closing.
func (w *subscription) closeIfLedgerClosed(reason string) {
	ref, err := w.ledgerState()
	if err == nil && ref.State == mcpsync.StateClosed {
		w.apply(fsm.SessionEnded)
		w.st.Reason = reason
	}
}

// finish ends a CLOSED subscription. Reads still in flight get up to LateReadWait to answer;
// each answer goes to the acceptance point, which only records STALE_AFTER_CLOSE (R19).
func (w *subscription) finish() {
	if w.refreshCancel != nil {
		w.refreshCancel()
	}
	w.upsertSearch()
	if len(w.lateReads) == 0 {
		return
	}
	ctx, cancel := workflow.WithCancel(w.ctx)
	defer cancel()
	timeout := workflow.NewTimer(ctx, LateReadWait)
	for _, r := range w.lateReads {
		sel := workflow.NewSelector(w.ctx)
		sel.AddFuture(r.future, func(workflow.Future) {})
		sel.AddFuture(timeout, func(workflow.Future) {})
		sel.Select(w.ctx)
		if !r.future.IsReady() {
			w.log.Warn("late read did not answer before the workflow ended", "ordinal", r.ordinal)
			continue
		}
		w.settleRead(r.future, r.ordinal, r.reqID)
	}
	w.lateReads = nil
}

// versionCloseOnEndedSession marks the runs that complete a close whose session had already
// ended when the unsubscribe found it gone (dffcd2d). A run whose history got there before
// the patch replays the old branch: UNSUBSCRIBE_UNKNOWN, retrying the dead session until the
// ledger closes the subscription with a newer session (close-on-ended-session-v0 in
// testdata/histories).
const versionCloseOnEndedSession = "close-on-ended-session"

// boundSessionEnded reports whether the session generation this subscription is bound to is
// no longer the source's live session in the ledger (ended, or superseded by a newer one).
// A failed look answers false: the close then goes on through UNSUBSCRIBE_UNKNOWN.
func (w *subscription) boundSessionEnded() bool {
	if !patched(w.ctx, versionCloseOnEndedSession) {
		return false
	}
	var sess contract.SessionInfo
	if err := w.local(contract.ActCurrentSession, w.in.SourceID, &sess); err != nil {
		return false
	}
	return !sess.Live || sess.Generation != w.st.SessionGeneration
}
