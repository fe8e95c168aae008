package shuffle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// pulser stands for the session host and the workflow's dispatch: notification pulses, each
// followed by a read ordinal allocation on the subscription as the harness last saw it, some
// retried with the same request ID, some sent with a stale session generation.
func (iv *interleaving) pulser(rng *rand.Rand) {
	defer func() {
		iv.mu.Lock()
		iv.pulserDone = true
		iv.cond.Broadcast()
		iv.mu.Unlock()
	}()
	n := 3 + rng.IntN(4)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		iv.mu.Lock()
		gen, sgen, srcGen := iv.subGen, iv.subSgen, iv.srcGen
		iv.notifySeq++
		seq := iv.notifySeq
		iv.mu.Unlock()
		if rng.IntN(2) == 0 {
			iv.notify(srcGen, seq)
			if rng.IntN(3) == 0 {
				iv.notify(srcGen, seq) // the commit reply was lost: the host retries (R12)
				iv.mu.Lock()
				iv.counts.notificationRetries++
				iv.mu.Unlock()
			}
		}
		if sgen > 1 && rng.IntN(10) == 0 {
			sgen-- // a dispatch from a session that is already gone
		}
		if rng.IntN(8) == 0 {
			iv.allocate(clientPulser, gen, sgen, fmt.Sprintf("p%d-wrong-uri", i), true, true)
		}
		req := fmt.Sprintf("p%d", i)
		iv.allocate(clientPulser, gen, sgen, req, true, false)
		if rng.IntN(5) == 0 {
			iv.allocate(clientPulser, gen, sgen, req, false, false) // the activity retried
		}
	}
}

// reader answers dispatches in random order: fresh content (from a small set of bodies, so
// some answers revalidate), not-found, exact retries of earlier answers, and second, different
// answers to dispatches already answered. Some reads are slow: the reader holds their answer
// back until the session churner and the lifecycle keeper have finished, so it arrives after
// whatever they did — a close, a new generation, a new session.
func (iv *interleaving) reader(rng *rand.Rand, client int) {
	bodies := []string{"alpha", "beta", "gamma"}
	var slow []answer
	defer func() {
		iv.mu.Lock()
		for iv.lifecycleLeft > 0 && len(slow) > 0 {
			iv.cond.Wait()
		}
		iv.mu.Unlock()
		for _, a := range slow {
			iv.answer(client, a)
		}
	}()
	n := 3 + rng.IntN(3)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		iv.mu.Lock()
		for len(iv.pending) == 0 && len(iv.answered) == 0 && !iv.pulserDone {
			iv.cond.Wait()
		}
		var a answer
		switch {
		case len(iv.pending) > 0 && (len(iv.answered) == 0 || rng.IntN(4) != 0):
			k := rng.IntN(len(iv.pending))
			a.d = iv.pending[k]
			iv.pending = append(iv.pending[:k], iv.pending[k+1:]...)
			a.notFound = rng.IntN(8) == 0
			a.body = bodies[rng.IntN(len(bodies))]
			if rng.IntN(8) == 0 {
				// First an answer (content or not-found) naming another resource: NOT_DISPATCHED, and the
				// dispatch stays open for the right one.
				iv.mu.Unlock()
				iv.answer(client, answer{d: a.d, body: "wrong uri", wrongURI: true, notFound: rng.IntN(2) == 0})
				iv.mu.Lock()
			}
			if rng.IntN(4) == 0 {
				slow = append(slow, a)
				iv.mu.Unlock()
				continue
			}
		case len(iv.answered) > 0:
			a = iv.answered[rng.IntN(len(iv.answered))]
			if rng.IntN(2) == 0 { // a different answer to the same dispatch
				a.notFound = rng.IntN(6) == 0
				a.body = bodies[rng.IntN(len(bodies))] + "'"
			}
		default:
			iv.mu.Unlock()
			return
		}
		iv.mu.Unlock()
		iv.answer(client, a)
		if rng.IntN(10) == 0 {
			iv.answer(client, a) // the activity retried
		}
	}
}

// churner changes the source's session: a new connection (OpenSession), or the connection
// ends first (CloseSession) and then a new one opens; sometimes it ends an old generation
// again.
func (iv *interleaving) churner(rng *rand.Rand) {
	n := rng.IntN(3)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		iv.mu.Lock()
		cur := iv.srcGen
		iv.mu.Unlock()
		if rng.IntN(3) == 0 {
			iv.closeSession(cur)
		}
		if cur > 1 && rng.IntN(5) == 0 {
			iv.closeSession(cur - 1) // a late end of a superseded session
		}
		call := iv.now()
		sess, _, err := iv.st.OpenSession(iv.ctx, iv.srcID, iv.host, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
		iv.record(clientChurner, opInput{kind: opOpenSession}, opOutput{outcome: mcpsync.OutcomeTransitioned, gen: sess.Generation}, call, err)
		if err == nil {
			iv.mu.Lock()
			iv.srcGen = max(iv.srcGen, sess.Generation)
			iv.mu.Unlock()
		}
	}
}

func (iv *interleaving) closeSession(gen int64) {
	call := iv.now()
	o, err := iv.st.CloseSession(iv.ctx, iv.srcID, gen, "shuffle")
	iv.record(clientChurner, opInput{kind: opCloseSession, sgen: gen}, opOutput{outcome: o}, call, err)
}

// keeper is the subscription workflow's lifecycle: it re-establishes the subscription on the
// newest session when a session change parked it, unsubscribes (begin, acknowledgement lost or
// not, complete — with retries), re-subscribes after CLOSED (a new generation), parks it for
// reconciliation and restores it from a pending tombstone. Its last step waits for the session
// churner to finish and then reacts to where the subscription stands, as the workflow reacts
// to SessionChanged, so slow answers often meet a subscription re-established on a newer
// session or generation.
func (iv *interleaving) keeper(rng *rand.Rand) {
	n := 2 + rng.IntN(3)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		if i == n-1 {
			iv.mu.Lock()
			for !iv.churnerDone {
				iv.cond.Wait()
			}
			iv.mu.Unlock()
		}
		sub, err := iv.st.SubscriptionByID(iv.ctx, iv.subID)
		iv.mu.Lock()
		iv.ops++
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				iv.errs = append(iv.errs, err)
			}
			iv.mu.Unlock()
			return
		}
		srcGen := iv.srcGen
		iv.mu.Unlock()
		gen, sgen := sub.Generation, sub.SessionGeneration
		switch sub.State {
		case mcpsync.StateDiscovered, mcpsync.StateReconciliationRequired:
			iv.establish(rng, gen, srcGen)
		case mcpsync.StateSubscribing:
			iv.establish(rng, gen, sgen)
		case mcpsync.StateTombstonePending:
			if k := rng.IntN(3); k == 0 {
				iv.confirmTombstone(sub)
			} else if k == 1 {
				iv.transition(clientKeeper, opInput{kind: opRestore, gen: gen, sgen: sgen}, func() (ledger.TransitionResult, error) {
					return iv.st.RestoreFromTombstone(iv.ctx, iv.subID, gen, sgen)
				})
			} else {
				iv.unsubscribe(rng, gen)
			}
		case mcpsync.StateActive:
			switch k := rng.IntN(10); {
			case k < 4:
				iv.unsubscribe(rng, gen)
			case k < 6:
				iv.transition(clientKeeper, opInput{kind: opMarkRR, gen: gen}, func() (ledger.TransitionResult, error) {
					return iv.st.MarkReconciliationRequired(iv.ctx, iv.subID, gen, "shuffle")
				})
				iv.establish(rng, gen, srcGen)
			default:
				// List reconciliation: once a not-found read was accepted (or no more reads
				// are coming), confirm the tombstone while other answers may still race.
				iv.mu.Lock()
				for !iv.tombstonePending && !iv.pulserDone {
					iv.cond.Wait()
				}
				iv.mu.Unlock()
				if now, err := iv.st.SubscriptionByID(iv.ctx, iv.subID); err == nil && now.State == mcpsync.StateTombstonePending {
					iv.confirmTombstone(now)
				} else if err != nil {
					iv.fail(err)
				}
			}
		case mcpsync.StateUnsubscribing, mcpsync.StateUnsubscribeUnknown:
			iv.finishUnsubscribe(rng, gen, sub.CloseEpoch)
		case mcpsync.StateClosed:
			call := iv.now()
			s, err := iv.st.EnsureSubscription(iv.ctx, ledger.EnsureSpec{Principal: "shuffle", SourceID: iv.srcID,
				URI: iv.uri, ServerURI: iv.uri, WorkflowID: sub.WorkflowID})
			var grant *ledger.GrantError
			if errors.As(err, &grant) || (err == nil && s.State == mcpsync.StateClosed) {
				// The ledger can also return the row still CLOSED without an error when the
				// grant comes back between its fenced reopen and its grant check.
				// Revoked: the ledger refuses to open a new generation (R23).
				iv.record(clientKeeper, opInput{kind: opEnsure}, opOutput{outcome: mcpsync.OutcomeRevoked}, call, nil)
				continue
			}
			iv.record(clientKeeper, opInput{kind: opEnsure}, opOutput{outcome: mcpsync.OutcomeTransitioned, gen: s.Generation}, call, err)
			if err == nil {
				iv.mu.Lock()
				iv.subGen, iv.subSgen = s.Generation, 0
				iv.mu.Unlock()
				iv.establish(rng, s.Generation, srcGen)
			}
		}
	}
}

// establish subscribes on session sgen and activates, as the workflow does after a session
// change; the pulser then dispatches on that binding.
func (iv *interleaving) establish(rng *rand.Rand, gen, sgen int64) {
	r := iv.transition(clientKeeper, opInput{kind: opBeginSubscribe, gen: gen, sgen: sgen}, func() (ledger.TransitionResult, error) {
		return iv.st.BeginSubscribe(iv.ctx, iv.subID, gen, sgen)
	})
	if !r.Outcome.OK() {
		return
	}
	activate := func() ledger.TransitionResult {
		return iv.transition(clientKeeper, opInput{kind: opActivate, gen: gen, sgen: sgen}, func() (ledger.TransitionResult, error) {
			return iv.st.Activate(iv.ctx, iv.subID, gen, sgen)
		})
	}
	r = activate()
	if rng.IntN(5) == 0 {
		activate() // the activity retried
	}
	if r.Outcome.OK() {
		iv.mu.Lock()
		iv.subGen, iv.subSgen = gen, sgen
		iv.mu.Unlock()
	}
}

// unsubscribe passes the close fence and finishes the close.
func (iv *interleaving) unsubscribe(rng *rand.Rand, gen int64) {
	begin := func() ledger.CloseResult {
		call := iv.now()
		cr, err := iv.st.BeginUnsubscribe(iv.ctx, iv.subID, gen, "shuffle")
		iv.record(clientKeeper, opInput{kind: opBeginUnsubscribe, gen: gen},
			opOutput{outcome: cr.Outcome, ord: cr.CloseOrdinal, epoch: cr.CloseEpoch}, call, err)
		return cr
	}
	cr := begin()
	if rng.IntN(4) == 0 {
		cr = begin() // the activity retried
	}
	if cr.Outcome != mcpsync.OutcomeTransitioned {
		return
	}
	iv.finishUnsubscribe(rng, gen, cr.CloseEpoch)
}

// finishUnsubscribe loses the acknowledgement or not, then completes the close, with retries.
func (iv *interleaving) finishUnsubscribe(rng *rand.Rand, gen, epoch int64) {
	if rng.IntN(3) == 0 {
		iv.transition(clientKeeper, opInput{kind: opUnknown, gen: gen, epoch: epoch}, func() (ledger.TransitionResult, error) {
			return iv.st.MarkUnsubscribeUnknown(iv.ctx, iv.subID, gen, epoch, "ack lost")
		})
		if rng.IntN(3) == 0 {
			return // stays UNSUBSCRIBE_UNKNOWN until a later step or a session change
		}
	}
	complete := func() {
		iv.transition(clientKeeper, opInput{kind: opComplete, gen: gen, epoch: epoch}, func() (ledger.TransitionResult, error) {
			return iv.st.CompleteUnsubscribe(iv.ctx, iv.subID, gen, epoch)
		})
	}
	complete()
	if rng.IntN(4) == 0 {
		complete() // the activity retried
	}
}

// confirmTombstone confirms the pending tombstone of sub as list reconciliation does: two
// complete rounds on the subscription's session that do not list its URI (and no template),
// published as a SNAPSHOT_UNPROVEN catalog, then ConfirmTombstone naming it. A session change
// before the catalog is published leaves no catalog, and nothing to confirm.
func (iv *interleaving) confirmTombstone(sub ledger.Subscription) {
	run := fmt.Sprintf("shuffle/%d/%d/%d", iv.subID, sub.Generation, sub.LastIssuedOrdinal)
	var basis []int64
	for round := 1; round <= 2; round++ {
		id, _, err := iv.st.BeginScan(iv.ctx, ledger.ScanStart{Key: fmt.Sprintf("%s/%d", run, round), Run: run, ScanWorkflowID: run,
			Round: round, SourceID: iv.srcID, SessionGeneration: sub.SessionGeneration, HostQueue: iv.host})
		if err == nil {
			other := "shuffle://other"
			_, err = iv.st.EndScan(iv.ctx, ledger.ScanEnd{ScanID: id, SetDigest: "sha256:" + other,
				Progress:              ledger.ScanProgress{ResourcePages: 1, TemplatePages: 1, Resources: 1},
				ResourceCursorDigests: []string{"c1"}},
				[]ledger.ScanEntry{{Kind: ledger.EntryResource, URI: other, ServerURI: other, Name: "other"}})
		}
		iv.mu.Lock()
		iv.ops++
		iv.mu.Unlock()
		if errors.Is(err, ledger.ErrStaleScan) {
			return // the session changed under the scan
		}
		if err != nil {
			iv.fail(fmt.Errorf("catalog round %d: %w", round, err))
			return
		}
		basis = append(basis, id)
	}
	c, err := iv.st.PublishCatalog(iv.ctx, ledger.PublishRequest{Key: run, ScanWorkflowID: run, SourceID: iv.srcID,
		SessionGeneration: sub.SessionGeneration, Level: ledger.ProofSnapshotUnproven, Reason: "shuffle", RoundsUsed: 2,
		BasisScanIDs: basis, Recheck: time.Minute})
	iv.mu.Lock()
	iv.ops++
	iv.mu.Unlock()
	if errors.Is(err, ledger.ErrProofRefused) {
		return // the session changed between the rounds
	}
	if err != nil {
		iv.fail(fmt.Errorf("publish catalog: %w", err))
		return
	}
	in := opInput{kind: opConfirmTombstone, gen: sub.Generation, sgen: sub.SessionGeneration, ord: sub.LastIssuedOrdinal}
	call := iv.now()
	r, err := iv.st.ConfirmTombstone(iv.ctx, ledger.ConfirmTombstoneRequest{SubscriptionID: iv.subID, Generation: sub.Generation, CatalogID: c.ID})
	iv.record(clientKeeper, in, opOutput{outcome: r.Outcome}, call, err)
	iv.mu.Lock()
	iv.counts.confirms++
	iv.mu.Unlock()
}

// revoker revokes the principal's grant while reads are in flight — once a dispatch is issued
// and not yet answered, if one comes before the pulser is done — and sometimes grants it again
// later. It notes the receipts committed before the revocation returned and before the grant
// was asked for: an acceptance between the two committed after the revocation (R23, R24).
func (iv *interleaving) revoker(rng *rand.Rand) {
	iv.mu.Lock()
	for len(iv.pending) == 0 && !iv.pulserDone {
		iv.cond.Wait()
	}
	inFlight := len(iv.pending) > 0
	iv.mu.Unlock()
	if iv.ctx.Err() != nil {
		return
	}
	if rng.IntN(4) == 0 {
		iv.grant() // a grant that already stands: nothing changes
	}
	call := iv.now()
	_, err := iv.st.Revoke(iv.ctx, ledger.RevokeRequest{Principal: "shuffle", SourceID: iv.srcID, Reason: "shuffle"})
	iv.record(clientRevoker, opInput{kind: opRevoke}, opOutput{outcome: mcpsync.OutcomeTransitioned}, call, err)
	if err != nil {
		return
	}
	w := revocationWindow{}
	if w.after, err = iv.lastReceipt(); err != nil {
		iv.fail(err)
		return
	}
	iv.mu.Lock()
	iv.counts.revocations++
	if inFlight {
		iv.counts.revocationsInFlight++
	}
	iv.mu.Unlock()
	if rng.IntN(2) == 0 {
		iv.mu.Lock()
		for len(iv.answered) < 2 && !iv.pulserDone {
			iv.cond.Wait()
		}
		iv.mu.Unlock()
		if w.before, err = iv.lastReceipt(); err != nil {
			iv.fail(err)
			return
		}
		iv.grant()
	}
	iv.mu.Lock()
	iv.revocations = append(iv.revocations, w)
	iv.mu.Unlock()
}

func (iv *interleaving) grant() {
	call := iv.now()
	_, _, err := iv.st.GrantAccess(iv.ctx, "shuffle", iv.srcID, "shuffle harness")
	iv.record(clientRevoker, opInput{kind: opGrant}, opOutput{outcome: mcpsync.OutcomeTransitioned}, call, err)
}

// lastReceipt is the newest receipt id committed now, in any subscription.
func (iv *interleaving) lastReceipt() (int64, error) {
	var id int64
	if err := iv.pool.QueryRow(iv.ctx, `SELECT coalesce(max(id), 0) FROM receipts`).Scan(&id); err != nil {
		return 0, fmt.Errorf("newest receipt: %w", err)
	}
	return id, nil
}
