package workflows

import (
	"errors"
	"time"

	"go.temporal.io/sdk/temporal"
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
		out, closing, err := w.subscribe()
		if closing {
			return
		}
		if err != nil {
			w.apply(fsm.SubscribeFailed)
			w.failEstablish(reasonf(err, "MCP subscribe"))
			return
		}
		// Left out of the listen acknowledgement (2026-07-28): not watched, so it polls (R11).
		// An older run's history has no output here: zero, as before.
		w.st.NotAcknowledged = out.NotAcknowledged
	} else {
		w.st.NotAcknowledged = false
	}
	if w.m.State() != mcpsync.StateSubscribing {
		return // a session change or close arrived meanwhile
	}
	act := w.transition(sess.Generation, "")
	act.NotAcknowledged = w.st.NotAcknowledged
	if err := w.local(contract.ActActivate, act, &tr); err != nil {
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

// versionLocalSubscribe marks the runs that subscribe on the fast path (issue 16 item 4): a
// local activity subscribes when the worker running the workflow task holds the session, so
// BeginSubscribe, the subscribe, Activate and the first read chain in one workflow task, with
// no activity task. A run whose history reached a subscribe before the patch replays the
// host-queue activity.
const versionLocalSubscribe = "local-subscribe"

// LocalSubscribeHandoff bounds how long the fast path's subscribe may keep the workflow task
// (which takes no signal meanwhile) before it is handed to the host queue, where the close
// fence can pass while it is in flight as before. A variable so that tests can change it.
var LocalSubscribeHandoff = time.Second

// subscribe makes the server watch the URI on the session (R9) and returns what it
// established, or the error of a failed subscribe; closing reports that the close fence
// passed meanwhile (the subscribe's outcome no longer matters). Runs of the local-subscribe
// patch try the fast path first (subscribeLocal); the host-queue activity is the fallback.
func (w *subscription) subscribe() (out contract.SubscribeOutput, closing bool, err error) {
	if patched(w.ctx, versionLocalSubscribe) {
		var done bool
		if out, done, err = w.subscribeLocal(); done {
			// Signals delivered meanwhile are recorded, and the close fence passed, as the
			// host path's await does.
			w.drainSignals()
			w.passCloseFence()
			return out, w.m.State().Closing(), err
		}
	}
	f := workflow.ExecuteActivity(w.hostCtx(30*time.Second, 3), contract.ActMCPSubscribe, w.sessionCall())
	w.await(f)
	if w.m.State().Closing() {
		return out, true, nil
	}
	err = f.Get(w.ctx, &out)
	return out, false, err
}

// subscribeLocal is the fast path: ActLocalSubscribe subscribes if this worker holds the
// session. done reports that it decided the subscribe (out, or err: a stale session or a
// refusal a retry cannot fix, exactly as ActMCPSubscribe would have failed); otherwise (another
// worker holds the session, the subscribe did not answer within LocalSubscribeHandoff and goes
// on here, or it failed transiently) the host queue subscribes, joining one still in flight.
func (w *subscription) subscribeLocal() (out contract.SubscribeOutput, done bool, err error) {
	ctx := workflow.WithLocalActivityOptions(w.ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: LocalSubscribeHandoff + 10*time.Second,
		StartToCloseTimeout:    LocalSubscribeHandoff + 10*time.Second,
		// One attempt: the host queue's retries apply to whatever this did not decide.
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var ls contract.LocalSubscribeOutput
	err = workflow.ExecuteLocalActivity(ctx, contract.ActLocalSubscribe, contract.LocalSubscribeInput{
		Call: w.sessionCall(), Handoff: LocalSubscribeHandoff,
	}).Get(w.ctx, &ls)
	switch {
	case err != nil && (isStaleSession(err) || isPermanent(err)):
		return out, true, err
	case err != nil:
		w.log.Warn("fast-path subscribe failed; subscribing on the host queue", "error", err)
		return out, false, nil
	case !ls.Here || ls.HandedOff:
		return out, false, nil
	}
	return ls.Subscribe, true, nil
}

// isPermanent reports whether err is a session-bound call's refusal that no retry can fix.
func isPermanent(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == contract.ErrTypePermanent
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
