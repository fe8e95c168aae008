// Package workflows holds mcpsync's Temporal workflows. They orchestrate; the ledger decides:
// every guarded transition is a ledger activity whose outcome the workflow follows, so a
// retried, duplicated or slow activity can never regress a version whatever Temporal does.
// Workflows import neither pgx nor the MCP SDK: they speak to activities through
// internal/contract, by name.
//
// SubscriptionWorkflow is spread over files by concern: this one holds the workflow, its loop
// and its helpers; subscription_signals.go records signals and waits; subscription_establish.go
// (re)subscribes; subscription_reads.go reads, idles and refreshes; subscription_tombstone.go
// reconciles a not-found read; subscription_close.go closes; subscription_continue.go
// continues as new.
package workflows

import (
	"errors"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// Tunables of SubscriptionWorkflow. Variables so that tests can shorten them.
var (
	// HistoryThreshold continues as new once history reaches this many events even if the
	// server has not suggested it yet.
	HistoryThreshold = 8000
	// SignalThreshold continues as new once a run has received this many signals, well below
	// the server's limit of 10,000 signals per run.
	SignalThreshold = 4000
	// UpdateThreshold continues as new once a run has received this many resource-updated
	// workflow updates, below the server's limit of 2,000 updates per run
	// (history.maxTotalUpdates; it suggests continuing as new at 90 % of it, 1,800).
	UpdateThreshold = 1500
	// SessionWaitMax bounds the wait between looks for a live session.
	SessionWaitMax = 30 * time.Second
	// UnsubscribeRetryMax bounds the wait between unsubscribe retries in UNSUBSCRIBE_UNKNOWN,
	// and between attempts of a close fence that failed (R18).
	UnsubscribeRetryMax = time.Minute
	// CloseRetryBase is the wait before the first retry of a close fence that failed; it
	// doubles with every further failure up to UnsubscribeRetryMax (R18).
	CloseRetryBase = time.Second
	// EstablishRetryMax bounds the wait between subscribe attempts after failures.
	EstablishRetryMax = 5 * time.Minute
	// LateReadWait is how long a closed subscription waits for an in-flight read, so that its
	// late answer is recorded as STALE_AFTER_CLOSE (R19) rather than lost.
	LateReadWait = 30 * time.Second
	// UnsubscribeTimeout is how long an unsubscribe waits for the server's acknowledgement
	// before it counts as lost (R20).
	UnsubscribeTimeout = 5 * time.Second
)

type subscription struct {
	ctx  workflow.Context
	in   contract.SubscriptionInput
	st   *contract.SubscriptionState
	m    *fsm.Machine
	log  log.Logger
	wfID string

	updateCh, unsubCh, sessionCh, revokeCh, reconcileCh workflow.ReceiveChannel
	// updateQ holds the resource-updated workflow updates handled and not yet recorded
	// (onUpdate): the handler only queues, so the loop takes updates and signals alike.
	updateQ workflow.Channel

	// nextReason is the reason of the next read (R14).
	nextReason mcpsync.ReadReason
	// refresh is the pending backstop or poll timer; refreshCancel stops it.
	refresh       workflow.Future
	refreshCancel workflow.CancelFunc
	refreshReason mcpsync.ReadReason
	// upserted is the ledger state last written to the search attributes.
	upserted mcpsync.State
	// signalsThisRun counts signals received by this run (not carried on continue-as-new),
	// updatesThisRun its resource-updated workflow updates.
	signalsThisRun, updatesThisRun int
	// lateReads are reads still in flight when the close fence passed.
	lateReads []lateRead
	// duringRead collects the pulses received while a read is in flight.
	duringRead pulsesDuringRead
	// closeRetry is the backoff timer of a close fence that failed (st.PendingUnsubscribe):
	// the fence is tried again once it fires (R18); closeRetryCancel stops it.
	closeRetry       workflow.Future
	closeRetryCancel workflow.CancelFunc
	// details is what the current details show (setDetails); detailsSet once they are set.
	details    contract.SubscriptionProgress
	detailsSet bool
	// localReads: this run takes the fast path (versionLocalRead).
	localReads bool
}

// SubscriptionWorkflow is the long-lived workflow of one (principal, source, URI)
// subscription: the SPEC state machine with single-flight reads, the close fence, session
// changes and continue-as-new. It returns when the subscription is CLOSED.
func SubscriptionWorkflow(ctx workflow.Context, in contract.SubscriptionInput) (contract.StateView, error) {
	w := &subscription{
		ctx:         ctx,
		in:          in,
		log:         workflow.GetLogger(ctx),
		wfID:        workflow.GetInfo(ctx).WorkflowExecution.ID,
		updateCh:    workflow.GetSignalChannel(ctx, contract.SignalResourceUpdated),
		unsubCh:     workflow.GetSignalChannel(ctx, contract.SignalUnsubscribe),
		sessionCh:   workflow.GetSignalChannel(ctx, contract.SignalSessionChanged),
		revokeCh:    workflow.GetSignalChannel(ctx, contract.SignalRevoke),
		reconcileCh: workflow.GetSignalChannel(ctx, contract.SignalReconcile),
		nextReason:  mcpsync.ReasonInitial,
	}
	if in.State != nil {
		w.st = in.State
		m, err := fsm.Resume(w.st.Machine, w.st.Dirty)
		if err != nil {
			return contract.StateView{State: w.st.Machine, Reason: w.st.Reason}, fmt.Errorf("continued as new: %w", err)
		}
		w.m = m
		w.nextReason = mcpsync.ReasonNotification
		if w.st.NextReason != "" {
			w.nextReason = w.st.NextReason
		}
	} else {
		w.st = &contract.SubscriptionState{Counters: contract.Counters{ReadsByReason: map[mcpsync.ReadReason]int64{}}}
		w.m = fsm.New()
	}
	if w.st.Counters.ReadsByReason == nil {
		w.st.Counters.ReadsByReason = map[mcpsync.ReadReason]int64{}
	}
	if err := workflow.SetQueryHandler(ctx, contract.QueryState, func() (contract.StateView, error) {
		return w.view(), nil
	}); err != nil {
		return contract.StateView{}, err
	}
	if err := w.handleUpdates(); err != nil {
		return contract.StateView{}, err
	}
	if in.State == nil {
		var ref contract.SubscriptionRef
		err := w.local(contract.ActEnsureSubscription, contract.EnsureInput{
			Principal: in.Principal, SourceID: in.SourceID, URI: in.URI, ServerURI: in.ServerURI, WorkflowID: w.wfID,
		}, &ref)
		ungranted := false
		if err != nil {
			var open bool
			if ref, open = openWithoutGrant(err); !open || !patched(ctx, versionCloseUngranted) {
				return w.view(), fmt.Errorf("ensure subscription: %w", err)
			}
			ungranted = true
		}
		w.st.SubscriptionID, w.st.Generation = ref.ID, ref.Generation
		w.st.LastAcceptedOrdinal, w.st.LastAcceptedDigest = ref.LastAcceptedOrdinal, ref.LastAcceptedDigest
		switch {
		case ungranted:
			w.closeUngranted(ref)
		case ref.State != mcpsync.StateDiscovered:
			w.resume(ref)
		}
	}
	w.upsertSearch()
	w.setDetails()
	return w.run()
}

// resume takes over a ledger row that an earlier, ended run left live (the workflow failed or
// was terminated, and `mcpsync reconcile` started it again). A closing subscription goes on
// closing on the session it lives on; any other one has an unknown server side and is
// re-established (R12).
func (w *subscription) resume(ref contract.SubscriptionRef) {
	w.st.SessionGeneration, w.st.CloseEpoch = ref.SessionGeneration, ref.CloseEpoch
	w.st.Reason = reasonf(nil, "workflow restarted over subscription in %s", ref.State)
	switch ref.State {
	case mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown:
		w.adopt(ref.State)
		w.bindClosingSession()
	default:
		w.markReconciliationRequired(w.st.Reason)
		w.apply(fsm.IdentityUnknown)
		w.nextReason = mcpsync.ReasonReconcile
	}
}

// bindClosingSession prepares the unsubscribe of a subscription this run took over to close:
// on the session its row names (st.SessionGeneration) when that is still the source's live
// one, otherwise none.
func (w *subscription) bindClosingSession() {
	var sess contract.SessionInfo
	err := w.local(contract.ActCurrentSession, w.in.SourceID, &sess)
	if err == nil && sess.Live && sess.Generation == w.st.SessionGeneration {
		w.st.HostQueue, w.st.CanSubscribe = sess.HostQueue, sess.CanSubscribe
		return
	}
	// That session is gone, or cannot be looked up: nothing to unsubscribe from; the ledger
	// closes the subscription when the session's end is recorded (R20).
	if err != nil {
		w.log.Warn("looking up the session failed; closing without unsubscribe", "error", err)
	}
	w.st.SessionGeneration = 0
}

// versionCloseUngranted marks the runs that close a subscription whose ledger row they find
// open while its principal holds no standing grant, instead of failing and leaving the row
// open with no workflow (a run restarted by `mcpsync reconcile` after its grant was revoked,
// or a first workflow task lost after its ledger transitions committed and retried after the
// revocation).
const versionCloseUngranted = "close-ungranted"

// openWithoutGrant reports whether err is EnsureSubscription's refusal for want of a standing
// grant (R23) that carries the subscription's open row, and returns that row.
func openWithoutGrant(err error) (contract.SubscriptionRef, bool) {
	var appErr *temporal.ApplicationError
	var ref contract.SubscriptionRef
	if !errors.As(err, &appErr) || appErr.Type() != contract.ErrTypeNoGrant || !appErr.HasDetails() {
		return ref, false
	}
	if appErr.Details(&ref) != nil || ref.ID == 0 {
		return ref, false
	}
	return ref, true
}

// closeUngranted takes over an open row whose principal holds no standing grant and closes it
// as a revocation does (R23, R18): a row closing already goes on closing, any other passes the
// close fence with the revoke reason, then unsubscribes on the session it lives on if that is
// still live. The run never subscribes or reads. Its search attributes are upserted first: a
// command before any local activity, so that replaying a history of the old branch (the run
// failed right after the refusal) with this one fails, as a change of commands must.
func (w *subscription) closeUngranted(ref contract.SubscriptionRef) {
	w.upsertSearch()
	if ref.State == mcpsync.StateUnsubscribing || ref.State == mcpsync.StateUnsubscribeUnknown {
		w.resume(ref)
		return
	}
	w.st.SessionGeneration, w.st.CloseEpoch = ref.SessionGeneration, ref.CloseEpoch
	w.bindClosingSession()
	w.st.PendingUnsubscribe = reasonf(nil, "%s: no standing grant (workflow restarted over subscription in %s)", closeRevoked, ref.State)
	w.st.Reason = w.st.PendingUnsubscribe
}

func (w *subscription) run() (contract.StateView, error) {
	for {
		if err := w.ctx.Err(); err != nil {
			return w.view(), err
		}
		w.applyPending()
		if w.m.State() != mcpsync.StateClosed && w.shouldContinueAsNew() {
			// Every state but CLOSED: a subscription waiting for a session, an unsubscribe
			// acknowledgement, a tombstone decision or a close fence loops for as long as the
			// outage lasts, and its history must not grow without bound. Checking in
			// UPDATE_SEEN too matters: under a sustained storm the workflow never idles.
			if err := w.continueAsNew(); err != nil {
				return w.view(), err
			}
		}
		if w.closePending() {
			// A close fence failed: nothing but the close is pursued until it passes (R18).
			w.awaitCloseRetry()
			w.upsertSearch()
			w.setDetails()
			continue
		}
		switch w.m.State() {
		case mcpsync.StateClosed:
			w.finish()
			w.setDetails()
			return w.view(), nil
		case mcpsync.StateUnsubscribing:
			w.unsubscribeOnServer()
		case mcpsync.StateUnsubscribeUnknown:
			w.retryUnsubscribe()
		case mcpsync.StateDiscovered, mcpsync.StateReconciliationRequired, mcpsync.StateSubscribing:
			w.establish()
		case mcpsync.StateUpdateSeen:
			w.read()
		case mcpsync.StateActive:
			w.idle()
		case mcpsync.StateTombstonePending:
			w.reconcileTombstone()
		default:
			return w.view(), fmt.Errorf("subscription in unexpected state %s", w.m.State())
		}
		w.upsertSearch()
		w.setDetails()
	}
}

// apply performs ev if it is legal now and reports whether it did; an illegal event is
// logged, never applied.
func (w *subscription) apply(ev fsm.Event) bool {
	if err := w.m.Apply(ev); err != nil {
		w.log.Debug("event ignored", "event", ev, "state", w.m.State(), "error", err)
		return false
	}
	return true
}

// adopt takes over the ledger's closing state s (fsm.Machine.Adopt) and reports whether it
// did; an adoption the machine refuses is logged, never applied.
func (w *subscription) adopt(s mcpsync.State) bool {
	if err := w.m.Adopt(s); err != nil {
		w.log.Warn("ledger state not adopted", "ledgerState", s, "state", w.m.State(), "error", err)
		return false
	}
	return true
}

// reasonf builds every human-readable reason a subscription is not ACTIVE (StateView.Reason,
// and the reason the ledger records with a transition): what happened, from format and args,
// followed by the root cause of err when there is one.
func reasonf(err error, format string, args ...any) string {
	what := fmt.Sprintf(format, args...)
	if err == nil {
		return what
	}
	return what + ": " + rootMessage(err)
}

func (w *subscription) view() contract.StateView {
	return contract.StateView{
		State: w.m.State(), Reason: w.st.Reason, SubscriptionID: w.st.SubscriptionID,
		Generation: w.st.Generation, SessionGeneration: w.st.SessionGeneration,
		LastAcceptedOrdinal: w.st.LastAcceptedOrdinal, LastAcceptedDigest: w.st.LastAcceptedDigest,
		ContinuedAsNew: w.st.ContinuedAsNew, Counters: w.st.Counters,
	}
}

func (w *subscription) transition(sessionGen int64, reason string) contract.TransitionInput {
	if sessionGen == 0 {
		sessionGen = w.st.SessionGeneration
	}
	return contract.TransitionInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: sessionGen, CloseEpoch: w.st.CloseEpoch, Reason: reason,
	}
}

func (w *subscription) sessionCall() contract.SessionCall {
	return contract.SessionCall{
		SourceID: w.in.SourceID, SessionGeneration: w.st.SessionGeneration,
		ServerURI: w.in.ServerURI, SubscriptionID: w.st.SubscriptionID,
	}
}

func (w *subscription) ledgerState() (contract.SubscriptionRef, error) {
	var ref contract.SubscriptionRef
	err := w.local(contract.ActSubscriptionState, w.st.SubscriptionID, &ref)
	if err != nil {
		w.log.Warn("reading the ledger state failed", "error", err)
	}
	return ref, err
}

// upsertSearch writes the state as the ledger names it to the search attributes when it
// changed.
func (w *subscription) upsertSearch() {
	state := w.m.State().Ledger()
	if state == w.upserted {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(w.ctx,
		contract.SearchSource.ValueSet(w.in.Source),
		contract.SearchURI.ValueSet(w.in.URI),
		contract.SearchPrincipal.ValueSet(w.in.Principal),
		contract.SearchState.ValueSet(string(state)),
	); err != nil {
		w.log.Warn("upsert search attributes failed", "error", err)
		return
	}
	w.upserted = state
}

// local runs a ledger activity as a local activity (one short Postgres transaction).
func (w *subscription) local(name string, arg any, out any) error {
	ctx := workflow.WithLocalActivityOptions(w.ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 10 * time.Minute,
		StartToCloseTimeout:    15 * time.Second,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        200 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        15 * time.Second,
			NonRetryableErrorTypes: []string{contract.ErrTypePermanent},
		},
	})
	return workflow.ExecuteLocalActivity(ctx, name, arg).Get(w.ctx, out)
}

// hostCtx routes a session-bound activity to the worker holding the session. A dead host
// surfaces through the schedule-to-start timeout, which is never retried.
func (w *subscription) hostCtx(startToClose time.Duration, attempts int32) workflow.Context {
	return workflow.WithActivityOptions(w.ctx, workflow.ActivityOptions{
		TaskQueue:              w.st.HostQueue,
		ScheduleToStartTimeout: 10 * time.Second,
		StartToCloseTimeout:    startToClose,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval:        500 * time.Millisecond,
			BackoffCoefficient:     2,
			MaximumInterval:        5 * time.Second,
			MaximumAttempts:        attempts,
			NonRetryableErrorTypes: []string{contract.ErrTypeStaleSession, contract.ErrTypePermanent},
		},
	})
}

func backoff(failures int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < failures && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}

func isStaleSession(err error) bool {
	var appErr *temporal.ApplicationError
	return errors.As(err, &appErr) && appErr.Type() == contract.ErrTypeStaleSession
}

func isScheduleTimeout(err error) bool {
	var te *temporal.TimeoutError
	return errors.As(err, &te) && te.TimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START
}

func rootMessage(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}
