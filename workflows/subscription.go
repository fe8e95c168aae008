// Package workflows holds mcpsync's Temporal workflows. They orchestrate; the ledger decides:
// every guarded transition is a ledger activity whose outcome the workflow follows, so a
// retried, duplicated or slow activity can never regress a version whatever Temporal does.
// Workflows import neither pgx nor the MCP SDK: they speak to activities through
// internal/contract, by name.
package workflows

import (
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// Ledger outcome names the workflow branches on (internal/ledger defines them; the workflow
// only sees strings).
const (
	outcomeAllocated        = "ALLOCATED"
	outcomeAccepted         = "ACCEPTED"
	outcomeRevalidated      = "REVALIDATED"
	outcomeTombstonePending = "TOMBSTONE_PENDING"
	outcomeTransitioned     = "TRANSITIONED"
	outcomeAlreadyDone      = "ALREADY_DONE"
	outcomeOldSession       = "OLD_SESSION"
	outcomeOldGeneration    = "OLD_GENERATION"

	tombstoneResourcePresent = "RESOURCE_PRESENT"
	tombstoneNotPending      = "NOT_TOMBSTONE_PENDING"
	tombstoneOldGeneration   = "OLD_GENERATION"
)

// Tunables of SubscriptionWorkflow. Variables so that tests can shorten them.
var (
	// HistoryThreshold continues as new once history reaches this many events even if the
	// server has not suggested it yet.
	HistoryThreshold = 8000
	// SignalThreshold continues as new once a run has received this many signals, well below
	// the server's limit of 10,000 signals per run.
	SignalThreshold = 4000
	// SessionWaitMax bounds the wait between looks for a live session.
	SessionWaitMax = 30 * time.Second
	// UnsubscribeRetryMax bounds the wait between unsubscribe retries in UNSUBSCRIBE_UNKNOWN.
	UnsubscribeRetryMax = time.Minute
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

	// nextReason is the reason of the next read (R14).
	nextReason string
	// refresh is the pending backstop or poll timer; refreshCancel stops it.
	refresh       workflow.Future
	refreshCancel workflow.CancelFunc
	refreshReason string
	// upserted is the coarse state last written to the search attributes.
	upserted string
	// signalsThisRun counts signals received by this run (not carried on continue-as-new).
	signalsThisRun int
	// lateReads are reads still in flight when the close fence passed.
	lateReads []lateRead
	// duringRead collects the pulses received while a read is in flight.
	duringRead pulsesDuringRead
}

// pulsesDuringRead summarizes the notifications received while a read was in flight.
type pulsesDuringRead struct {
	pulses  int64
	latest  time.Time // newest host arrival time among them
	untimed bool      // one of them has no comparable arrival time
}

// lateRead is a read dispatched before the close fence whose answer had not arrived.
type lateRead struct {
	future  workflow.Future
	ordinal int64
	reqID   string
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
		nextReason:  "initial",
	}
	if in.State != nil {
		w.st = in.State
		w.m = &fsm.Machine{State: fsm.State(w.st.Machine), Dirty: w.st.Dirty}
		w.nextReason = "notification"
		if w.m.State == fsm.UpdateSeen || w.m.State == fsm.ReadPending {
			// A run never continues as new with a read in flight; resume with the read.
			w.m.State = fsm.UpdateSeen
		}
	} else {
		w.st = &contract.SubscriptionState{Counters: contract.Counters{ReadsByReason: map[string]int64{}}}
		w.m = fsm.New()
	}
	if w.st.Counters.ReadsByReason == nil {
		w.st.Counters.ReadsByReason = map[string]int64{}
	}
	if err := workflow.SetQueryHandler(ctx, contract.QueryState, func() (contract.StateView, error) {
		return w.view(), nil
	}); err != nil {
		return contract.StateView{}, err
	}
	if in.State == nil {
		var ref contract.SubscriptionRef
		if err := w.local(contract.ActEnsureSubscription, contract.EnsureInput{
			Principal: in.Principal, SourceID: in.SourceID, URI: in.URI, ServerURI: in.ServerURI, WorkflowID: w.wfID,
		}, &ref); err != nil {
			return w.view(), fmt.Errorf("ensure subscription: %w", err)
		}
		w.st.SubscriptionID, w.st.Generation = ref.ID, ref.Generation
		w.st.LastAcceptedOrdinal, w.st.LastAcceptedDigest = ref.LastAcceptedOrdinal, ref.LastAcceptedDigest
		if ref.State != string(fsm.Discovered) {
			w.resume(ref)
		}
	}
	w.upsertSearch()
	return w.run()
}

// resume takes over a ledger row that an earlier, ended run left live (the workflow failed or
// was terminated, and `mcpsync reconcile` started it again). A closing subscription goes on
// closing on the session it lives on; any other one has an unknown server side and is
// re-established (R12).
func (w *subscription) resume(ref contract.SubscriptionRef) {
	w.st.SessionGeneration, w.st.CloseEpoch = ref.SessionGeneration, ref.CloseEpoch
	w.st.Reason = "workflow restarted over subscription in " + ref.State
	switch fsm.State(ref.State) {
	case fsm.Unsubscribing, fsm.UnsubscribeUnknown:
		w.m.State = fsm.State(ref.State)
		var sess contract.SessionInfo
		if err := w.local(contract.ActCurrentSession, w.in.SourceID, &sess); err == nil && sess.Live && sess.Generation == ref.SessionGeneration {
			w.st.HostQueue, w.st.CanSubscribe = sess.HostQueue, sess.CanSubscribe
		} else {
			w.st.SessionGeneration = 0 // that session is gone; nothing to unsubscribe from
		}
	default:
		var tr contract.TransitionOutput
		_ = w.local(contract.ActMarkReconciliationRequired, w.transition(0, w.st.Reason), &tr)
		w.m.State = fsm.ReconciliationRequired
		w.nextReason = "reconcile"
	}
}

func (w *subscription) run() (contract.StateView, error) {
	for {
		if err := w.ctx.Err(); err != nil {
			return w.view(), err
		}
		w.applyPending()
		if (w.m.State == fsm.Active || w.m.State == fsm.UpdateSeen) && w.shouldContinueAsNew() {
			// No read is in flight here: reads are single-flight and synchronous. Checking in
			// UPDATE_SEEN too matters: under a sustained storm the workflow never idles.
			if err := w.continueAsNew(); err != nil {
				return w.view(), err
			}
		}
		switch w.m.State {
		case fsm.Closed:
			w.finish()
			return w.view(), nil
		case fsm.Unsubscribing:
			w.unsubscribeOnServer()
		case fsm.UnsubscribeUnknown:
			w.retryUnsubscribe()
		case fsm.Discovered, fsm.ReconciliationRequired, fsm.Subscribing:
			w.establish()
		case fsm.UpdateSeen:
			w.read()
		case fsm.Active:
			w.idle()
		case fsm.TombstonePending:
			w.reconcileTombstone()
		default:
			return w.view(), fmt.Errorf("subscription in unexpected state %s", w.m.State)
		}
		w.upsertSearch()
	}
}

// apply performs ev if it is legal now and reports whether it did; an illegal event is
// logged, never applied.
func (w *subscription) apply(ev fsm.Event) bool {
	if err := w.m.Apply(ev); err != nil {
		w.log.Debug("event ignored", "event", ev, "state", w.m.State, "error", err)
		return false
	}
	return true
}

// ---- signals -------------------------------------------------------------------------------

func (w *subscription) addSignals(sel workflow.Selector) {
	sel.AddReceive(w.updateCh, func(c workflow.ReceiveChannel, _ bool) {
		var u contract.ResourceUpdated
		c.Receive(w.ctx, &u)
		w.onUpdate(u)
	})
	sel.AddReceive(w.unsubCh, func(c workflow.ReceiveChannel, _ bool) {
		var u contract.Unsubscribe
		c.Receive(w.ctx, &u)
		w.onUnsubscribe(u, "unsubscribed")
	})
	sel.AddReceive(w.revokeCh, func(c workflow.ReceiveChannel, _ bool) {
		var u contract.Unsubscribe
		c.Receive(w.ctx, &u)
		w.onUnsubscribe(u, "revoked")
	})
	sel.AddReceive(w.sessionCh, func(c workflow.ReceiveChannel, _ bool) {
		var s contract.SessionChanged
		c.Receive(w.ctx, &s)
		w.onSessionChanged(s)
	})
	sel.AddReceive(w.reconcileCh, func(c workflow.ReceiveChannel, _ bool) {
		var r contract.Reconcile
		c.Receive(w.ctx, &r)
		w.st.PendingReconcile = true
	})
}

// drainSignals records every signal already delivered, without blocking.
func (w *subscription) drainSignals() {
	for more := true; more; {
		more = false
		var u contract.ResourceUpdated
		for w.updateCh.ReceiveAsync(&u) {
			w.onUpdate(u)
			more = true
		}
		var un contract.Unsubscribe
		for w.unsubCh.ReceiveAsync(&un) {
			w.onUnsubscribe(un, "unsubscribed")
			more = true
		}
		for w.revokeCh.ReceiveAsync(&un) {
			w.onUnsubscribe(un, "revoked")
			more = true
		}
		var sc contract.SessionChanged
		for w.sessionCh.ReceiveAsync(&sc) {
			w.onSessionChanged(sc)
			more = true
		}
		var r contract.Reconcile
		for w.reconcileCh.ReceiveAsync(&r) {
			w.st.PendingReconcile = true
			more = true
		}
	}
}

func (w *subscription) onUpdate(u contract.ResourceUpdated) {
	w.signalsThisRun++
	pulses := int64(max(u.Pulses, 1))
	c := &w.st.Counters
	c.Notifications += pulses
	if u.SessionGeneration < w.st.LastNotificationGen ||
		(u.SessionGeneration == w.st.LastNotificationGen && u.Seq <= w.st.LastNotificationSeq) ||
		u.SessionGeneration < w.st.SessionGeneration || w.m.State.Closing() {
		// A duplicate, a notification of an older session (R12), or one after close (R19).
		c.NotificationsStale += pulses
		return
	}
	w.st.LastNotificationGen, w.st.LastNotificationSeq = u.SessionGeneration, u.Seq
	if w.m.State == fsm.ReadPending || w.m.State == fsm.VersionAccepted {
		// Whether this pulse needs a follow-up read is known when the read answers.
		w.duringRead.pulses += pulses
		if u.ReceivedAt.IsZero() || u.SessionGeneration != w.st.SessionGeneration {
			w.duringRead.untimed = true
		} else if u.ReceivedAt.After(w.duringRead.latest) {
			w.duringRead.latest = u.ReceivedAt
		}
		return
	}
	if w.m.State == fsm.Active {
		w.nextReason = "notification"
	}
	// Not live yet (subscribing, reconciling): the read that follows establishing covers it.
	w.apply(fsm.Update)
}

// resolvePulses decides what the pulses received during a read call for (R13, R27): a pulse
// that reached the host before the host sent the read announces a change the read already
// sees, so it is covered; any later (or untimed) pulse sets the dirty bit for exactly one
// follow-up read. sentAt is zero when the read failed.
func (w *subscription) resolvePulses(sentAt time.Time) {
	d := w.duringRead
	w.duringRead = pulsesDuringRead{}
	if d.pulses == 0 {
		return
	}
	if d.untimed || sentAt.IsZero() || !d.latest.Before(sentAt) {
		w.apply(fsm.Update)
		return
	}
	w.st.Counters.PulsesCovered += d.pulses
}

func (w *subscription) onUnsubscribe(u contract.Unsubscribe, kind string) {
	w.signalsThisRun++
	if u.ID != "" {
		for _, id := range w.st.LastSignalIDs {
			if id == u.ID {
				return
			}
		}
		w.st.LastSignalIDs = append(w.st.LastSignalIDs, u.ID)
		if len(w.st.LastSignalIDs) > 16 {
			w.st.LastSignalIDs = w.st.LastSignalIDs[len(w.st.LastSignalIDs)-16:]
		}
	}
	if w.m.State.Closing() || w.st.PendingUnsubscribe != "" {
		return
	}
	reason := kind
	if u.Reason != "" {
		reason = kind + ": " + u.Reason
	}
	w.st.PendingUnsubscribe = reason
}

func (w *subscription) onSessionChanged(s contract.SessionChanged) {
	w.signalsThisRun++
	if s.Generation > w.st.SessionGeneration && s.Generation > w.st.PendingSessionChange {
		w.st.PendingSessionChange = s.Generation
	}
}

// applyPending acts on recorded signals. The close fence comes first, at once (R18): a read
// in flight is then refused by the ledger when it returns (R19).
func (w *subscription) applyPending() {
	if w.st.PendingUnsubscribe != "" && !w.m.State.Closing() {
		w.beginClose(w.st.PendingUnsubscribe)
	}
	w.st.PendingUnsubscribe = ""
	if g := w.st.PendingSessionChange; g > 0 {
		w.st.PendingSessionChange = 0
		if g > w.st.SessionGeneration {
			switch {
			case w.m.State.Closing():
				// The ledger closed in-flight or unknown unsubscribes of the old session (R20).
				if ref, err := w.ledgerState(); err == nil && ref.State == string(fsm.Closed) {
					w.apply(fsm.SessionEnded)
				}
			case w.m.State == fsm.Discovered:
				// Never bound to a session: establishing picks up the new one.
			default:
				if w.st.SessionGeneration > 0 && w.apply(fsm.SessionEnded) {
					w.nextReason = "session_change"
					w.st.Reason = fmt.Sprintf("session changed to generation %d", g)
				}
			}
		}
	}
	if w.st.PendingReconcile {
		w.st.PendingReconcile = false
		w.st.EstablishFailures = 0
		if w.m.State == fsm.ReconciliationRequired {
			w.nextReason = "reconcile"
		}
	}
}

// await blocks until f is ready, recording every signal that arrives meanwhile and passing
// the close fence as soon as an unsubscribe or revocation arrives.
func (w *subscription) await(f workflow.Future) { w.awaitFor(f, false) }

// awaitUnlessClosing is await that gives up (returning false) once the close fence has
// passed with f still pending.
func (w *subscription) awaitUnlessClosing(f workflow.Future) bool { return w.awaitFor(f, true) }

func (w *subscription) awaitFor(f workflow.Future, stopWhenClosing bool) bool {
	for !f.IsReady() {
		if stopWhenClosing && w.m.State.Closing() {
			return false
		}
		sel := workflow.NewSelector(w.ctx)
		sel.AddFuture(f, func(workflow.Future) {})
		w.addSignals(sel)
		sel.Select(w.ctx)
		if w.st.PendingUnsubscribe != "" && !w.m.State.Closing() {
			w.beginClose(w.st.PendingUnsubscribe)
			w.st.PendingUnsubscribe = ""
		}
		if w.ctx.Err() != nil {
			return true
		}
	}
	return true
}

// sleep waits d or until a signal arrives, whichever is first.
func (w *subscription) sleep(d time.Duration) {
	ctx, cancel := workflow.WithCancel(w.ctx)
	defer cancel()
	timer := workflow.NewTimer(ctx, d)
	sel := workflow.NewSelector(w.ctx)
	sel.AddFuture(timer, func(workflow.Future) {})
	w.addSignals(sel)
	sel.Select(w.ctx)
}

// ---- establishing --------------------------------------------------------------------------

// establish (re)subscribes on the source's current session: BeginSubscribe (fenced on the
// live generation), MCP subscribe on the host holding the session unless the server lacks
// resources.subscribe (then we poll, R11), Activate, then a read.
func (w *subscription) establish() {
	var sess contract.SessionInfo
	if err := w.local(contract.ActCurrentSession, w.in.SourceID, &sess); err != nil {
		w.failEstablish("looking up the session: " + err.Error())
		return
	}
	if !sess.Live {
		w.st.Reason = "waiting for a live session of source " + w.in.Source
		w.sleep(backoff(w.st.EstablishFailures, 2*time.Second, SessionWaitMax))
		w.st.EstablishFailures++
		return
	}
	var tr contract.TransitionOutput
	if err := w.local(contract.ActBeginSubscribe, w.transition(sess.Generation, ""), &tr); err != nil {
		w.failEstablish("begin subscribe: " + err.Error())
		return
	}
	if !okOutcome(tr.Outcome) {
		w.st.Reason = fmt.Sprintf("subscribe on generation %d refused in %s", sess.Generation, tr.State)
		w.sleep(backoff(w.st.EstablishFailures, time.Second, SessionWaitMax))
		w.st.EstablishFailures++
		return
	}
	if w.m.State != fsm.Subscribing && !w.apply(fsm.Subscribe) {
		return
	}
	w.st.SessionGeneration, w.st.HostQueue, w.st.CanSubscribe = sess.Generation, sess.HostQueue, sess.CanSubscribe
	if sess.CanSubscribe {
		f := workflow.ExecuteActivity(w.hostCtx(30*time.Second, 3), contract.ActMCPSubscribe, w.sessionCall())
		w.await(f)
		if w.m.State.Closing() {
			return
		}
		if err := f.Get(w.ctx, nil); err != nil {
			w.apply(fsm.SubscribeFailed)
			w.failEstablish("MCP subscribe: " + rootMessage(err))
			return
		}
	}
	if w.m.State != fsm.Subscribing {
		return // a session change or close arrived meanwhile
	}
	if err := w.local(contract.ActActivate, w.transition(sess.Generation, ""), &tr); err != nil || !okOutcome(tr.Outcome) {
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = fmt.Sprintf("activation on generation %d refused (%s %s)", sess.Generation, tr.Outcome, tr.State)
		return
	}
	w.apply(fsm.Subscribed)
	w.st.EstablishFailures, w.st.Reason = 0, ""
	w.apply(fsm.Update) // initial, session_change or reconcile read (R12)
}

func (w *subscription) failEstablish(reason string) {
	w.st.Reason = reason
	if w.m.State == fsm.Subscribing || w.m.State == fsm.Discovered {
		w.apply(fsm.SubscribeFailed)
		w.apply(fsm.IdentityUnknown)
	}
	var tr contract.TransitionOutput
	_ = w.local(contract.ActMarkReconciliationRequired, w.transition(0, reason), &tr)
	w.nextReason = "reconcile"
	w.sleep(backoff(w.st.EstablishFailures, 2*time.Second, EstablishRetryMax))
	w.st.EstablishFailures++
}

// ---- reads ---------------------------------------------------------------------------------

// read runs one single-flight read: allocate the ordinal (R14), read on the session host,
// then offer the response to the acceptance point (R16). Pulses during the read set the dirty
// bit; its end then leads to exactly one follow-up read (R13).
func (w *subscription) read() {
	reason := w.nextReason
	if reason == "" {
		reason = "notification"
	}
	w.nextReason = "notification"
	w.st.ReadSeq++
	// Unique per subscription across runs: a run restarted over the same ledger row must not
	// replay an earlier run's request (the ledger would answer with its first outcome).
	reqID := fmt.Sprintf("%s/%s/r%d", w.wfID, workflow.GetInfo(w.ctx).WorkflowExecution.RunID, w.st.ReadSeq)
	var alloc contract.AllocateOutput
	if err := w.local(contract.ActAllocateReadOrdinal, contract.AllocateInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: w.st.SessionGeneration, URI: w.in.URI, RequestID: reqID, Reason: reason,
	}, &alloc); err != nil {
		w.st.Counters.ReadFailures++
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = "allocating a read ordinal failed: " + err.Error()
		return
	}
	if alloc.Outcome != outcomeAllocated {
		w.st.Counters.Refused++
		w.st.Reason = fmt.Sprintf("read ordinal refused: %s (ledger state %s)", alloc.Outcome, alloc.State)
		if !w.m.State.Closing() {
			w.apply(fsm.IdentityUnknown)
		}
		return
	}
	if !w.apply(fsm.ReadDispatched) {
		return
	}
	w.duringRead = pulsesDuringRead{}
	w.st.Counters.Reads++
	w.st.Counters.ReadsByReason[reason]++
	f := workflow.ExecuteActivity(w.hostCtx(30*time.Second, 3), contract.ActMCPRead, contract.ReadInput{
		SourceID: w.in.SourceID, SessionGeneration: w.st.SessionGeneration, ServerURI: w.in.ServerURI,
		Ordinal: alloc.Ordinal, RequestID: reqID,
	})
	if !w.awaitUnlessClosing(f) {
		// The close fence passed while the read was in flight: close now, and settle the read
		// whenever it answers, after CLOSED if need be (R19).
		w.lateReads = append(w.lateReads, lateRead{future: f, ordinal: alloc.Ordinal, reqID: reqID})
		return
	}
	w.settleRead(f, alloc.Ordinal, reqID)
}

// settleRead offers a finished read to the ledger and follows its outcome.
func (w *subscription) settleRead(f workflow.Future, ordinal int64, reqID string) {
	var out contract.ReadOutput
	err := f.Get(w.ctx, &out)
	if w.m.State == fsm.ReadPending {
		w.resolvePulses(out.SentAt)
	}
	if err != nil {
		w.st.Counters.ReadFailures++
		if isStaleSession(err) {
			w.apply(fsm.SessionEnded)
			w.st.Reason = "session ended during read"
			return
		}
		w.st.Reason = "read failed: " + rootMessage(err)
		w.apply(fsm.ReadSettled)
		return
	}
	if !out.Found {
		w.st.Counters.NotFound++
		var outcome string
		if err := w.local(contract.ActRecordNotFound, contract.AcceptInput{
			SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
			SessionGeneration: w.st.SessionGeneration, URI: w.in.URI, Ordinal: ordinal, RequestID: reqID,
		}, &outcome); err != nil {
			w.st.Reason = "recording not-found failed: " + err.Error()
			w.apply(fsm.IdentityUnknown)
			return
		}
		if outcome == outcomeTombstonePending {
			w.apply(fsm.NotFound)
			w.st.Reason = fmt.Sprintf("read %d answered not found; awaiting reconciliation", ordinal)
		} else {
			w.st.Counters.Refused++
			w.afterRefusal(outcome)
		}
		return
	}
	var acc contract.AcceptOutput
	if err := w.local(contract.ActAcceptResourceVersion, contract.AcceptInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: w.st.SessionGeneration, URI: w.in.URI, Ordinal: ordinal, RequestID: reqID, Read: out,
	}, &acc); err != nil {
		w.st.Reason = "accepting failed: " + err.Error()
		w.apply(fsm.IdentityUnknown)
		return
	}
	switch acc.Outcome {
	case outcomeAccepted:
		w.st.Counters.Accepted++
		w.st.LastAcceptedOrdinal, w.st.LastAcceptedDigest = ordinal, out.Digest
		w.apply(fsm.Accepted)
		_ = workflow.UpsertMemo(w.ctx, map[string]any{
			"lastAcceptedDigest": out.Digest, "lastAcceptedOrdinal": ordinal,
		})
		w.apply(fsm.Settle)
	case outcomeRevalidated:
		w.st.Counters.Revalidated++
		w.st.LastAcceptedOrdinal = ordinal
		w.apply(fsm.ReadSettled)
	default:
		w.st.Counters.Refused++
		w.afterRefusal(acc.Outcome)
	}
}

func (w *subscription) afterRefusal(outcome string) {
	switch {
	case w.m.State.Closing():
		// STALE_AFTER_CLOSE: the receipt is the whole effect (R19).
	case outcome == outcomeOldSession || outcome == outcomeOldGeneration:
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = "read refused: " + outcome
	default:
		w.apply(fsm.ReadSettled)
	}
}

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
	if w.m.State != fsm.TombstonePending {
		return // closed, or the session changed, while the scan ran
	}
	retry := func(reason string) {
		w.st.TombstoneAttempts++
		w.st.Reason = "tombstone pending: " + reason
		w.sleep(backoff(w.st.TombstoneAttempts, 2*time.Second, EstablishRetryMax))
	}
	var res contract.DiscoveryScanResult
	if err := f.Get(w.ctx, &res); err != nil {
		retry("reconciliation scan failed: " + rootMessage(err))
		return
	}
	var out contract.ConfirmTombstoneOutput
	if err := w.local(contract.ActConfirmTombstone, contract.ConfirmTombstoneInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation, CatalogID: res.CatalogID,
	}, &out); err != nil {
		retry("confirming failed: " + err.Error())
		return
	}
	switch {
	case okOutcome(out.Outcome):
		w.st.CloseEpoch, w.st.TombstoneAttempts = out.CloseEpoch, 0
		w.st.Reason = fmt.Sprintf("deleted: read %d answered not found and catalog %d (%s) does not list it", out.ReadOrdinal, res.CatalogID, res.Level)
		w.apply(fsm.TombstoneConfirmed)
	case out.Refusal == tombstoneResourcePresent:
		var tr contract.TransitionOutput
		if err := w.local(contract.ActRestoreFromTombstone, w.transition(0, ""), &tr); err != nil || !okOutcome(tr.Outcome) {
			retry(fmt.Sprintf("resource listed again, restoring refused (%s %s)", tr.Outcome, tr.State))
			return
		}
		w.st.TombstoneAttempts, w.st.Reason = 0, ""
		w.nextReason = "reconcile"
		w.apply(fsm.ResourcePresent)
	case out.Refusal == tombstoneNotPending || out.Refusal == tombstoneOldGeneration:
		// The ledger moved on (a session change or a close): follow it.
		if ref, err := w.ledgerState(); err == nil && fsm.State(ref.State) != fsm.TombstonePending {
			if fsm.State(ref.State).Closing() {
				w.m.State = fsm.State(ref.State)
			} else {
				w.apply(fsm.IdentityUnknown)
			}
			return
		}
		retry("ledger refused: " + out.Refusal)
	default:
		retry(fmt.Sprintf("catalog %d (%s) cannot confirm: %s", res.CatalogID, res.Level, out.Refusal))
	}
}

// ---- refresh and idling --------------------------------------------------------------------

// idle waits in ACTIVE for a pulse: a notification, or the backstop (subscribed servers, R28)
// or poll timer (servers without resources.subscribe, R11), jittered.
func (w *subscription) idle() {
	if w.refresh == nil {
		period, reason := w.in.BackstopSeconds, "backstop"
		if !w.st.CanSubscribe {
			period, reason = w.in.PollSeconds, "poll"
		}
		if period <= 0 {
			period = 30
		}
		ctx, cancel := workflow.WithCancel(w.ctx)
		w.refresh, w.refreshCancel = workflow.NewTimer(ctx, w.jitter(time.Duration(period)*time.Second)), cancel
		w.refreshReason = reason
	}
	sel := workflow.NewSelector(w.ctx)
	sel.AddFuture(w.refresh, func(workflow.Future) {
		w.refresh, w.refreshCancel = nil, nil
		if w.m.State == fsm.Active {
			w.nextReason = w.refreshReason
			w.apply(fsm.Update)
		}
	})
	w.addSignals(sel)
	sel.Select(w.ctx)
}

// jitter spreads d over [0.8d, 1.2d), deterministically per workflow and read count.
func (w *subscription) jitter(d time.Duration) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d/%d", w.wfID, w.st.ReadSeq, w.st.ContinuedAsNew)
	frac := float64(h.Sum64()%1000) / 1000
	return time.Duration(float64(d) * (0.8 + 0.4*frac))
}

// ---- closing -------------------------------------------------------------------------------

// beginClose passes the close fence in the ledger (R18) and moves to UNSUBSCRIBING.
func (w *subscription) beginClose(reason string) {
	if w.refreshCancel != nil {
		w.refreshCancel()
		w.refresh, w.refreshCancel = nil, nil
	}
	var tr contract.TransitionOutput
	if err := w.local(contract.ActBeginUnsubscribe, w.transition(0, reason), &tr); err != nil {
		w.st.Reason = "close fence failed: " + err.Error()
		w.st.PendingUnsubscribe = reason // try again on the next turn
		return
	}
	w.st.CloseEpoch = tr.CloseEpoch
	w.st.Reason = reason
	switch tr.State {
	case string(fsm.Closed):
		w.m.State = fsm.Closed
	case string(fsm.UnsubscribeUnknown):
		w.m.State = fsm.UnsubscribeUnknown
	default:
		if !w.apply(fsm.Unsubscribe) {
			w.m.State = fsm.Unsubscribing
		}
	}
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
		w.closeIfLedgerClosed("session gone before the unsubscribe was acknowledged")
		if w.m.State != fsm.Closed {
			w.markUnknown("session unreachable: " + rootMessage(err))
		}
	default:
		w.markUnknown("unsubscribe acknowledgement lost: " + rootMessage(err))
	}
}

func (w *subscription) markUnknown(reason string) {
	if w.m.State == fsm.UnsubscribeUnknown {
		w.st.Reason = reason
		return
	}
	var tr contract.TransitionOutput
	if err := w.local(contract.ActMarkUnsubscribeUnknown, w.transition(0, reason), &tr); err == nil && tr.State == string(fsm.Closed) {
		w.apply(fsm.SessionEnded)
		return
	}
	w.apply(fsm.UnsubscribeLost)
	w.st.Reason = reason
}

// retryUnsubscribe retries the unsubscribe on the same session; when that session ends the
// ledger closes the subscription (R20). It never goes back to ACTIVE.
func (w *subscription) retryUnsubscribe() {
	w.sleep(backoff(w.st.UnsubscribeAttempts, 2*time.Second, UnsubscribeRetryMax))
	w.applyPending()
	if w.m.State != fsm.UnsubscribeUnknown {
		return
	}
	w.closeIfLedgerClosed("session ended")
	if w.m.State == fsm.UnsubscribeUnknown {
		w.callUnsubscribe()
	}
}

func (w *subscription) completeClose() {
	var tr contract.TransitionOutput
	if err := w.local(contract.ActCompleteUnsubscribe, w.transition(0, ""), &tr); err != nil {
		w.st.Reason = "completing the close failed: " + err.Error()
		w.sleep(5 * time.Second)
		return
	}
	if tr.State == string(fsm.Closed) {
		if !w.apply(fsm.UnsubscribeAcked) {
			w.m.State = fsm.Closed
		}
	}
}

func (w *subscription) closeIfLedgerClosed(reason string) {
	ref, err := w.ledgerState()
	if err == nil && ref.State == string(fsm.Closed) {
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

// ---- continue-as-new -----------------------------------------------------------------------

func (w *subscription) shouldContinueAsNew() bool {
	info := workflow.GetInfo(w.ctx)
	return info.GetContinueAsNewSuggested() || info.GetCurrentHistoryLength() >= HistoryThreshold ||
		w.signalsThisRun >= SignalThreshold
}

// continueAsNew drains pending signals into the state and continues as new with it; if a
// drained signal needs action first, it returns nil and the loop handles it.
func (w *subscription) continueAsNew() error {
	w.drainSignals()
	if w.st.PendingUnsubscribe != "" || w.st.PendingSessionChange > 0 || w.m.State != fsm.Active && w.m.State != fsm.UpdateSeen {
		return nil
	}
	if err := workflow.Await(w.ctx, func() bool { return workflow.AllHandlersFinished(w.ctx) }); err != nil {
		return err
	}
	if w.refreshCancel != nil {
		w.refreshCancel()
	}
	w.st.Machine, w.st.Dirty = string(w.m.State), w.m.Dirty
	w.st.ContinuedAsNew++
	next := w.in
	next.State = w.st
	return workflow.NewContinueAsNewError(w.ctx, contract.SubscriptionWorkflowName, next)
}

// ---- helpers -------------------------------------------------------------------------------

func (w *subscription) view() contract.StateView {
	return contract.StateView{
		State: string(w.m.State), Reason: w.st.Reason, SubscriptionID: w.st.SubscriptionID,
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
	return ref, err
}

// coarseState is the state as the ledger and the search attributes name it.
func coarseState(s fsm.State) string {
	if s.Live() {
		return string(fsm.Active)
	}
	return string(s)
}

func (w *subscription) upsertSearch() {
	state := coarseState(w.m.State)
	if state == w.upserted {
		return
	}
	if err := workflow.UpsertTypedSearchAttributes(w.ctx,
		contract.SearchSource.ValueSet(w.in.Source),
		contract.SearchURI.ValueSet(w.in.URI),
		contract.SearchPrincipal.ValueSet(w.in.Principal),
		contract.SearchState.ValueSet(state),
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

func okOutcome(o string) bool { return o == outcomeTransitioned || o == outcomeAlreadyDone }

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
