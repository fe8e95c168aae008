package workflows

import (
	"fmt"
	"hash/fnv"
	"time"

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
// bit; its end then leads to exactly one follow-up read (R13).
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
	var alloc contract.AllocateOutput
	if err := w.local(contract.ActAllocateReadOrdinal, contract.AllocateInput{
		SubscriptionID: w.st.SubscriptionID, Generation: w.st.Generation,
		SessionGeneration: w.st.SessionGeneration, URI: w.in.URI, RequestID: reqID, Reason: reason,
	}, &alloc); err != nil {
		w.st.Counters.ReadFailures++
		w.apply(fsm.IdentityUnknown)
		w.st.Reason = reasonf(err, "allocating a read ordinal failed")
		return
	}
	if alloc.Outcome != mcpsync.OutcomeAllocated {
		w.st.Counters.Refused++
		w.st.Reason = reasonf(nil, "read ordinal refused: %s (ledger state %s)", alloc.Outcome, alloc.State)
		if alloc.Outcome == mcpsync.OutcomeRevoked {
			w.requestRevokedClose("allocate")
			return
		}
		if !w.m.State().Closing() {
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
		if err := w.local(contract.ActRecordNotFound, contract.AcceptInput{ReadID: w.readID(ordinal, reqID)}, &outcome); err != nil {
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
	if err := w.local(contract.ActAcceptResourceVersion, contract.AcceptInput{ReadID: w.readID(ordinal, reqID), Read: out}, &acc); err != nil {
		w.st.Reason = reasonf(err, "accepting failed")
		w.apply(fsm.IdentityUnknown)
		return
	}
	switch acc.Outcome {
	case mcpsync.OutcomeAccepted:
		w.st.Counters.Accepted++
		w.st.LastAcceptedOrdinal, w.st.LastAcceptedDigest = ordinal, out.Digest
		w.apply(fsm.Accepted)
		if err := workflow.UpsertMemo(w.ctx, map[string]any{
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
		if !w.st.CanSubscribe {
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
