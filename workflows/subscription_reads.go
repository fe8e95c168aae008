package workflows

import (
	"fmt"
	"hash/fnv"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// lateRead is a read dispatched before the close fence whose answer had not arrived.
type lateRead struct {
	future  workflow.Future
	ordinal int64
	reqID   string
}

// read runs one single-flight read: allocate the ordinal (R14), read on the session host,
// then offer the response to the acceptance point (R16). Pulses during the read set the dirty
// bit; its end then leads to exactly one follow-up read (R13). Runs of the local-read patch
// take the fast path (readLocal).
func (w *subscription) read() {
	reason := w.nextReason
	if reason == "" {
		reason = mcpsync.ReasonNotification
	}
	w.nextReason = mcpsync.ReasonNotification
	w.st.ReadSeq++
	// Unique per subscription across runs: a run restarted over the same ledger row must not
	// replay an earlier run's request (the ledger would answer with its first outcome).
	reqID := fmt.Sprintf("%s/%s/r%d", w.wfID, workflow.GetInfo(w.ctx).WorkflowExecution.RunID, w.st.ReadSeq)
	if patched(w.ctx, versionLocalRead) {
		w.localReads = true
		w.readLocal(reason, reqID)
		return
	}
	var alloc contract.AllocateOutput
	if err := w.local(contract.ActAllocateReadOrdinal, w.allocateInput(reason, reqID), &alloc); err != nil {
		w.allocateFailed(err)
		return
	}
	if !w.dispatched(alloc, reason) {
		return
	}
	w.readOnHost(alloc.Ordinal, reqID)
}

// versionLocalRead marks the runs that read on the fast path (issue 16 item 2): one local
// activity allocates, reads on the session when the worker running the workflow task holds
// it, and settles at the acceptance point, so an update costs one workflow task; the
// accepted digest is no longer mirrored into the memo (the current details show it). A run
// whose history reached a read before the patch replays the three-step path.
const versionLocalRead = "local-read"

// LocalReadHandoff bounds how long the fast path's read may keep the workflow task (which
// takes no signal meanwhile) before the read is handed to the host queue, where the close
// fence can overtake it as before (R18, R19). A variable so that tests can change it.
var LocalReadHandoff = time.Second

// readLocal is the fast path: ActLocalRead allocates and, if this worker holds the session,
// reads and settles in the same workflow task. Otherwise (another worker holds the session,
// the read did not answer within LocalReadHandoff, or it failed) the read goes on on the host
// queue under the same ordinal and request ID, exactly as on the regular path.
func (w *subscription) readLocal(reason mcpsync.ReadReason, reqID string) {
	ctx := workflow.WithLocalActivityOptions(w.ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: LocalReadHandoff + 30*time.Second,
		StartToCloseTimeout:    LocalReadHandoff + 30*time.Second,
		// One attempt: a failure leaves the allocation unknown, and the regular path below
		// allocates again (same request ID: the first outcome, R14) with its retries.
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var lr contract.LocalReadOutput
	err := workflow.ExecuteLocalActivity(ctx, contract.ActLocalRead, contract.LocalReadInput{
		Allocate: w.allocateInput(reason, reqID), SourceID: w.in.SourceID, ServerURI: w.in.ServerURI, Handoff: LocalReadHandoff,
	}).Get(w.ctx, &lr)
	if err != nil {
		w.log.Warn("fast-path read failed; allocating on the regular path", "error", err)
		if err := w.local(contract.ActAllocateReadOrdinal, w.allocateInput(reason, reqID), &lr.Alloc); err != nil {
			w.allocateFailed(err)
			return
		}
		lr = contract.LocalReadOutput{Alloc: lr.Alloc}
	}
	if !w.dispatched(lr.Alloc, reason) {
		return
	}
	w.st.Counters.ReadsLocal += b2i(lr.Here && !lr.HandedOff)
	switch {
	case !lr.Here || lr.HandedOff:
		w.readOnHost(lr.Alloc.Ordinal, reqID)
	case lr.Settled:
		w.settleAnswer(lr.Read, nil, lr.Alloc.Ordinal, reqID, &lr)
	default:
		w.settleAnswer(lr.Read, nil, lr.Alloc.Ordinal, reqID, nil)
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (w *subscription) allocateInput(reason mcpsync.ReadReason, reqID string) contract.AllocateInput {
	return contract.AllocateInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: w.st.SessionGeneration, URI: w.in.URI, RequestID: reqID, Reason: reason,
	}
}

// allocateFailed follows an allocation whose outcome is unknown (R12).
func (w *subscription) allocateFailed(err error) {
	w.st.Counters.ReadFailures++
	w.apply(fsm.IdentityUnknown)
	w.st.Reason = reasonf(err, "allocating a read ordinal failed")
}

// dispatched follows an allocation's outcome and reports whether the read is dispatched
// (READ_PENDING, counted).
func (w *subscription) dispatched(alloc contract.AllocateOutput, reason mcpsync.ReadReason) bool {
	if alloc.Outcome != mcpsync.OutcomeAllocated {
		w.st.Counters.Refused++
		w.st.Reason = reasonf(nil, "read ordinal refused: %s (ledger state %s)", alloc.Outcome, alloc.State)
		if alloc.Outcome == mcpsync.OutcomeRevoked {
			w.requestRevokedClose("allocate")
			return false
		}
		if !w.m.State().Closing() {
			w.apply(fsm.IdentityUnknown)
		}
		return false
	}
	if !w.apply(fsm.ReadDispatched) {
		return false
	}
	w.duringRead = pulsesDuringRead{}
	w.st.Counters.Reads++
	w.st.Counters.ReadsByReason[reason]++
	return true
}

// readOnHost reads on the session host's queue and settles the answer; if the close fence
// passes first, the read is kept and settled whenever it answers (R19).
func (w *subscription) readOnHost(ordinal int64, reqID string) {
	f := workflow.ExecuteActivity(w.hostCtx(30*time.Second, 3), contract.ActMCPRead, contract.ReadInput{
		SourceID: w.in.SourceID, SessionGeneration: w.st.SessionGeneration, ServerURI: w.in.ServerURI,
		Ordinal: ordinal, RequestID: reqID,
	})
	if !w.awaitUnlessClosing(f) {
		// The close fence passed while the read was in flight: close now, and settle the read
		// whenever it answers, after CLOSED if need be (R19).
		w.lateReads = append(w.lateReads, lateRead{future: f, ordinal: ordinal, reqID: reqID})
		return
	}
	w.settleRead(f, ordinal, reqID)
}

// readID is the identity of the read with this ordinal and request ID (R14, R16).
func (w *subscription) readID(ordinal int64, reqID string) mcpsync.ReadID {
	return mcpsync.ReadID{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: w.st.SessionGeneration, URI: w.in.URI, Ordinal: ordinal, RequestID: reqID,
	}
}

// settleRead offers a finished read to the ledger and follows its outcome.
func (w *subscription) settleRead(f workflow.Future, ordinal int64, reqID string) {
	var out contract.ReadOutput
	err := f.Get(w.ctx, &out)
	w.settleAnswer(out, err, ordinal, reqID, nil)
}

// settleAnswer follows a read's answer (out, or its error): offered to the ledger, unless the
// fast path already did (settled, with the ledger's outcome).
func (w *subscription) settleAnswer(out contract.ReadOutput, err error, ordinal int64, reqID string, settled *contract.LocalReadOutput) {
	if w.m.State() == mcpsync.StateReadPending {
		w.resolvePulses(out.SentAt)
	}
	if err == nil && !out.SentAt.IsZero() {
		w.st.LastReadSentAt, w.st.LastReadSessionGen = out.SentAt, w.st.SessionGeneration
	}
	if err != nil {
		w.st.Counters.ReadFailures++
		if isStaleSession(err) {
			if w.m.State().Closing() {
				// The ledger closes a closing subscription when the session's end is
				// recorded (R20); the close path follows it there.
				return
			}
			w.apply(fsm.SessionEnded)
			w.st.Reason = reasonf(nil, "session ended during read")
			return
		}
		w.st.Reason = reasonf(err, "read failed")
		w.apply(fsm.ReadSettled)
		return
	}
	if !out.Found {
		w.st.Counters.NotFound++
		var outcome mcpsync.Outcome
		if settled != nil {
			outcome = settled.Outcome
		} else if err := w.local(contract.ActRecordNotFound, contract.AcceptInput{ReadID: w.readID(ordinal, reqID)}, &outcome); err != nil {
			w.st.Reason = reasonf(err, "recording not-found failed")
			w.apply(fsm.IdentityUnknown)
			return
		}
		if outcome == mcpsync.OutcomeTombstonePending {
			w.apply(fsm.NotFound)
			w.st.Reason = reasonf(nil, "read %d answered not found; awaiting reconciliation", ordinal)
		} else {
			w.st.Counters.Refused++
			w.afterRefusal(outcome, "not-found record")
		}
		return
	}
	var acc contract.AcceptOutput
	if settled != nil {
		acc = contract.AcceptOutput{Outcome: settled.Outcome, VersionID: settled.VersionID}
	} else if err := w.local(contract.ActAcceptResourceVersion, contract.AcceptInput{ReadID: w.readID(ordinal, reqID), Read: out}, &acc); err != nil {
		w.st.Reason = reasonf(err, "accepting failed")
		w.apply(fsm.IdentityUnknown)
		return
	}
	switch acc.Outcome {
	case mcpsync.OutcomeAccepted:
		w.st.Counters.Accepted++
		w.st.LastAcceptedOrdinal, w.st.LastAcceptedDigest = ordinal, out.Digest
		w.apply(fsm.Accepted)
		if w.localReads {
			// local-read: no memo (one history event per update less); the current details
			// show the accepted ordinal and digest (setDetails).
		} else if err := workflow.UpsertMemo(w.ctx, map[string]any{
			"lastAcceptedDigest": out.Digest, "lastAcceptedOrdinal": ordinal,
		}); err != nil {
			// The memo only mirrors the ledger for operators; the version is accepted.
			w.log.Warn("upsert memo failed", "ordinal", ordinal, "error", err)
		}
		w.apply(fsm.Settle)
	case mcpsync.OutcomeRevalidated:
		w.st.Counters.Revalidated++
		w.st.LastAcceptedOrdinal = ordinal
		w.apply(fsm.ReadSettled)
	case mcpsync.OutcomeTooLarge:
		// Over the source's size bound (issue 14 item 6): nothing was stored and the previous
		// version stays. Like a refusal, the read just ends: the next read waits for the next
		// notification or the backstop, never re-reading hot.
		w.st.Counters.Refused++
		w.st.Reason = reasonf(nil, "read %d too large: %d bytes over the source's bound of %d; the previous version is kept",
			ordinal, out.Size, out.MaxBytes)
		w.apply(fsm.ReadSettled)
	default:
		w.st.Counters.Refused++
		w.afterRefusal(acc.Outcome, "accept")
	}
}

// afterRefusal follows a read the ledger did not accept: after close the receipt is the whole
// effect; a revoked grant requests the close (requestRevokedClose); a read of an older session
// or generation leaves the server side unknown (R12); any other refusal (stale, R17) just ends
// the read.
func (w *subscription) afterRefusal(outcome mcpsync.Outcome, phase string) {
	switch {
	case w.m.State().Closing():
		// STALE_AFTER_CLOSE: the receipt is the whole effect (R19).
	case outcome == mcpsync.OutcomeRevoked:
		w.apply(fsm.ReadSettled)
		w.requestRevokedClose(phase)
	case outcome == mcpsync.OutcomeOldSession || outcome == mcpsync.OutcomeOldGeneration:
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = reasonf(nil, "read refused: %s", outcome)
	default:
		w.apply(fsm.ReadSettled)
	}
}

// idle waits in ACTIVE for a pulse: a notification, or the backstop (subscribed servers, R28)
// or poll timer (servers without resources.subscribe, R11), jittered.
func (w *subscription) idle() {
	if w.refresh == nil {
		backstop, poll := w.in.BackstopSeconds, w.in.PollSeconds
		if w.st.BackstopSeconds > 0 && w.st.PollSeconds > 0 {
			backstop, poll = w.st.BackstopSeconds, w.st.PollSeconds
		}
		period, reason := backstop, mcpsync.ReasonBackstop
		if !w.st.CanSubscribe || w.st.NotAcknowledged {
			period, reason = poll, mcpsync.ReasonPoll
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
		if w.m.State() == mcpsync.StateActive {
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

// requestRevokedClose follows a REVOKED refusal of a read statement (at allocate, accept or
// not-found): the principal's grant is gone, so the refusal is itself a close request with the
// revoke reason, passed through the close fence on the next turn and retried with backoff
// until it passes, exactly like a Revoke signal (R18, R29). The subscription never goes back
// to establishing, and needs no signal to close.
func (w *subscription) requestRevokedClose(phase string) {
	w.st.Reason = reasonf(nil, "%s: the ledger refused the %s: the principal's grant was revoked", closeRevoked, phase)
	if w.m.State().Closing() || w.st.PendingUnsubscribe != "" {
		return
	}
	w.st.PendingUnsubscribe = w.st.Reason
}
