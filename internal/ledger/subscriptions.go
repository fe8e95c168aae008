package ledger

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
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
	State                  mcpsync.State
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
	// NotAcknowledged: the server left the URI out of its subscriptions/listen
	// acknowledgement on SessionGeneration, so it is polled (issue 13 item 3).
	NotAcknowledged bool
}

const subscriptionColumns = `s.id, s.principal, s.source_id, so.name, s.uri, s.server_uri,
	s.workflow_id, s.state, s.state_reason, s.generation, s.session_generation,
	s.last_issued_ordinal, s.last_accepted_ordinal, coalesce(s.last_accepted_digest, ''),
	s.last_accepted_at, s.last_verified_at, s.last_notification_gen, s.last_notification_seq,
	s.close_ordinal, s.close_epoch, s.started_at, s.ended_at, s.updated_at,
	coalesce(s.previous_accepted_digest, ''), s.not_acknowledged`

func scanSubscription(row pgx.Row) (Subscription, error) {
	var x Subscription
	err := row.Scan(&x.ID, &x.Principal, &x.SourceID, &x.SourceName, &x.URI, &x.ServerURI,
		&x.WorkflowID, &x.State, &x.StateReason, &x.Generation, &x.SessionGeneration,
		&x.LastIssuedOrdinal, &x.LastAcceptedOrdinal, &x.LastAcceptedDigest, &x.LastAcceptedAt,
		&x.LastVerifiedAt, &x.LastNotificationGen, &x.LastNotificationSeq, &x.CloseOrdinal,
		&x.CloseEpoch, &x.StartedAt, &x.EndedAt, &x.UpdatedAt, &x.PreviousAcceptedDigest, &x.NotAcknowledged)
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
// watermark is kept, so no earlier read can ever be accepted (R30), and its accepted digest is
// cleared, so the new generation's first good read is a new version with its invalidation even
// when the bytes are those accepted before (R21). A subscription that is not CLOSED is
// returned unchanged.
func (s *Store) EnsureSubscription(ctx context.Context, spec EnsureSpec) (Subscription, error) {
	if spec.Principal == "" || spec.URI == "" || spec.ServerURI == "" || spec.WorkflowID == "" {
		return Subscription{}, fmt.Errorf("ledger: ensure subscription %+v: %w", spec, ErrInvalid)
	}
	var sub Subscription
	// The common case, a subscription opened or reopened, is the upsert alone: one statement in
	// its own transaction, one round trip (issue 16: a start's ledger round trips). Anything
	// else — a row found open, no grant, a removed source, a failed statement — takes the
	// transaction below from the start, which decides it as before.
	if opened, err := upsertSubscription(ctx, s.pool, spec, &sub); err == nil && opened {
		return sub, nil
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		// The upsert either opens (or reopens) the subscription or finds it open. A grant
		// committed between the upsert and the look-up below makes the look-up see a CLOSED
		// row the upsert skipped for want of a grant: run the upsert again (a new statement, a
		// new snapshot, so it now sees the grant), never return a CLOSED row as opened.
		for attempt := 0; ; attempt++ {
			opened, closed, err := ensureSubscriptionOnce(ctx, tx, spec, &sub)
			if err != nil || opened {
				return err
			}
			if !closed {
				// The open row found, read in this transaction: one transaction per start.
				sub, err = subscriptionByID(ctx, tx, sub.ID)
				return err
			}
			if attempt == 2 {
				return fmt.Errorf("subscription of %q on source %d stayed CLOSED while its grant changed under three attempts", spec.Principal, spec.SourceID)
			}
		}
	})
	if err != nil {
		return Subscription{}, fmt.Errorf("ledger: ensure subscription: %w", err)
	}
	return sub, nil
}

// rowQuerier runs a query expected to return one row: the pool, or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// subscriptionWhere reads the one subscription, with its source's name, that cond (over s, the
// subscription, and so, its source) selects through q, or ErrNotFound naming it as what.
func subscriptionWhere(ctx context.Context, q rowQuerier, what, cond string, args ...any) (Subscription, error) {
	x, err := scanSubscription(q.QueryRow(ctx, `SELECT `+subscriptionColumns+`
		FROM subscriptions s JOIN sources so ON so.id = s.source_id WHERE `+cond, args...))
	if err != nil {
		return Subscription{}, notFound(err, "ledger: subscription "+what)
	}
	return x, nil
}

// subscriptionByID reads one subscription with its source's name through q, or ErrNotFound.
func subscriptionByID(ctx context.Context, q rowQuerier, id int64) (Subscription, error) {
	return subscriptionWhere(ctx, q, fmt.Sprint(id), `s.id = $1`, id)
}

// SubscriptionByID returns one subscription, or ErrNotFound.
func (s *Store) SubscriptionByID(ctx context.Context, id int64) (Subscription, error) {
	return subscriptionByID(ctx, s.pool, id)
}

// SubscriptionByKey returns the subscription of (principal, source name, normalized URI), or
// ErrNotFound.
func (s *Store) SubscriptionByKey(ctx context.Context, principal, source, uri string) (Subscription, error) {
	return subscriptionWhere(ctx, s.pool, fmt.Sprintf("%s %s %s", principal, source, uri),
		`s.principal = $1 AND so.name = $2 AND s.uri = $3`, principal, source, uri)
}

// SubscriptionOf returns the subscription of (principal, source ID, normalized URI) in any
// state, or ErrNotFound.
func (s *Store) SubscriptionOf(ctx context.Context, principal string, sourceID int64, uri string) (Subscription, error) {
	return subscriptionWhere(ctx, s.pool, fmt.Sprintf("%s %d %s", principal, sourceID, uri),
		`s.principal = $1 AND s.source_id = $2 AND s.uri = $3`, principal, sourceID, uri)
}

// SubscriptionFilter narrows ListSubscriptions; zero fields match everything.
type SubscriptionFilter struct {
	Source    string
	URI       string // normalized
	Principal string
	States    []mcpsync.State
	// URIs, when not nil, keeps only subscriptions to one of these normalized URIs (an empty,
	// non-nil slice matches nothing): a bulk subscribe follows the few it is waiting for
	// without reading every subscription of the source each time (issue 16 item 4).
	URIs []string
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
	if f.URIs != nil {
		add("s.uri = ANY($%d)", f.URIs)
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
	Outcome mcpsync.Outcome
	State   mcpsync.State
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
func (s *Store) transition(ctx context.Context, kind mcpsync.ReceiptKind, id, gen, sessionGen int64, target mcpsync.State, with, update string, args ...any) (TransitionResult, error) {
	var res TransitionResult
	q := `WITH ` + with + ` t AS (` + update + ` ` + transitionReturning + `),
		rc AS (
			INSERT INTO receipts (kind, source_id, subscription_id, generation, session_generation, uri, detail)
			SELECT '` + string(kind) + `', source_id, id, generation, session_generation, uri,
			       jsonb_build_object('outcome', 'TRANSITIONED', 'state', state, 'reason', state_reason)
			FROM t
			RETURNING 1)
		SELECT state, state_reason FROM t`
	err := s.pool.QueryRow(ctx, q, args...).Scan(&res.State, &res.Reason)
	if err == nil {
		res.Outcome = mcpsync.OutcomeTransitioned
		return res, nil
	}
	if err != pgx.ErrNoRows {
		return TransitionResult{}, fmt.Errorf("ledger: %s subscription %d: %w", strings.ToLower(string(kind)), id, err)
	}
	var curGen, curSgen, current int64
	err = s.pool.QueryRow(ctx, `SELECT s.state, s.state_reason, s.generation, s.session_generation, so.current_generation
		FROM subscriptions s JOIN sources so ON so.id = s.source_id WHERE s.id = $1`, id).
		Scan(&res.State, &res.Reason, &curGen, &curSgen, &current)
	if err != nil {
		return TransitionResult{}, notFound(err, fmt.Sprintf("ledger: %s subscription %d", strings.ToLower(string(kind)), id))
	}
	switch {
	case gen < curGen:
		res.Outcome = mcpsync.OutcomeOldGeneration
	case gen > curGen:
		res.Outcome = mcpsync.OutcomeRefused
	case sessionGen > 0 && sessionGen < current:
		res.Outcome = mcpsync.OutcomeOldSession
	case res.State == target && (sessionGen == 0 || sessionGen == curSgen):
		res.Outcome = mcpsync.OutcomeAlreadyDone
	default:
		res.Outcome = mcpsync.OutcomeRefused
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
	return s.transition(ctx, mcpsync.ReceiptSubscribing, id, gen, sessionGen, mcpsync.StateSubscribing, liveSession, `
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
	return s.ActivateWatch(ctx, id, gen, sessionGen, false)
}

// ActivateWatch is Activate recording whether the server left the URI out of its
// subscriptions/listen acknowledgement on this session (issue 13 item 3): such a
// subscription is not watched and polls (R11); status shows it as polling.
func (s *Store) ActivateWatch(ctx context.Context, id, gen, sessionGen int64, notAcknowledged bool) (TransitionResult, error) {
	return s.transition(ctx, mcpsync.ReceiptActivated, id, gen, sessionGen, mcpsync.StateActive, liveSession, `
		UPDATE subscriptions s SET state = 'ACTIVE', state_reason = '', not_acknowledged = $4, updated_at = now()
		FROM live
		WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3
		  AND s.source_id = live.source_id AND s.state = 'SUBSCRIBING'`, id, gen, sessionGen, notAcknowledged)
}

// MarkReconciliationRequired parks a live subscription whose identity or session is in doubt
// (a failed subscribe, an unclassified read failure) in RECONCILIATION_REQUIRED with reason.
// Closing states are never touched.
func (s *Store) MarkReconciliationRequired(ctx context.Context, id, gen int64, reason string) (TransitionResult, error) {
	return s.transition(ctx, mcpsync.ReceiptReconciliationRequired, id, gen, 0, mcpsync.StateReconciliationRequired, "", `
		UPDATE subscriptions s SET state = 'RECONCILIATION_REQUIRED', state_reason = $3, updated_at = now()
		WHERE s.id = $1 AND s.generation = $2
		  AND s.state IN ('DISCOVERED', 'SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING')`, id, gen, SafeText(reason))
}

// RestoreFromTombstone moves TOMBSTONE_PENDING back to ACTIVE when list reconciliation found
// the resource present again on the same, still live session (R21); the caller then re-reads
// it.
func (s *Store) RestoreFromTombstone(ctx context.Context, id, gen, sessionGen int64) (TransitionResult, error) {
	return s.transition(ctx, mcpsync.ReceiptTombstoneCleared, id, gen, sessionGen, mcpsync.StateActive, liveSession, `
		UPDATE subscriptions s SET state = 'ACTIVE', state_reason = 'resource present again', updated_at = now()
		FROM live
		WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3
		  AND s.source_id = live.source_id AND s.state = 'TOMBSTONE_PENDING'`, id, gen, sessionGen)
}

// testHookEnsureLookup, if set (tests only), runs between EnsureSubscription's upsert and its
// look-up of an existing row.
var testHookEnsureLookup func()

// ensureSubscriptionOnce runs EnsureSubscription's upsert once. opened reports a new or
// reopened subscription: its receipt is written by the same statement and *sub is the row as
// the statement left it. Otherwise sub.ID is the existing row and closed reports that it is
// CLOSED although a grant now stands (the caller upserts again).
func ensureSubscriptionOnce(ctx context.Context, tx pgx.Tx, spec EnsureSpec, sub *Subscription) (opened, closed bool, err error) {
	if opened, err = upsertSubscription(ctx, tx, spec, sub); err != nil || opened {
		return opened, false, err
	}
	if testHookEnsureLookup != nil {
		testHookEnsureLookup()
	}
	// One statement: whether a grant stands, and the existing row with its state.
	var granted, removed bool
	var state string
	err = tx.QueryRow(ctx, `
		SELECT EXISTS (SELECT 1 FROM grants WHERE principal = $1 AND source_id = $2 AND revoked_at IS NULL),
			coalesce((SELECT id FROM subscriptions WHERE principal = $1 AND source_id = $2 AND uri = $3), 0),
			coalesce((SELECT state FROM subscriptions WHERE principal = $1 AND source_id = $2 AND uri = $3), ''),
			EXISTS (SELECT 1 FROM sources WHERE id = $2 AND removed_at IS NOT NULL)`,
		spec.Principal, spec.SourceID, spec.URI).Scan(&granted, &sub.ID, &state, &removed)
	switch {
	case err != nil:
		return false, false, err
	case !granted:
		return false, false, &GrantError{Principal: spec.Principal, SourceID: spec.SourceID}
	case removed && (sub.ID == 0 || state == string(mcpsync.StateClosed)):
		// Nothing opens on a removed source; one open already is found (its removal
		// closes it).
		return false, false, fmt.Errorf("source %d: %w", spec.SourceID, ErrSourceRemoved)
	case sub.ID == 0:
		// Granted, but no row: the grant committed after the upsert's snapshot and the
		// row does not exist yet. Upsert again.
		return false, true, nil
	}
	return false, state == string(mcpsync.StateClosed), nil
}

// upsertSubscription opens the subscription of spec (a new row, or a CLOSED one under the next
// generation) with its receipt, in one statement through q, and reports whether it did; *sub
// is then the row as the statement left it. It opens nothing (false, nil) when the row is open
// already, the principal holds no standing grant or the source is removed.
func upsertSubscription(ctx context.Context, q rowQuerier, spec EnsureSpec, sub *Subscription) (bool, error) {
	// The standing grant is locked FOR SHARE in the same statement, so a revocation either
	// waits for this subscription (and then closes it) or commits first (and this one is
	// refused): no subscription opens past a revocation.
	x, err := scanSubscription(q.QueryRow(ctx, `
		WITH g AS MATERIALIZED (
			SELECT 1 FROM grants WHERE principal = $1 AND source_id = $2 AND revoked_at IS NULL FOR SHARE),
		-- A source being removed holds its row FOR UPDATE: this waits for it and then sees
		-- removed_at, or RemoveSource waits for this and then lists the subscription (issue 14).
		so AS MATERIALIZED (SELECT 1 FROM sources WHERE id = $2 AND removed_at IS NULL FOR KEY SHARE),
		s AS (
			INSERT INTO subscriptions (principal, source_id, uri, server_uri, workflow_id)
			SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM g) AND EXISTS (SELECT 1 FROM so)
			ON CONFLICT (principal, source_id, uri) DO UPDATE SET
				generation = subscriptions.generation + 1,
				state = 'DISCOVERED', state_reason = 'subscribed again after close',
				session_generation = 0, close_ordinal = NULL, server_uri = EXCLUDED.server_uri,
				last_accepted_digest = NULL,
				started_at = now(), ended_at = NULL, updated_at = now()
			WHERE subscriptions.state = 'CLOSED'
			RETURNING *),
		r AS (
			INSERT INTO receipts (kind, source_id, subscription_id, generation, uri)
			SELECT 'SUBSCRIPTION_OPENED', source_id, id, generation, uri FROM s)
		SELECT `+subscriptionColumns+` FROM s JOIN sources so ON so.id = s.source_id`,
		spec.Principal, spec.SourceID, spec.URI, spec.ServerURI, spec.WorkflowID))
	switch {
	case err == nil:
		*sub = x
		return true, nil
	case err == pgx.ErrNoRows:
		return false, nil
	}
	return false, err
}
