package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Subscription is a resourceSubscription.v1 row (R9) with its fence columns.
type Subscription struct {
	ID                     int64
	Principal              string
	SourceID               int64
	SourceName             string
	URI                    string // normalized URI: the identity
	ServerURI              string // the server's own string, sent back in reads
	WorkflowID             string
	State                  State
	StateReason            string
	Generation             int64
	SessionGeneration      int64
	LastIssuedOrdinal      int64
	LastAcceptedOrdinal    int64
	LastAcceptedDigest     string
	LastAcceptedAt         *time.Time
	LastVerifiedAt         *time.Time
	LastNotificationGen    int64
	LastNotificationSeq    int64
	CloseOrdinal           *int64
	CloseEpoch             int64
	StartedAt              time.Time
	EndedAt                *time.Time
	UpdatedAt              time.Time
	PreviousAcceptedDigest string
}

const subscriptionColumns = `s.id, s.principal, s.source_id, so.name, s.uri, s.server_uri,
	s.workflow_id, s.state, s.state_reason, s.generation, s.session_generation,
	s.last_issued_ordinal, s.last_accepted_ordinal, coalesce(s.last_accepted_digest, ''),
	s.last_accepted_at, s.last_verified_at, s.last_notification_gen, s.last_notification_seq,
	s.close_ordinal, s.close_epoch, s.started_at, s.ended_at, s.updated_at,
	coalesce(s.previous_accepted_digest, '')`

func scanSubscription(row pgx.Row) (Subscription, error) {
	var x Subscription
	err := row.Scan(&x.ID, &x.Principal, &x.SourceID, &x.SourceName, &x.URI, &x.ServerURI,
		&x.WorkflowID, &x.State, &x.StateReason, &x.Generation, &x.SessionGeneration,
		&x.LastIssuedOrdinal, &x.LastAcceptedOrdinal, &x.LastAcceptedDigest, &x.LastAcceptedAt,
		&x.LastVerifiedAt, &x.LastNotificationGen, &x.LastNotificationSeq, &x.CloseOrdinal,
		&x.CloseEpoch, &x.StartedAt, &x.EndedAt, &x.UpdatedAt, &x.PreviousAcceptedDigest)
	return x, err
}

// EnsureSpec identifies a subscription: principal, source and normalized URI, plus the
// server's own URI string and the workflow that owns the subscription.
type EnsureSpec struct {
	Principal  string
	SourceID   int64
	URI        string // normalized
	ServerURI  string // as the server spells it
	WorkflowID string
}

// EnsureSubscription returns the subscription for (principal, source, URI), creating it in
// DISCOVERED with generation 1, only while the principal holds a standing grant on the source
// (a *GrantError matching ErrNoGrant otherwise). A CLOSED subscription is opened again under the next
// subscription generation, so every read of the earlier generation stays fenced (R12); its
// watermark is kept, so no earlier read can ever be accepted (R30). A subscription that is
// not CLOSED is returned unchanged.
func (s *Store) EnsureSubscription(ctx context.Context, spec EnsureSpec) (Subscription, error) {
	if spec.Principal == "" || spec.URI == "" || spec.ServerURI == "" || spec.WorkflowID == "" {
		return Subscription{}, fmt.Errorf("ledger: ensure subscription %+v: %w", spec, ErrInvalid)
	}
	var id int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		// The standing grant is locked FOR SHARE in the same statement, so a revocation either
		// waits for this subscription (and then closes it) or commits first (and this one is
		// refused): no subscription opens past a revocation.
		err := tx.QueryRow(ctx, `
			WITH g AS MATERIALIZED (
				SELECT 1 FROM grants WHERE principal = $1 AND source_id = $2 AND revoked_at IS NULL FOR SHARE)
			INSERT INTO subscriptions (principal, source_id, uri, server_uri, workflow_id)
			SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM g)
			ON CONFLICT (principal, source_id, uri) DO UPDATE SET
				generation = subscriptions.generation + 1,
				state = 'DISCOVERED', state_reason = 'subscribed again after close',
				session_generation = 0, close_ordinal = NULL, server_uri = EXCLUDED.server_uri,
				started_at = now(), ended_at = NULL, updated_at = now()
			WHERE subscriptions.state = 'CLOSED'
			RETURNING id`, spec.Principal, spec.SourceID, spec.URI, spec.ServerURI, spec.WorkflowID).Scan(&id)
		if err == pgx.ErrNoRows {
			var granted bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM grants WHERE principal = $1 AND source_id = $2 AND revoked_at IS NULL)`,
				spec.Principal, spec.SourceID).Scan(&granted); err != nil {
				return err
			}
			if !granted {
				return &GrantError{Principal: spec.Principal, SourceID: spec.SourceID}
			}
			return tx.QueryRow(ctx, `SELECT id FROM subscriptions WHERE principal = $1 AND source_id = $2 AND uri = $3`,
				spec.Principal, spec.SourceID, spec.URI).Scan(&id)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO receipts (kind, source_id, subscription_id, generation, uri)
			SELECT 'SUBSCRIPTION_OPENED', source_id, id, generation, uri FROM subscriptions WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return Subscription{}, fmt.Errorf("ledger: ensure subscription: %w", err)
	}
	return s.SubscriptionByID(ctx, id)
}

// SubscriptionByID returns one subscription, or ErrNotFound.
func (s *Store) SubscriptionByID(ctx context.Context, id int64) (Subscription, error) {
	x, err := scanSubscription(s.pool.QueryRow(ctx, `SELECT `+subscriptionColumns+`
		FROM subscriptions s JOIN sources so ON so.id = s.source_id WHERE s.id = $1`, id))
	if err != nil {
		return Subscription{}, notFound(err, fmt.Sprintf("ledger: subscription %d", id))
	}
	return x, nil
}

// SubscriptionByKey returns the subscription of (principal, source name, normalized URI), or
// ErrNotFound.
func (s *Store) SubscriptionByKey(ctx context.Context, principal, source, uri string) (Subscription, error) {
	x, err := scanSubscription(s.pool.QueryRow(ctx, `SELECT `+subscriptionColumns+`
		FROM subscriptions s JOIN sources so ON so.id = s.source_id
		WHERE s.principal = $1 AND so.name = $2 AND s.uri = $3`, principal, source, uri))
	if err != nil {
		return Subscription{}, notFound(err, fmt.Sprintf("ledger: subscription %s %s %s", principal, source, uri))
	}
	return x, nil
}

// SubscriptionFilter narrows ListSubscriptions; zero fields match everything.
type SubscriptionFilter struct {
	Source    string
	URI       string // normalized
	Principal string
	States    []State
}

// ListSubscriptions returns the subscriptions matching f, ordered by source, URI, principal.
func (s *Store) ListSubscriptions(ctx context.Context, f SubscriptionFilter) ([]Subscription, error) {
	var where []string
	var args []any
	add := func(cond string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(cond, len(args)))
	}
	if f.Source != "" {
		add("so.name = $%d", f.Source)
	}
	if f.URI != "" {
		add("s.uri = $%d", f.URI)
	}
	if f.Principal != "" {
		add("s.principal = $%d", f.Principal)
	}
	if len(f.States) > 0 {
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		add("s.state = ANY($%d)", states)
	}
	q := `SELECT ` + subscriptionColumns + ` FROM subscriptions s JOIN sources so ON so.id = s.source_id`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY so.name, s.uri, s.principal"
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("ledger: list subscriptions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Subscription, error) { return scanSubscription(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: list subscriptions: %w", err)
	}
	return out, nil
}

// TransitionResult is the outcome of a state transition and the state the subscription is in
// now.
type TransitionResult struct {
	Outcome Outcome
	State   State
	Reason  string
}

// transitionReturning is what every transition's UPDATE returns, for its receipt.
const transitionReturning = `RETURNING s.id, s.source_id, s.generation, s.session_generation, s.uri, s.state, s.state_reason`

// transition runs one guarded UPDATE of subscriptions (alias s; the whole fence is in its
// WHERE clause, optionally helped by the CTEs in with) and writes its receipt of kind in the
// same statement. When no row matched, it labels the refusal from the current row, recording
// nothing: OldGeneration or OldSession when the call carries an older subscription or session
// generation (R12), AlreadyDone when the subscription already sits in target in the same
// generation (and session generation, when sessionGen > 0), Refused otherwise.
func (s *Store) transition(ctx context.Context, kind string, id, gen, sessionGen int64, target State, with, update string, args ...any) (TransitionResult, error) {
	var res TransitionResult
	q := `WITH ` + with + ` t AS (` + update + ` ` + transitionReturning + `),
		rc AS (
			INSERT INTO receipts (kind, source_id, subscription_id, generation, session_generation, uri, detail)
			SELECT '` + kind + `', source_id, id, generation, session_generation, uri,
			       jsonb_build_object('outcome', 'TRANSITIONED', 'state', state, 'reason', state_reason)
			FROM t
			RETURNING 1)
		SELECT state, state_reason FROM t`
	err := s.pool.QueryRow(ctx, q, args...).Scan(&res.State, &res.Reason)
	if err == nil {
		res.Outcome = Transitioned
		return res, nil
	}
	if err != pgx.ErrNoRows {
		return TransitionResult{}, fmt.Errorf("ledger: %s subscription %d: %w", strings.ToLower(kind), id, err)
	}
	var curGen, curSgen, current int64
	err = s.pool.QueryRow(ctx, `SELECT s.state, s.state_reason, s.generation, s.session_generation, so.current_generation
		FROM subscriptions s JOIN sources so ON so.id = s.source_id WHERE s.id = $1`, id).
		Scan(&res.State, &res.Reason, &curGen, &curSgen, &current)
	if err != nil {
		return TransitionResult{}, notFound(err, fmt.Sprintf("ledger: %s subscription %d", strings.ToLower(kind), id))
	}
	switch {
	case gen < curGen:
		res.Outcome = OldGeneration
	case gen > curGen:
		res.Outcome = Refused
	case sessionGen > 0 && sessionGen < current:
		res.Outcome = OldSession
	case res.State == target && (sessionGen == 0 || sessionGen == curSgen):
		res.Outcome = AlreadyDone
	default:
		res.Outcome = Refused
	}
	return res, nil
}

// liveSession locks the row of session generation $3 of the subscription's ($1) source, only
// while that session is live. Every transition that binds a subscription to a session (or
// makes it ACTIVE on one) joins it, so OpenSession and EndSession, which end that very row,
// serialize with it: either the transition commits first and their fence then moves the
// subscription off the old session, or they commit first and the transition finds no live
// session (R12).
const liveSession = `live AS (
		SELECT se.source_id FROM sessions se
		WHERE se.source_id = (SELECT source_id FROM subscriptions WHERE id = $1)
		  AND se.generation = $3 AND se.ended_at IS NULL
		FOR SHARE),`

// BeginSubscribe moves DISCOVERED or RECONCILIATION_REQUIRED to SUBSCRIBING on session
// generation sessionGen, which must be the source's current, live session (R12). Calling it
// again on the same session while SUBSCRIBING returns AlreadyDone and writes nothing; a call
// on an older session is OldSession, on an older subscription generation OldGeneration.
func (s *Store) BeginSubscribe(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, "SUBSCRIBING", id, gen, sessionGen, StateSubscribing, liveSession, `
		UPDATE subscriptions s SET state = 'SUBSCRIBING', session_generation = $3,
			state_reason = '', updated_at = now()
		FROM live
		WHERE s.id = $1 AND s.generation = $2 AND s.source_id = live.source_id
		  AND (s.state IN ('DISCOVERED', 'RECONCILIATION_REQUIRED')
		       OR (s.state = 'SUBSCRIBING' AND s.session_generation < $3))
		  AND s.session_generation <= $3`, id, gen, sessionGen)
}

// Activate moves SUBSCRIBING to ACTIVE once the server acknowledged the subscribe (or the
// server lacks resources.subscribe and we poll, R11), only on the same, still current and
// live session. A repeated call returns AlreadyDone.
func (s *Store) Activate(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, "ACTIVATED", id, gen, sessionGen, StateActive, liveSession, `
		UPDATE subscriptions s SET state = 'ACTIVE', state_reason = '', updated_at = now()
		FROM live
		WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3
		  AND s.source_id = live.source_id AND s.state = 'SUBSCRIBING'`, id, gen, sessionGen)
}

// MarkReconciliationRequired parks a live subscription whose identity or session is in doubt
// (a failed subscribe, an unclassified read failure) in RECONCILIATION_REQUIRED with reason.
// Closing states are never touched.
func (s *Store) MarkReconciliationRequired(ctx context.Context, id, gen int64, reason string) (TransitionResult, error) {
	return s.transition(ctx, "RECONCILIATION_REQUIRED", id, gen, 0, StateReconciliationRequired, "", `
		UPDATE subscriptions s SET state = 'RECONCILIATION_REQUIRED', state_reason = $3, updated_at = now()
		WHERE s.id = $1 AND s.generation = $2
		  AND s.state IN ('DISCOVERED', 'SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING')`, id, gen, reason)
}

// RestoreFromTombstone moves TOMBSTONE_PENDING back to ACTIVE when list reconciliation found
// the resource present again on the same, still live session (R21); the caller then re-reads
// it.
func (s *Store) RestoreFromTombstone(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, "TOMBSTONE_CLEARED", id, gen, sessionGen, StateActive, liveSession, `
		UPDATE subscriptions s SET state = 'ACTIVE', state_reason = 'resource present again', updated_at = now()
		FROM live
		WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3
		  AND s.source_id = live.source_id AND s.state = 'TOMBSTONE_PENDING'`, id, gen, sessionGen)
}

// CloseResult is the outcome of BeginUnsubscribe: the frozen close ordinal and close epoch.
type CloseResult struct {
	Outcome           Outcome
	State             State // the subscription's state now
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
		res.Outcome = Transitioned
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
			res.Outcome = Refused
			return nil
		case gen < curGen:
			res.Outcome = OldGeneration
		case res.State.Closing():
			res.Outcome = AlreadyDone // closed without this key (by an earlier ledger version)
		default:
			res.Outcome = Refused
		}
		first, err := recordKeyed(ctx, tx, key, id, "CLOSE_FENCE", res.Outcome, gen)
		if err != nil || first == nil {
			return err
		}
		// The first outcome stands: report the fence it froze.
		res.Outcome = first.outcome
		if first.outcome == Transitioned {
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
	outcome    Outcome
	ordinal    int64 // close ordinal, for a close fence
	epoch      int64 // close epoch, for a close fence
	sessionGen int64
}

// recordKeyed looks up the receipt of key. If there is one, it returns that first outcome and
// writes nothing. Otherwise it records outcome (a refusal or AlreadyDone of transition) under
// key and returns nil.
func recordKeyed(ctx context.Context, tx pgx.Tx, key string, id int64, transition string, outcome Outcome, gen int64) (*firstOutcome, error) {
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
	return s.closingTransition(ctx, "CLOSED", closedKey(id, gen, closeEpoch), id, gen, closeEpoch, StateClosed, `
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
	return s.closingTransition(ctx, "UNSUBSCRIBE_UNKNOWN", unknownKey(id, gen, closeEpoch), id, gen, closeEpoch, StateUnsubscribeUnknown, `
		UPDATE subscriptions s SET state = 'UNSUBSCRIBE_UNKNOWN', state_reason = $5, updated_at = now()
		WHERE s.id = $1 AND s.generation = $2 AND s.close_epoch = $3 AND s.state = 'UNSUBSCRIBING'
		  AND NOT EXISTS (SELECT 1 FROM receipts WHERE idem_key = $4)`, reason)
}

// closingTransition runs a keyed transition after the close fence: update (alias s; params
// $1 id, $2 generation, $3 close epoch, $4 key, then extra) and its receipt of kind in one
// statement; otherwise the first outcome recorded under key, or a refusal recorded under it.
func (s *Store) closingTransition(ctx context.Context, kind, key string, id, gen, epoch int64, target State, update string, extra ...any) (TransitionResult, error) {
	args := append([]any{id, gen, epoch, key}, extra...)
	res, err := retryOnConflict(func() (TransitionResult, error) {
		var res TransitionResult
		err := s.pool.QueryRow(ctx, `WITH t AS (`+update+` `+transitionReturning+`),
			rc AS (
				INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation, session_generation, uri, detail)
				SELECT $4, '`+kind+`', source_id, id, generation, session_generation, uri,
				       jsonb_build_object('outcome', 'TRANSITIONED', 'state', state, 'reason', state_reason,
				                          'close_epoch', $3::bigint)
				FROM t
				RETURNING 1)
			SELECT state, state_reason FROM t`, args...).Scan(&res.State, &res.Reason)
		if err == nil {
			res.Outcome = Transitioned
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
				res.Outcome = Refused
				return nil
			case gen < curGen:
				res.Outcome = OldGeneration
			case epoch == curEpoch && res.State == target:
				res.Outcome = AlreadyDone
			default:
				res.Outcome = Refused
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
		return TransitionResult{}, fmt.Errorf("ledger: %s subscription %d: %w", strings.ToLower(kind), id, err)
	}
	return res, nil
}
