package workflows

import (
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// establish (re)subscribes on the source's current session: BeginSubscribe (fenced on the
// live generation), MCP subscribe on the host holding the session unless the server lacks
// resources.subscribe (then we poll, R11), Activate, then a read.
func (w *subscription) establish() {
	if w.st.PendingMark != "" && !w.markReconciliationRequired(w.st.PendingMark) {
		// The ledger may still say ACTIVE and would refuse BeginSubscribe: retry the mark.
		w.sleep(backoff(w.st.EstablishFailures, 2*time.Second, EstablishRetryMax))
		w.st.EstablishFailures++
		return
	}
	var sess contract.SessionInfo
	if err := w.local(contract.ActCurrentSession, w.in.SourceID, &sess); err != nil {
		w.failEstablish(reasonf(err, "looking up the session"))
		return
	}
	if !sess.Live {
		w.st.Reason = reasonf(nil, "waiting for a live session of source %s", w.in.Source)
		w.sleep(backoff(w.st.EstablishFailures, 2*time.Second, SessionWaitMax))
		w.st.EstablishFailures++
		return
	}
	w.followDefinition(sess)
	var tr contract.TransitionOutput
	if err := w.local(contract.ActBeginSubscribe, w.transition(sess.Generation, ""), &tr); err != nil {
		w.failEstablish(reasonf(err, "begin subscribe"))
		return
	}
	if !tr.Outcome.OK() {
		w.st.Reason = reasonf(nil, "subscribe on generation %d refused in %s", sess.Generation, tr.State)
		w.sleep(backoff(w.st.EstablishFailures, time.Second, SessionWaitMax))
		w.st.EstablishFailures++
		return
	}
	if w.m.State() != mcpsync.StateSubscribing && !w.apply(fsm.Subscribe) {
		return
	}
	w.st.SessionGeneration, w.st.HostQueue, w.st.CanSubscribe = sess.Generation, sess.HostQueue, sess.CanSubscribe
	if sess.CanSubscribe {
		f := workflow.ExecuteActivity(w.hostCtx(30*time.Second, 3), contract.ActMCPSubscribe, w.sessionCall())
		w.await(f)
		if w.m.State().Closing() {
			return
		}
		if err := f.Get(w.ctx, nil); err != nil {
			w.apply(fsm.SubscribeFailed)
			w.failEstablish(reasonf(err, "MCP subscribe"))
			return
		}
	}
	if w.m.State() != mcpsync.StateSubscribing {
		return // a session change or close arrived meanwhile
	}
	if err := w.local(contract.ActActivate, w.transition(sess.Generation, ""), &tr); err != nil {
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = reasonf(err, "activation on generation %d failed", sess.Generation)
		return
	}
	if !tr.Outcome.OK() {
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = reasonf(nil, "activation on generation %d refused (%s %s)", sess.Generation, tr.Outcome, tr.State)
		return
	}
	w.apply(fsm.Subscribed)
	w.st.EstablishFailures, w.st.Reason = 0, ""
	w.apply(fsm.Update) // initial, session_change or reconcile read (R12)
}

// failEstablish parks the subscription in RECONCILIATION_REQUIRED, in the machine and in the
// ledger, and backs off before the next attempt.
func (w *subscription) failEstablish(reason string) {
	w.st.Reason = reason
	if s := w.m.State(); s == mcpsync.StateSubscribing || s == mcpsync.StateDiscovered {
		w.apply(fsm.SubscribeFailed)
		w.apply(fsm.IdentityUnknown)
	}
	w.markReconciliationRequired(reason)
	w.nextReason = mcpsync.ReasonReconcile
	w.sleep(backoff(w.st.EstablishFailures, 2*time.Second, EstablishRetryMax))
	w.st.EstablishFailures++
}

// markReconciliationRequired records in the ledger that the subscription's server side is
// unknown (R12), so that the next BeginSubscribe is accepted; it reports whether the ledger
// answered. A mark that failed is kept in PendingMark (carried through continue-as-new) and
// retried before the next subscribe attempt: otherwise a ledger left
// ACTIVE would refuse every BeginSubscribe and establishing would back off forever. A refused
// mark needs no retry: the ledger is RECONCILIATION_REQUIRED already (BeginSubscribe accepts
// that), or closing (the close path takes over), or of another generation.
func (w *subscription) markReconciliationRequired(reason string) bool {
	var tr contract.TransitionOutput
	if err := w.local(contract.ActMarkReconciliationRequired, w.transition(0, reason), &tr); err != nil {
		w.st.PendingMark = reason
		w.st.Reason = reasonf(err, "marking reconciliation required failed")
		return false
	}
	w.st.PendingMark = ""
	return true
}

// followDefinition adopts the source's refresh periods when its definition changed since this
// subscription last established itself (`source update`, which also starts the new session
// that brought it here); the first establishment only notes the version, the start input
// carrying the periods of that time.
func (w *subscription) followDefinition(sess contract.SessionInfo) {
	switch {
	case !w.st.DefinitionSeen:
		w.st.DefinitionVersion, w.st.DefinitionSeen = sess.DefinitionVersion, true
	case sess.DefinitionVersion > w.st.DefinitionVersion && sess.BackstopSeconds > 0 && sess.PollSeconds > 0:
		w.st.DefinitionVersion = sess.DefinitionVersion
		w.st.BackstopSeconds, w.st.PollSeconds = sess.BackstopSeconds, sess.PollSeconds
		if w.refreshCancel != nil {
			// The refresh timer runs at the old period: re-arm it at the new one.
			w.refreshCancel()
			w.refresh, w.refreshCancel = nil, nil
		}
	}
}
