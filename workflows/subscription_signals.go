package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/fsm"
)

// Kinds of close request, the first words of the close reason.
const (
	closeUnsubscribed = "unsubscribed"
	closeRevoked      = "revoked"
)

// pulsesDuringRead summarizes the notifications received while a read was in flight.
type pulsesDuringRead struct {
	pulses  int64
	latest  time.Time // newest host arrival time among them
	untimed bool      // one of them has no comparable arrival time
}

// updateQueueCap bounds the updates a run queues (updateQ): the server admits at most 2,000
// per run (history.maxTotalUpdates), so the handler's send never blocks.
const updateQueueCap = 2048

// handleUpdates registers the handler of resource-updated workflow updates (issue 16): it
// queues the notification for the loop, which records it as it records the signal of the
// same name (onUpdate), and completes at once, so a run never continues as new with a
// handler running. It never rejects: the workflow tolerates duplicates and reordering (a
// notification with an older sequence number is counted stale, and the newer one's read
// covers it). Registering emits no command, so histories of runs without it replay.
func (w *subscription) handleUpdates() error {
	w.updateQ = workflow.NewBufferedChannel(w.ctx, updateQueueCap)
	return workflow.SetUpdateHandler(w.ctx, contract.UpdateResourceUpdated, func(ctx workflow.Context, u contract.ResourceUpdated) error {
		w.updatesThisRun++
		w.updateQ.Send(ctx, u)
		return nil
	})
}

func (w *subscription) addSignals(sel workflow.Selector) {
	for _, ch := range []workflow.ReceiveChannel{w.updateCh, w.updateQ} {
		sel.AddReceive(ch, func(c workflow.ReceiveChannel, _ bool) {
			var u contract.ResourceUpdated
			c.Receive(w.ctx, &u)
			w.onUpdate(u)
		})
	}
	sel.AddReceive(w.unsubCh, func(c workflow.ReceiveChannel, _ bool) {
		var u contract.Unsubscribe
		c.Receive(w.ctx, &u)
		w.onUnsubscribe(u, closeUnsubscribed)
	})
	sel.AddReceive(w.revokeCh, func(c workflow.ReceiveChannel, _ bool) {
		var u contract.Unsubscribe
		c.Receive(w.ctx, &u)
		w.onUnsubscribe(u, closeRevoked)
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
		for w.updateCh.ReceiveAsync(&u) || w.updateQ.ReceiveAsync(&u) {
			w.onUpdate(u)
			more = true
		}
		var un contract.Unsubscribe
		for w.unsubCh.ReceiveAsync(&un) {
			w.onUnsubscribe(un, closeUnsubscribed)
			more = true
		}
		for w.revokeCh.ReceiveAsync(&un) {
			w.onUnsubscribe(un, closeRevoked)
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
	c.Signals++
	if u.SessionGeneration < w.st.LastNotificationGen ||
		(u.SessionGeneration == w.st.LastNotificationGen && u.Seq <= w.st.LastNotificationSeq) ||
		u.SessionGeneration < w.st.SessionGeneration || w.m.State().Closing() {
		// A duplicate, a notification of an older session (R12), or one after close (R19).
		c.NotificationsStale += pulses
		return
	}
	w.st.LastNotificationGen, w.st.LastNotificationSeq = u.SessionGeneration, u.Seq
	if s := w.m.State(); s == mcpsync.StateReadPending || s == mcpsync.StateVersionAccepted {
		// Whether this pulse needs a follow-up read is known when the read answers.
		w.duringRead.pulses += pulses
		if u.ReceivedAt.IsZero() || u.SessionGeneration != w.st.SessionGeneration {
			w.duringRead.untimed = true
		} else if u.ReceivedAt.After(w.duringRead.latest) {
			w.duringRead.latest = u.ReceivedAt
		}
		return
	}
	if w.m.State() == mcpsync.StateActive {
		if w.coveredByLastRead(u) {
			// A copy of a notification the last read already covered, delivered after that
			// read answered (R13, R27).
			c.PulsesCovered += pulses
			return
		}
		w.nextReason = mcpsync.ReasonNotification
	}
	// Not live yet (subscribing, reconciling): the read that follows establishing covers it.
	w.apply(fsm.Update)
}

// versionCoverAfterRead marks the runs where a notification delivered after a read answered,
// but received by the host before that read was sent, is covered by it (no read of its own).
const versionCoverAfterRead = "cover-after-read"

// coveredByLastRead reports whether u reached the host before the host sent the last read
// that answered, on the same session (one host, one clock): that read already sees the change
// it announces.
func (w *subscription) coveredByLastRead(u contract.ResourceUpdated) bool {
	if u.ReceivedAt.IsZero() || w.st.LastReadSentAt.IsZero() || u.SessionGeneration != w.st.SessionGeneration ||
		u.SessionGeneration != w.st.LastReadSessionGen || !u.ReceivedAt.Before(w.st.LastReadSentAt) {
		return false
	}
	return patched(w.ctx, versionCoverAfterRead)
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
	if w.m.State().Closing() || w.st.PendingUnsubscribe != "" {
		return
	}
	reason := reasonf(nil, "%s", kind)
	if u.Reason != "" {
		reason = reasonf(nil, "%s: %s", kind, u.Reason)
	}
	w.st.PendingUnsubscribe = reason
}

func (w *subscription) onSessionChanged(s contract.SessionChanged) {
	w.signalsThisRun++
	if s.Generation > w.st.SessionGeneration && s.Generation > w.st.PendingSessionChange {
		w.st.PendingSessionChange = s.Generation
	}
	// A listen stream of the current generation ended without its complete result (issue 13
	// item 4): a new epoch, acted on once (the newest pending one wins).
	if s.ListenEpoch > 0 && s.Generation == w.st.SessionGeneration &&
		(s.Generation > w.st.ListenGen || s.ListenEpoch > w.st.ListenEpoch) && s.ListenEpoch > w.st.PendingListenEpoch {
		w.st.PendingListenEpoch = s.ListenEpoch
	}
}

// applyListenEpoch acts on a pending listen epoch (issue 13 item 4): nothing that was sent
// while the stream was down is replayed, so, as after a new session generation (R12), the
// subscription leaves ACTIVE (the ledger marks it RECONCILIATION_REQUIRED first, which also
// fences the reads in flight), subscribes again on the same session — the host answers once
// the re-opened stream is acknowledged, or says the URI is no longer watched — and re-reads.
func (w *subscription) applyListenEpoch() {
	e := w.st.PendingListenEpoch
	if e == 0 {
		return
	}
	w.st.PendingListenEpoch = 0
	if w.st.ListenGen == w.st.SessionGeneration && e <= w.st.ListenEpoch {
		return
	}
	w.st.ListenGen, w.st.ListenEpoch = w.st.SessionGeneration, e
	switch w.m.State() {
	case mcpsync.StateActive, mcpsync.StateUpdateSeen, mcpsync.StateReadPending, mcpsync.StateVersionAccepted:
	default:
		return // closing, establishing or waiting already: its next subscribe covers the epoch
	}
	reason := fmt.Sprintf("listen stream ended (generation %d, epoch %d): nothing is replayed", w.st.SessionGeneration, e)
	if w.apply(fsm.SessionEnded) {
		w.st.PendingMark = reason
		w.nextReason = mcpsync.ReasonSessionChange
		w.st.Reason = reason
	}
}

// applyPending acts on recorded signals. The close fence comes first, at once (R18): a read
// in flight is then refused by the ledger when it returns (R19).
func (w *subscription) applyPending() {
	w.passCloseFence()
	if g := w.st.PendingSessionChange; g > 0 {
		w.st.PendingSessionChange = 0
		if g > w.st.SessionGeneration {
			switch {
			case w.m.State().Closing():
				// The ledger closed in-flight or unknown unsubscribes of the old session (R20).
				if ref, err := w.ledgerState(); err == nil && ref.State == mcpsync.StateClosed {
					w.apply(fsm.SessionEnded)
				}
			case w.m.State() == mcpsync.StateDiscovered:
				// Never bound to a session: establishing picks up the new one.
			default:
				if w.st.SessionGeneration > 0 && w.apply(fsm.SessionEnded) {
					w.nextReason = mcpsync.ReasonSessionChange
					w.st.Reason = reasonf(nil, "session changed to generation %d", g)
				}
			}
		}
	}
	w.applyListenEpoch()
	if w.st.PendingReconcile {
		w.st.PendingReconcile = false
		w.st.EstablishFailures = 0
		if w.m.State() == mcpsync.StateReconciliationRequired {
			w.nextReason = mcpsync.ReasonReconcile
		}
	}
}

// passCloseFence acts on a pending unsubscribe or revocation: it passes the close fence
// (R18) unless the subscription is closing already. A close fence that failed is pending
// again afterwards (beginClose records it and arms its backoff timer) and is tried again once
// the backoff is over, never dropped.
func (w *subscription) passCloseFence() {
	reason := w.st.PendingUnsubscribe
	if reason == "" {
		return
	}
	if w.m.State().Closing() {
		// Closing by another way (a confirmed tombstone, the ledger's close): nothing to do.
		w.st.PendingUnsubscribe, w.st.CloseFenceFailures = "", 0
		w.stopCloseRetry()
		return
	}
	if !w.closeRetryDue() {
		return
	}
	w.closeRetry, w.closeRetryCancel = nil, nil
	w.st.PendingUnsubscribe = ""
	w.beginClose(reason)
}

// await blocks until f is ready, recording every signal that arrives meanwhile and passing
// the close fence as soon as an unsubscribe or revocation arrives.
func (w *subscription) await(f workflow.Future) { w.awaitFor(f, false) }

// awaitUnlessClosing is await that gives up (returning false) once the close fence has
// passed with f still pending.
func (w *subscription) awaitUnlessClosing(f workflow.Future) bool { return w.awaitFor(f, true) }

func (w *subscription) awaitFor(f workflow.Future, stopWhenClosing bool) bool {
	for !f.IsReady() {
		if stopWhenClosing && w.m.State().Closing() {
			return false
		}
		sel := workflow.NewSelector(w.ctx)
		sel.AddFuture(f, func(workflow.Future) {})
		w.addSignals(sel)
		w.addCloseRetry(sel)
		sel.Select(w.ctx)
		w.passCloseFence()
		if w.ctx.Err() != nil {
			return true
		}
	}
	return true
}

// sleep waits d or until a signal arrives or the backoff of a failed close fence is over,
// whichever is first.
func (w *subscription) sleep(d time.Duration) {
	ctx, cancel := workflow.WithCancel(w.ctx)
	defer cancel()
	timer := workflow.NewTimer(ctx, d)
	sel := workflow.NewSelector(w.ctx)
	sel.AddFuture(timer, func(workflow.Future) {})
	w.addSignals(sel)
	w.addCloseRetry(sel)
	sel.Select(w.ctx)
}
