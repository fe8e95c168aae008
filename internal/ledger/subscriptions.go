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
// DISCOVERED with generation 1. A CLOSED subscription is opened again under the next
// subscription generation, so every read of the earlier generation stays fenced (R12); its
// watermark is kept, so no earlier read can ever be accepted (R30). A subscription that is
// not CLOSED is returned unchanged.
func (s *Store) EnsureSubscription(ctx context.Context, spec EnsureSpec) (Subscription, error) {
	if spec.Principal == "" || spec.URI == "" || spec.ServerURI == "" || spec.WorkflowID == "" {
		return Subscription{}, fmt.Errorf("ledger: ensure subscription %+v: %w", spec, ErrInvalid)
	}
	var id int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			INSERT INTO subscriptions (principal, source_id, uri, server_uri, workflow_id)
			VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (principal, source_id, uri) DO UPDATE SET
				generation = subscriptions.generation + 1,
				state = 'DISCOVERED', state_reason = 'subscribed again after close',
				session_generation = 0, close_ordinal = NULL, server_uri = EXCLUDED.server_uri,
				started_at = now(), ended_at = NULL, updated_at = now()
			WHERE subscriptions.state = 'CLOSED'
			RETURNING id`, spec.Principal, spec.SourceID, spec.URI, spec.ServerURI, spec.WorkflowID).Scan(&id)
		if err == pgx.ErrNoRows {
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
// afterwards.
type TransitionResult struct {
	Outcome Outcome
	State   State
	Reason  string
}

// transition runs one guarded UPDATE (the whole fence is in its WHERE clause) and a receipt.
// When no row matched, it reports the current state: AlreadyDone when the subscription
// already sits in target (same generation and, where given, session generation), Refused
// otherwise.
func (s *Store) transition(ctx context.Context, kind string, id, gen int64, target State, update string, args ...any) (TransitionResult, error) {
	var res TransitionResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var st State
		var reason string
		err := tx.QueryRow(ctx, update, args...).Scan(&st, &reason)
		if err == nil {
			res = TransitionResult{Outcome: Transitioned, State: st, Reason: reason}
			_, err = tx.Exec(ctx, `INSERT INTO receipts (kind, source_id, subscription_id, generation, session_generation, uri, detail)
				SELECT $2, source_id, id, generation, session_generation, uri, jsonb_build_object('state', state, 'reason', state_reason)
				FROM subscriptions WHERE id = $1`, id, kind)
			return err
		}
		if err != pgx.ErrNoRows {
			return err
		}
		var curGen int64
		if err := tx.QueryRow(ctx, `SELECT state, state_reason, generation FROM subscriptions WHERE id = $1`, id).Scan(&st, &reason, &curGen); err != nil {
			return notFound(err, fmt.Sprintf("subscription %d", id))
		}
		res = TransitionResult{Outcome: Refused, State: st, Reason: reason}
		if curGen == gen && st == target {
			res.Outcome = AlreadyDone
		}
		return nil
	})
	if err != nil {
		return TransitionResult{}, fmt.Errorf("ledger: %s subscription %d: %w", strings.ToLower(kind), id, err)
	}
	return res, nil
}

// BeginSubscribe moves DISCOVERED or RECONCILIATION_REQUIRED to SUBSCRIBING on session
// generation sessionGen, which must be the source's current, live session (R12).
func (s *Store) BeginSubscribe(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, "SUBSCRIBING", id, gen, StateSubscribing, `
		UPDATE subscriptions s SET state = 'SUBSCRIBING', session_generation = $3,
			state_reason = '', updated_at = now()
		FROM sources so JOIN sessions se ON se.source_id = so.id AND se.generation = so.current_generation
		WHERE s.id = $1 AND s.generation = $2 AND so.id = s.source_id
		  AND s.state IN ('DISCOVERED', 'RECONCILIATION_REQUIRED', 'SUBSCRIBING')
		  AND so.current_generation = $3 AND se.ended_at IS NULL AND s.session_generation <= $3
		RETURNING s.state, s.state_reason`, id, gen, sessionGen)
}

// Activate moves SUBSCRIBING to ACTIVE once the server acknowledged the subscribe (or the
// server lacks resources.subscribe and we poll, R11), only on the same, still current session.
func (s *Store) Activate(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, "ACTIVATED", id, gen, StateActive, `
		UPDATE subscriptions s SET state = 'ACTIVE', state_reason = '', updated_at = now()
		FROM sources so JOIN sessions se ON se.source_id = so.id AND se.generation = so.current_generation
		WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3 AND so.id = s.source_id
		  AND s.state = 'SUBSCRIBING' AND so.current_generation = $3 AND se.ended_at IS NULL
		RETURNING s.state, s.state_reason`, id, gen, sessionGen)
}

// MarkReconciliationRequired parks a live subscription whose identity or session is in doubt
// (a failed subscribe, an unclassified read failure) in RECONCILIATION_REQUIRED with reason.
// Closing states are never touched.
func (s *Store) MarkReconciliationRequired(ctx context.Context, id, gen int64, reason string) (TransitionResult, error) {
	return s.transition(ctx, "RECONCILIATION_REQUIRED", id, gen, StateReconciliationRequired, `
		UPDATE subscriptions SET state = 'RECONCILIATION_REQUIRED', state_reason = $3, updated_at = now()
		WHERE id = $1 AND generation = $2
		  AND state IN ('DISCOVERED', 'SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING')
		RETURNING state, state_reason`, id, gen, reason)
}

// RestoreFromTombstone moves TOMBSTONE_PENDING back to ACTIVE when list reconciliation found
// the resource present again on the same session (R21); the caller then re-reads it.
func (s *Store) RestoreFromTombstone(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, "TOMBSTONE_CLEARED", id, gen, StateActive, `
		UPDATE subscriptions s SET state = 'ACTIVE', state_reason = 'resource present again', updated_at = now()
		FROM sources so
		WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3 AND so.id = s.source_id
		  AND so.current_generation = $3 AND s.state = 'TOMBSTONE_PENDING'
		RETURNING s.state, s.state_reason`, id, gen, sessionGen)
}

// CloseResult is the outcome of BeginUnsubscribe: the frozen close ordinal and close epoch.
type CloseResult struct {
	Outcome           Outcome
	State             State
	CloseOrdinal      int64
	CloseEpoch        int64
	SessionGeneration int64
}

// BeginUnsubscribe passes the close fence (R18): any non-closing state of generation gen moves
// to UNSUBSCRIBING, freezing closeOrdinal = lastIssuedOrdinal and raising the close epoch, in
// one statement. From then on no read ordinal is allocated and every late read or not-found
// only leaves a STALE_AFTER_CLOSE receipt (R19). Calling it again for the same generation
// returns the already frozen fence with AlreadyDone.
func (s *Store) BeginUnsubscribe(ctx context.Context, id, gen int64, reason string) (CloseResult, error) {
	var res CloseResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `
			UPDATE subscriptions SET state = 'UNSUBSCRIBING', close_ordinal = last_issued_ordinal,
				close_epoch = close_epoch + 1, state_reason = $3, updated_at = now()
			WHERE id = $1 AND generation = $2
			  AND state IN ('DISCOVERED', 'SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING', 'RECONCILIATION_REQUIRED')
			RETURNING state, close_ordinal, close_epoch, session_generation`, id, gen, reason).
			Scan(&res.State, &res.CloseOrdinal, &res.CloseEpoch, &res.SessionGeneration)
		if err == nil {
			res.Outcome = Transitioned
			_, err = tx.Exec(ctx, `INSERT INTO receipts (kind, source_id, subscription_id, generation, session_generation, read_ordinal, uri, detail)
				SELECT 'CLOSE_FENCE', source_id, id, generation, session_generation, close_ordinal, uri,
				       jsonb_build_object('close_epoch', close_epoch, 'reason', state_reason)
				FROM subscriptions WHERE id = $1`, id)
			return err
		}
		if err != pgx.ErrNoRows {
			return err
		}
		var curGen int64
		var closeOrd *int64
		if err := tx.QueryRow(ctx, `SELECT state, generation, close_ordinal, close_epoch, session_generation
			FROM subscriptions WHERE id = $1`, id).Scan(&res.State, &curGen, &closeOrd, &res.CloseEpoch, &res.SessionGeneration); err != nil {
			return notFound(err, fmt.Sprintf("subscription %d", id))
		}
		if closeOrd != nil {
			res.CloseOrdinal = *closeOrd
		}
		res.Outcome = Refused
		if curGen == gen && res.State.Closing() {
			res.Outcome = AlreadyDone
		}
		return nil
	})
	if err != nil {
		return CloseResult{}, fmt.Errorf("ledger: begin unsubscribe %d: %w", id, err)
	}
	return res, nil
}

// CompleteUnsubscribe records the server's unsubscribe acknowledgement (or that no server
// call was needed): UNSUBSCRIBING or UNSUBSCRIBE_UNKNOWN of the same close epoch moves to
// CLOSED. Nothing leads from here back to ACTIVE (R20); cached content is kept (R10).
func (s *Store) CompleteUnsubscribe(ctx context.Context, id, gen, closeEpoch int64) (TransitionResult, error) {
	return s.transition(ctx, "CLOSED", id, gen, StateClosed, `
		UPDATE subscriptions SET state = 'CLOSED', ended_at = now(), updated_at = now()
		WHERE id = $1 AND generation = $2 AND close_epoch = $3
		  AND state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN')
		RETURNING state, state_reason`, id, gen, closeEpoch)
}

// MarkUnsubscribeUnknown records a lost or timed-out unsubscribe acknowledgement (R20):
// UNSUBSCRIBING of the same close epoch moves to UNSUBSCRIBE_UNKNOWN, still silent locally;
// it leaves only by a later acknowledgement on the same session or when that session ends.
func (s *Store) MarkUnsubscribeUnknown(ctx context.Context, id, gen, closeEpoch int64, reason string) (TransitionResult, error) {
	return s.transition(ctx, "UNSUBSCRIBE_UNKNOWN", id, gen, StateUnsubscribeUnknown, `
		UPDATE subscriptions SET state = 'UNSUBSCRIBE_UNKNOWN', state_reason = $4, updated_at = now()
		WHERE id = $1 AND generation = $2 AND close_epoch = $3 AND state = 'UNSUBSCRIBING'
		RETURNING state, state_reason`, id, gen, closeEpoch, reason)
}
