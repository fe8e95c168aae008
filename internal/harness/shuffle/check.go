package shuffle

import (
	"context"
	"fmt"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
)

// Rows the checker reads back. Everything it decides comes from these, not from the harness's
// own bookkeeping; the harness only contributes the idempotency keys of the calls it made, to
// ask whether each left its receipt.
type (
	rReceipt struct {
		id        int64
		kind      mcpsync.ReceiptKind
		gen, sgen *int64
		ord       *int64
		req       *string
		digest    *string
		key       *string
		phase     *string
		outbox    *int64
		closeOrd  *int64 // TOMBSTONE_CONFIRMED: the close fence it froze
	}
	rVersion struct {
		id, ord, gen, sgen int64
		req, kind, digest  string
	}
	rDispatch struct {
		ord, gen, sgen int64
		req            string
		outcome        *string
	}
	rOutbox struct {
		id, ord int64
		digest  string
	}
	rSub struct {
		state       mcpsync.State
		gen, sgen   int64
		issued, wm  int64
		closeOrd    *int64
		closeEpoch  int64
		srcGen      int64
		sessionLive bool
		lastDigest  string
	}
)

// load reads the subscription's rows in one round trip.
func (iv *interleaving) load() (recs []rReceipt, vers []rVersion, disps []rDispatch, outbox []rOutbox, sub rSub, found map[string]int, err error) {
	b := &pgx.Batch{}
	b.Queue(`SELECT id, kind, generation, session_generation, read_ordinal, request_id, digest, idem_key,
			detail->>'phase', (detail->>'outbox')::bigint, (detail->>'close_ordinal')::bigint
		FROM receipts WHERE subscription_id = $1 ORDER BY id`, iv.subID).Query(func(rows pgx.Rows) error {
		var err error
		recs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (rReceipt, error) {
			var x rReceipt
			err := r.Scan(&x.id, &x.kind, &x.gen, &x.sgen, &x.ord, &x.req, &x.digest, &x.key, &x.phase, &x.outbox, &x.closeOrd)
			return x, err
		})
		return err
	})
	b.Queue(`SELECT id, read_ordinal, generation, session_generation, request_id, kind, coalesce(digest, '')
		FROM resource_versions WHERE subscription_id = $1 ORDER BY id`, iv.subID).Query(func(rows pgx.Rows) error {
		var err error
		vers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (rVersion, error) {
			var x rVersion
			err := r.Scan(&x.id, &x.ord, &x.gen, &x.sgen, &x.req, &x.kind, &x.digest)
			return x, err
		})
		return err
	})
	b.Queue(`SELECT ordinal, generation, session_generation, request_id, outcome
		FROM read_dispatches WHERE subscription_id = $1 ORDER BY ordinal`, iv.subID).Query(func(rows pgx.Rows) error {
		var err error
		disps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (rDispatch, error) {
			var x rDispatch
			err := r.Scan(&x.ord, &x.gen, &x.sgen, &x.req, &x.outcome)
			return x, err
		})
		return err
	})
	b.Queue(`SELECT id, coalesce(read_ordinal, 0), coalesce(digest, '')
		FROM invalidation_outbox WHERE subscription_id = $1 ORDER BY id`, iv.subID).Query(func(rows pgx.Rows) error {
		var err error
		outbox, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (rOutbox, error) {
			var x rOutbox
			err := r.Scan(&x.id, &x.ord, &x.digest)
			return x, err
		})
		return err
	})
	b.Queue(`SELECT s.state, s.generation, s.session_generation, s.last_issued_ordinal, s.last_accepted_ordinal,
			s.close_ordinal, s.close_epoch, so.current_generation,
			EXISTS (SELECT 1 FROM sessions se WHERE se.source_id = so.id AND se.generation = s.session_generation
			        AND se.generation = so.current_generation AND se.ended_at IS NULL),
			coalesce(s.last_accepted_digest, '')
		FROM subscriptions s JOIN sources so ON so.id = s.source_id WHERE s.id = $1`, iv.subID).QueryRow(func(row pgx.Row) error {
		return row.Scan(&sub.state, &sub.gen, &sub.sgen, &sub.issued, &sub.wm, &sub.closeOrd, &sub.closeEpoch,
			&sub.srcGen, &sub.sessionLive, &sub.lastDigest)
	})
	iv.mu.Lock()
	keys := append([]string(nil), iv.keys...)
	iv.mu.Unlock()
	found = map[string]int{}
	b.Queue(`SELECT k, (SELECT count(*) FROM receipts WHERE idem_key = k) FROM unnest($1::text[]) k`, keys).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var k string
			var n int
			if err := rows.Scan(&k, &n); err != nil {
				return err
			}
			found[k] = n
		}
		return rows.Err()
	})
	if err := iv.pool.SendBatch(iv.ctx, b).Close(); err != nil {
		return nil, nil, nil, nil, rSub{}, nil, fmt.Errorf("check subscription %d: %w", iv.subID, err)
	}
	return recs, vers, disps, outbox, sub, found, nil
}

func i64(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// check reads the subscription's rows and checks every invariant against them.
func (iv *interleaving) check() ([]Violation, error) {
	recs, vers, disps, outbox, sub, found, err := iv.load()
	if err != nil {
		return nil, err
	}
	var out []Violation
	bad := func(kind, format string, args ...any) {
		out = append(out, iv.violation(kind, fmt.Sprintf(format, args...)))
	}

	// Replay the subscription's history from its lock-ordered receipts: every state change and
	// every acceptance writes its receipt while it holds the subscription row, so receipt ids
	// order them as they committed. Refusal receipts are written afterwards, without the row,
	// and carry no state.
	type fence struct{ receiptID, ord int64 }
	fences := map[int64]fence{} // subscription generation -> its close fence
	var (
		state               mcpsync.State
		gen, sgen           int64
		issued, wm          int64
		lastAcceptReceiptID int64
		tombstoneFence      int64               // the TOMBSTONE_CONFIRMED receipt whose CLOSE_FENCE receipt is still to come
		acceptedAt          = map[int64]int64{} // ordinal -> receipt id of its acceptance
		outboxReceipt       = map[int64]int64{} // outbox id -> receipt id of the acceptance that wrote it
	)
	for _, r := range recs {
		rg, rs, ro := i64(r.gen), i64(r.sgen), i64(r.ord)
		switch r.kind {
		case mcpsync.ReceiptSubscriptionOpened:
			if rg <= gen {
				bad(kindStateMismatch, "subscription opened again with generation %d after %d (receipt %d)", rg, gen, r.id)
			}
			state, gen, sgen = mcpsync.StateDiscovered, rg, 0
		case mcpsync.ReceiptSubscribing:
			state, sgen = mcpsync.StateSubscribing, rs
		case mcpsync.ReceiptActivated, mcpsync.ReceiptTombstoneCleared:
			if rg != gen || rs != sgen {
				bad(kindStateMismatch, "%s for generation %d session %d while bound to %d/%d (receipt %d)", r.kind, rg, rs, gen, sgen, r.id)
			}
			state = mcpsync.StateActive
		case mcpsync.ReceiptReconciliationRequired, mcpsync.ReceiptSessionChanged:
			state = mcpsync.StateReconciliationRequired
		case mcpsync.ReceiptCloseFence:
			if f, ok := fences[rg]; ok && tombstoneFence == f.receiptID && state == mcpsync.StateUnsubscribing && ro == f.ord {
				tombstoneFence = 0 // the close fence ConfirmTombstone writes with its confirmation
				continue
			}
			if state.Closing() || rg != gen {
				bad(kindStateMismatch, "close fence of generation %d from %s generation %d (receipt %d)", rg, state, gen, r.id)
			}
			state = mcpsync.StateUnsubscribing
			fences[rg] = fence{receiptID: r.id, ord: ro}
			if ro != issued {
				bad(kindStateMismatch, "close ordinal %d, but %d ordinals were issued (receipt %d)", ro, issued, r.id)
			}
		case mcpsync.ReceiptTombstoneConfirmed:
			// List reconciliation confirmed the deletion: the tombstone version and its
			// invalidation are written together with a close fence (ConfirmTombstone).
			if state != mcpsync.StateTombstonePending || rg != gen {
				bad(kindLateTombstone, "tombstone confirmed from %s generation %d (receipt %d)", state, rg, r.id)
			}
			state = mcpsync.StateUnsubscribing
			fences[rg] = fence{receiptID: r.id, ord: i64(r.closeOrd)}
			tombstoneFence = r.id
			if r.outbox != nil {
				outboxReceipt[*r.outbox] = r.id
			}
		case mcpsync.ReceiptUnsubscribeUnknown:
			state = mcpsync.StateUnsubscribeUnknown
		case mcpsync.ReceiptClosed, mcpsync.ReceiptClosedWithSession:
			state = mcpsync.StateClosed
		case mcpsync.ReceiptKind(mcpsync.OutcomeAllocated):
			if state != mcpsync.StateActive || rg != gen || rs != sgen {
				bad(kindAllocationAfter, "ordinal %d issued while %s (generation %d/%d, session %d/%d, receipt %d)", ro, state, rg, gen, rs, sgen, r.id)
			}
			if ro != issued+1 {
				bad(kindStateMismatch, "ordinal %d issued after %d (receipt %d)", ro, issued, r.id)
			}
			issued = max(issued, ro)
		case mcpsync.ReceiptKind(mcpsync.OutcomeAccepted), mcpsync.ReceiptKind(mcpsync.OutcomeRevalidated), mcpsync.ReceiptKind(mcpsync.OutcomeTombstonePending):
			if str(r.key) == "" {
				continue // not an acceptance: none of these kinds is written without its key
			}
			kind := kindNonActive
			if r.kind == mcpsync.ReceiptKind(mcpsync.OutcomeTombstonePending) {
				kind = kindLateTombstone
			}
			if f, ok := fences[rg]; ok && r.id > f.receiptID {
				bad(kind, "%s of ordinal %d after the close fence of generation %d (receipts %d > %d)", r.kind, ro, rg, r.id, f.receiptID)
			} else if state != mcpsync.StateActive {
				bad(kind, "%s of ordinal %d while %s (receipt %d)", r.kind, ro, state, r.id)
			}
			if rg < gen {
				bad(kindOldGeneration, "%s of ordinal %d from generation %d while the subscription is in %d (receipt %d)", r.kind, ro, rg, gen, r.id)
			}
			if rs < sgen {
				bad(kindOldSession, "%s of ordinal %d from session %d while the subscription is bound to %d (receipt %d)", r.kind, ro, rs, sgen, r.id)
			}
			if ro <= wm {
				bad(kindRegression, "%s of ordinal %d at or below the watermark %d (receipt %d after %d)", r.kind, ro, wm, r.id, lastAcceptReceiptID)
			}
			wm, lastAcceptReceiptID = max(wm, ro), r.id
			if r.kind == mcpsync.ReceiptKind(mcpsync.OutcomeTombstonePending) {
				state = mcpsync.StateTombstonePending
			}
			if _, twice := acceptedAt[ro]; twice {
				bad(kindReceiptDuplicated, "ordinal %d accepted twice (receipt %d)", ro, r.id)
			}
			acceptedAt[ro] = r.id
			if r.outbox != nil {
				outboxReceipt[*r.outbox] = r.id
			}
		}
	}
	// Revocation (R23, R24): no acceptance commits after a revocation committed, until the
	// grant is asked for again. The windows come from receipt ids the harness read right after
	// Revoke returned and right before GrantAccess was called.
	iv.mu.Lock()
	windows := append([]revocationWindow(nil), iv.revocations...)
	iv.mu.Unlock()
	for _, r := range recs {
		switch r.kind {
		case mcpsync.ReceiptKind(mcpsync.OutcomeAccepted), mcpsync.ReceiptKind(mcpsync.OutcomeRevalidated), mcpsync.ReceiptKind(mcpsync.OutcomeTombstonePending):
		default:
			continue
		}
		if str(r.key) == "" {
			continue
		}
		for _, w := range windows {
			if r.id > w.after && (w.before == 0 || r.id <= w.before) {
				bad(kindAfterRevocation, "%s of ordinal %d committed after the revocation (receipt %d > %d, grant asked again after %d)", r.kind, i64(r.ord), r.id, w.after, w.before)
			}
		}
	}
	closeOrd := func(g int64) (int64, int64, bool) {
		f, ok := fences[g]
		return f.ord, f.receiptID, ok
	}

	// The final row must be where its history left it; anything else is a change without a
	// receipt.
	if sub.state != state || sub.gen != gen || sub.sgen != sgen || sub.issued != issued || sub.wm != wm {
		bad(kindStateMismatch, "row is %s g%d s%d issued %d watermark %d, receipts say %s g%d s%d issued %d watermark %d",
			sub.state, sub.gen, sub.sgen, sub.issued, sub.wm, state, gen, sgen, issued, wm)
	}
	if f, ok := fences[sub.gen]; ok && (sub.closeOrd == nil || *sub.closeOrd != f.ord) {
		bad(kindStateMismatch, "close ordinal of the row %v, its fence receipt froze %d", sub.closeOrd, f.ord)
	}
	switch sub.state {
	case mcpsync.StateActive, mcpsync.StateSubscribing, mcpsync.StateTombstonePending:
		if !sub.sessionLive {
			bad(kindStaleBinding, "%s on session %d, but the source's live session is %d", sub.state, sub.sgen, sub.srcGen)
		}
	}

	// Versions, in the order they were written: strictly rising ordinals, each one acceptance
	// with its receipt, none past the close fence of its generation.
	dispatchOf := map[int64]rDispatch{}
	for _, d := range disps {
		dispatchOf[d.ord] = d
	}
	var prev int64
	for _, v := range vers {
		if v.ord <= prev {
			bad(kindRegression, "version of ordinal %d written after version of ordinal %d", v.ord, prev)
		}
		prev = max(prev, v.ord)
		rid, ok := acceptedAt[v.ord]
		if !ok {
			bad(kindReceiptMissing, "version of ordinal %d has no ACCEPTED receipt", v.ord)
		}
		if co, fid, ok2 := closeOrd(v.gen); ok2 && (v.ord > co || (ok && rid > fid)) {
			bad(kindVersionAfterClose, "version of ordinal %d, generation %d: close ordinal %d, fence receipt %d, acceptance receipt %d", v.ord, v.gen, co, fid, rid)
		}
		if d, ok := dispatchOf[v.ord]; !ok || d.gen != v.gen || d.sgen != v.sgen || d.req != v.req {
			bad(kindOldSession, "version of ordinal %d (g%d s%d %s) does not match its dispatch %+v", v.ord, v.gen, v.sgen, v.req, d)
		}
	}
	for _, o := range outbox {
		d := dispatchOf[o.ord]
		rid, ok := outboxReceipt[o.id]
		if !ok {
			bad(kindReceiptMissing, "outbox row %d (ordinal %d) has no acceptance receipt", o.id, o.ord)
		}
		if co, fid, ok2 := closeOrd(d.gen); ok2 && (o.ord > co || (ok && rid > fid)) {
			bad(kindOutboxAfterClose, "outbox row %d of ordinal %d, generation %d: close ordinal %d, fence receipt %d, acceptance receipt %d", o.id, o.ord, d.gen, co, fid, rid)
		}
	}

	// Dispatches: ordinals 1..issued, each with its ALLOCATED receipt, none past a close fence.
	allocated := map[int64]bool{}
	for _, r := range recs {
		if r.kind == mcpsync.ReceiptKind(mcpsync.OutcomeAllocated) {
			allocated[i64(r.ord)] = true
		}
	}
	for i, d := range disps {
		if d.ord != int64(i+1) {
			bad(kindStateMismatch, "dispatch ordinals have a gap or repeat at %d", d.ord)
		}
		if !allocated[d.ord] {
			bad(kindReceiptMissing, "dispatch of ordinal %d has no ALLOCATED receipt", d.ord)
		}
		if co, _, ok := closeOrd(d.gen); ok && d.ord > co {
			bad(kindAllocationAfter, "ordinal %d issued in generation %d past its close ordinal %d", d.ord, d.gen, co)
		}
	}

	// Receipts: every call the harness made left exactly one receipt under its key, and no
	// response has two receipts.
	for k, n := range found {
		if n != 1 {
			bad(kindReceiptMissing, "call %s left %d receipts under its key, want 1", k, n)
		}
	}
	type response struct {
		phase, req, digest string
		ord                int64
	}
	seen := map[response]int64{}
	for _, r := range recs {
		if r.req == nil || r.ord == nil && str(r.phase) == "" {
			continue
		}
		phase := str(r.phase)
		if phase == "" {
			phase = string(r.kind)
			if r.kind == mcpsync.ReceiptKind(mcpsync.OutcomeAccepted) || r.kind == mcpsync.ReceiptKind(mcpsync.OutcomeRevalidated) {
				phase = "accept"
			} else if r.kind == mcpsync.ReceiptKind(mcpsync.OutcomeTombstonePending) {
				phase = "not_found"
			}
		}
		k := response{phase: phase, req: str(r.req), digest: str(r.digest), ord: i64(r.ord)}
		if phase == "allocate" || phase == string(mcpsync.OutcomeAllocated) {
			k = response{phase: "allocate", req: str(r.req)}
		}
		if first, dup := seen[k]; dup {
			bad(kindReceiptDuplicated, "receipts %d and %d record the same response %+v", first, r.id, k)
			continue
		}
		seen[k] = r.id
	}
	return out, nil
}

// CheckSubscription runs the checker's table checks on one subscription of the ledger in
// pool, as they run after every interleaving: its receipts, versions, dispatches, outbox rows
// and final row are replayed against the state machine. It knows no calls of its own, so the
// per-call receipt check is empty. The release gate's self-test uses it on subscriptions whose
// fences it broke on purpose, to prove each check fires; violations are returned with the
// Report counter name as Kind.
func CheckSubscription(ctx context.Context, pool *pgxpool.Pool, subscriptionID int64) ([]Violation, error) {
	iv := &interleaving{ctx: ctx, pool: pool, subID: subscriptionID}
	return iv.check()
}

// RegressionHistoryLinearizable feeds porcupine, with the model the shuffles use, a history in
// which a read answered after a newer read was accepted was accepted too (ordinals 1 and 2
// allocated, 2 accepted, then 1 accepted, each call finished before the next began). A
// correct model finds no linearization and it returns false; true means the linearizability
// check cannot see a version regression.
func RegressionHistoryLinearizable() bool {
	ops := []struct {
		in  opInput
		out opOutput
	}{
		{opInput{kind: opAllocate, gen: 1, sgen: 1, req: "a"}, opOutput{outcome: mcpsync.OutcomeAllocated, ord: 1}},
		{opInput{kind: opAllocate, gen: 1, sgen: 1, req: "b"}, opOutput{outcome: mcpsync.OutcomeAllocated, ord: 2}},
		{opInput{kind: opAccept, gen: 1, sgen: 1, ord: 2, req: "b", digest: "sha256:new"}, opOutput{outcome: mcpsync.OutcomeAccepted}},
		{opInput{kind: opAccept, gen: 1, sgen: 1, ord: 1, req: "a", digest: "sha256:old"}, opOutput{outcome: mcpsync.OutcomeAccepted}},
	}
	var history []porcupine.Operation
	for i, op := range ops {
		history = append(history, porcupine.Operation{ClientId: clientPulser, Input: op.in, Output: op.out,
			Call: int64(2 * i), Return: int64(2*i + 1)})
	}
	return porcupine.CheckOperations(model(), history)
}
