package ledger

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// CloseResult is the outcome of BeginUnsubscribe: the frozen close ordinal and close epoch.
type CloseResult struct {
	Outcome           mcpsync.Outcome
	State             mcpsync.State // the subscription's state now
	CloseOrdinal      int64
	CloseEpoch        int64
	SessionGeneration int64
}

// closeKey, closedKey and unknownKey are the idempotency keys of the closing transitions:
// within one subscription generation there is exactly one close fence and one close epoch,
// so (subscription, generation[, epoch]) names the call.
func closeKey(id, gen int64) string { return fmt.Sprintf("close/%d/%d", id, gen) }
func closedKey(id, gen, epoch int64) string {
	return fmt.Sprintf("closed/%d/%d/%d", id, gen, epoch)
}
func unknownKey(id, gen, epoch int64) string {
	return fmt.Sprintf("unsubscribe-unknown/%d/%d/%d", id, gen, epoch)
}

// retryOnConflict runs once, and again (at most three times more) when the attempt rolled
// back because a concurrent call with the same idempotency key recorded its receipt first (the
// retry then reads that first outcome) or because Postgres broke a deadlock.
func retryOnConflict[T any](once func() (T, error)) (T, error) {
	for attempt := 0; ; attempt++ {
		v, err := once()
		if err != nil && isRetryable(err) && attempt < 3 {
			continue
		}
		return v, err
	}
}

// BeginUnsubscribe passes the close fence (R18): any non-closing state of generation gen moves
// to UNSUBSCRIBING, freezing closeOrdinal = lastIssuedOrdinal and raising the close epoch, and
// writes the CLOSE_FENCE receipt, in one statement. From then on no read ordinal is allocated
// and every late read or not-found only leaves a STALE_AFTER_CLOSE receipt (R19). The
// idempotency key is (subscription, generation): calling it again returns the first outcome
// with the fence it froze, and writes nothing. A refusal (OldGeneration, Refused) is recorded
// once under the same key, except for a generation the ledger never issued, which is refused
// without a record so that it cannot pre-empt that generation's real close.
func (s *Store) BeginUnsubscribe(ctx context.Context, id, gen int64, reason string) (CloseResult, error) {
	reason = SafeText(reason) // it may carry a server's words
	res, err := retryOnConflict(func() (CloseResult, error) { return s.beginUnsubscribeOnce(ctx, id, gen, reason) })
	if err != nil {
		return CloseResult{}, fmt.Errorf("ledger: begin unsubscribe %d: %w", id, err)
	}
	return res, nil
}

func (s *Store) beginUnsubscribeOnce(ctx context.Context, id, gen int64, reason string) (CloseResult, error) {
	key := closeKey(id, gen)
	var res CloseResult
	err := s.pool.QueryRow(ctx, `
		WITH t AS (
			UPDATE subscriptions s SET state = 'UNSUBSCRIBING', close_ordinal = last_issued_ordinal,
				close_epoch = close_epoch + 1, state_reason = $3, updated_at = now()
			WHERE s.id = $1 AND s.generation = $2
			  AND s.state IN ('DISCOVERED', 'SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING', 'RECONCILIATION_REQUIRED')
			  AND NOT EXISTS (SELECT 1 FROM receipts WHERE idem_key = $4)
			RETURNING s.id, s.source_id, s.generation, s.session_generation, s.uri, s.state,
			          s.close_ordinal, s.close_epoch, s.state_reason),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, uri, detail)
			SELECT $4, 'CLOSE_FENCE', source_id, id, generation, session_generation, close_ordinal, uri,
			       jsonb_build_object('outcome', 'TRANSITIONED', 'state', state, 'close_epoch', close_epoch,
			                          'reason', state_reason)
			FROM t
			RETURNING 1)
		SELECT state, close_ordinal, close_epoch, session_generation FROM t`, id, gen, reason, key).
		Scan(&res.State, &res.CloseOrdinal, &res.CloseEpoch, &res.SessionGeneration)
	if err == nil {
		res.Outcome = mcpsync.OutcomeTransitioned
		return res, nil
	}
	if err != pgx.ErrNoRows {
		return CloseResult{}, err
	}
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var curGen int64
		var closeOrd *int64
		if err := tx.QueryRow(ctx, `SELECT state, generation, close_ordinal, close_epoch, session_generation
			FROM subscriptions WHERE id = $1`, id).Scan(&res.State, &curGen, &closeOrd, &res.CloseEpoch, &res.SessionGeneration); err != nil {
			return notFound(err, fmt.Sprintf("subscription %d", id))
		}
		if closeOrd != nil {
			res.CloseOrdinal = *closeOrd
		}
		switch {
		case gen > curGen:
			// A generation the ledger never issued: recording it under its key would refuse
			// the real close of that generation later. It changes nothing; record nothing.
			res.Outcome = mcpsync.OutcomeRefused
			return nil
		case gen < curGen:
			res.Outcome = mcpsync.OutcomeOldGeneration
		case res.State.Closing():
			res.Outcome = mcpsync.OutcomeAlreadyDone // closed without this key (by an earlier ledger version)
		default:
			res.Outcome = mcpsync.OutcomeRefused
		}
		first, err := recordKeyed(ctx, tx, key, id, mcpsync.ReceiptCloseFence, res.Outcome, gen)
		if err != nil || first == nil {
			return err
		}
		// The first outcome stands: report the fence it froze.
		res.Outcome = first.outcome
		if first.outcome == mcpsync.OutcomeTransitioned {
			res.CloseOrdinal, res.CloseEpoch, res.SessionGeneration = first.ordinal, first.epoch, first.sessionGen
		}
		return nil
	})
	if err != nil {
		return CloseResult{}, err
	}
	return res, nil
}

// firstOutcome is what the receipt of an earlier call with the same key recorded.
type firstOutcome struct {
	outcome    mcpsync.Outcome
	ordinal    int64 // close ordinal, for a close fence
	epoch      int64 // close epoch, for a close fence
	sessionGen int64
}

// recordKeyed looks up the receipt of key. If there is one, it returns that first outcome and
// writes nothing. Otherwise it records outcome (a refusal or AlreadyDone of transition) under
// key and returns nil.
func recordKeyed(ctx context.Context, tx pgx.Tx, key string, id int64, transition mcpsync.ReceiptKind, outcome mcpsync.Outcome, gen int64) (*firstOutcome, error) {
	var f firstOutcome
	var ord, epoch, sgen *int64
	err := tx.QueryRow(ctx, `SELECT coalesce(detail->>'outcome', kind), read_ordinal,
			(detail->>'close_epoch')::bigint, session_generation
		FROM receipts WHERE idem_key = $1`, key).Scan(&f.outcome, &ord, &epoch, &sgen)
	if err == nil {
		if ord != nil {
			f.ordinal = *ord
		}
		if epoch != nil {
			f.epoch = *epoch
		}
		if sgen != nil {
			f.sessionGen = *sgen
		}
		return &f, nil
	}
	if err != pgx.ErrNoRows {
		return nil, err
	}
	// A concurrent first call inserting the same key makes this insert fail with a unique
	// violation; the caller retries and then finds that call's receipt above.
	_, err = tx.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
			session_generation, uri, detail)
		SELECT $2, $3, source_id, id, $4, session_generation, uri,
		       jsonb_build_object('outcome', $3::text, 'transition', $5::text, 'state', state,
		                          'current_generation', generation)
		FROM subscriptions WHERE id = $1`, id, key, string(outcome), gen, transition)
	return nil, err
}

// CompleteUnsubscribe records the server's unsubscribe acknowledgement (or that no server
// call was needed): UNSUBSCRIBING or UNSUBSCRIBE_UNKNOWN of the same close epoch moves to
// CLOSED, with its receipt, in one statement. Nothing leads from here back to ACTIVE (R20);
// cached content is kept (R10). The idempotency key is (subscription, generation, close
// epoch): calling it again returns the first outcome and writes nothing; a subscription that
// its session's end already closed answers AlreadyDone. A refusal is recorded under the key,
// except for a generation or epoch the ledger never issued.
func (s *Store) CompleteUnsubscribe(ctx context.Context, id, gen, closeEpoch int64) (TransitionResult, error) {
	return s.closingTransition(ctx, mcpsync.ReceiptClosed, closedKey(id, gen, closeEpoch), id, gen, closeEpoch, mcpsync.StateClosed, `
		UPDATE subscriptions s SET state = 'CLOSED', ended_at = now(), updated_at = now()
		WHERE s.id = $1 AND s.generation = $2 AND s.close_epoch = $3
		  AND s.state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN')
		  AND NOT EXISTS (SELECT 1 FROM receipts WHERE idem_key = $4)`)
}

// MarkUnsubscribeUnknown records a lost or timed-out unsubscribe acknowledgement (R20):
// UNSUBSCRIBING of the same close epoch moves to UNSUBSCRIBE_UNKNOWN, still silent locally;
// it leaves only by a later acknowledgement on the same session or when that session ends.
// The idempotency key is (subscription, generation, close epoch), as for CompleteUnsubscribe.
func (s *Store) MarkUnsubscribeUnknown(ctx context.Context, id, gen, closeEpoch int64, reason string) (TransitionResult, error) {
	return s.closingTransition(ctx, mcpsync.ReceiptUnsubscribeUnknown, unknownKey(id, gen, closeEpoch), id, gen, closeEpoch, mcpsync.StateUnsubscribeUnknown, `
		UPDATE subscriptions s SET state = 'UNSUBSCRIBE_UNKNOWN', state_reason = $5, updated_at = now()
		WHERE s.id = $1 AND s.generation = $2 AND s.close_epoch = $3 AND s.state = 'UNSUBSCRIBING'
		  AND NOT EXISTS (SELECT 1 FROM receipts WHERE idem_key = $4)`, SafeText(reason))
}

// closingTransition runs a keyed transition after the close fence: update (alias s; params
// $1 id, $2 generation, $3 close epoch, $4 key, then extra) and its receipt of kind in one
// statement; otherwise the first outcome recorded under key, or a refusal recorded under it.
func (s *Store) closingTransition(ctx context.Context, kind mcpsync.ReceiptKind, key string, id, gen, epoch int64, target mcpsync.State, update string, extra ...any) (TransitionResult, error) {
	args := append([]any{id, gen, epoch, key}, extra...)
	res, err := retryOnConflict(func() (TransitionResult, error) {
		var res TransitionResult
		err := s.pool.QueryRow(ctx, `WITH t AS (`+update+` `+transitionReturning+`),
			rc AS (
				INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation, session_generation, uri, detail)
				SELECT $4, '`+string(kind)+`', source_id, id, generation, session_generation, uri,
				       jsonb_build_object('outcome', 'TRANSITIONED', 'state', state, 'reason', state_reason,
				                          'close_epoch', $3::bigint)
				FROM t
				RETURNING 1)
			SELECT state, state_reason FROM t`, args...).Scan(&res.State, &res.Reason)
		if err == nil {
			res.Outcome = mcpsync.OutcomeTransitioned
			return res, nil
		}
		if err != pgx.ErrNoRows {
			return TransitionResult{}, err
		}
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			var curGen, curEpoch int64
			if err := tx.QueryRow(ctx, `SELECT state, state_reason, generation, close_epoch FROM subscriptions WHERE id = $1`, id).
				Scan(&res.State, &res.Reason, &curGen, &curEpoch); err != nil {
				return notFound(err, fmt.Sprintf("subscription %d", id))
			}
			switch {
			case gen > curGen || (gen == curGen && epoch > curEpoch):
				// A generation or close epoch the ledger never issued: recording it under
				// its key would refuse the real call later. It changes nothing; record
				// nothing.
				res.Outcome = mcpsync.OutcomeRefused
				return nil
			case gen < curGen:
				res.Outcome = mcpsync.OutcomeOldGeneration
			case epoch == curEpoch && res.State == target:
				res.Outcome = mcpsync.OutcomeAlreadyDone
			default:
				res.Outcome = mcpsync.OutcomeRefused
			}
			first, err := recordKeyed(ctx, tx, key, id, kind, res.Outcome, gen)
			if err == nil && first != nil {
				res.Outcome = first.outcome
			}
			return err
		})
		return res, err
	})
	if err != nil {
		return TransitionResult{}, fmt.Errorf("ledger: %s subscription %d: %w", strings.ToLower(string(kind)), id, err)
	}
	return res, nil
}
