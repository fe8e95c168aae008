// Package ledger is mcpsync's single source of truth and its only fence. Every transition that
// SPEC.md guards by compare-and-set is one SQL statement (or one transaction) whose WHERE clause
// carries the whole condition: state, subscription generation, session generation and ordinal.
// Callers branch on the typed Outcome each call returns.
//
// Receipts and replays. Every call that has an idempotency key — AllocateReadOrdinal (the
// request ID), AcceptResourceVersion (ordinal, request ID, digest), RecordNotFound (ordinal,
// request ID), BeginUnsubscribe (generation), CompleteUnsubscribe and MarkUnsubscribeUnknown
// (generation, close epoch) — records exactly one receipt under that key, whatever its outcome,
// and replaying it returns that first outcome and writes nothing (Temporal retries
// activities). The other transitions (BeginSubscribe, Activate, MarkReconciliationRequired,
// RestoreFromTombstone, CloseSession) record a receipt when they change state; a repeat finds
// the state already changed and answers AlreadyDone, and a refusal changes and records nothing.
//
// Receipts that record a change are written while the statement holds the subscription row, so
// their ids order a subscription's history as it committed (internal/harness/shuffle replays that
// history to check the fences). Refusal receipts carry no state and need no order.
package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is the Postgres-backed ledger. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool. The schema must already be applied (dbschema.Apply).
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool returns the underlying connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Errors callers branch on with errors.Is.
var (
	// ErrNotFound: the named source, subscription, session or version does not exist.
	ErrNotFound = errors.New("ledger: not found")
	// ErrSourceExists: a source with that name exists with a different definition.
	ErrSourceExists = errors.New("ledger: source already exists with a different definition")
	// ErrNoSession: the source has no live session.
	ErrNoSession = errors.New("ledger: source has no live session")
	// ErrLeaseLost: the host no longer holds the source's lease.
	ErrLeaseLost = errors.New("ledger: host does not hold the source lease")
	// ErrInvalid: the request is malformed (empty name, unknown reason, ...).
	ErrInvalid = errors.New("ledger: invalid request")
)

// Outcome is the typed result of a guarded transition. Refusals are outcomes, not errors: an
// error means the ledger could not decide (connection lost, malformed request).
type Outcome string

// Outcomes of guarded transitions.
const (
	// Allocated: a read ordinal was issued (R14).
	Allocated Outcome = "ALLOCATED"
	// Accepted: the watermark rose, a resourceVersion.v1 and an outbox row were written (R16).
	Accepted Outcome = "ACCEPTED"
	// Revalidated: the watermark rose and the read confirmed the digest already accepted; no
	// new version and no invalidation are written (R17 single-flight revalidation).
	Revalidated Outcome = "REVALIDATED"
	// Stale: a read whose ordinal is not above the watermark (R17), or that reached a
	// subscription no longer ACTIVE for a reason other than close.
	Stale Outcome = "STALE"
	// StaleAfterClose: content or not-found after the close fence: audit only (R19).
	StaleAfterClose Outcome = "STALE_AFTER_CLOSE"
	// OldSession: the request carries a session generation older than the subscription's (R12).
	OldSession Outcome = "OLD_SESSION"
	// OldGeneration: the request carries an older subscription generation (R12).
	OldGeneration Outcome = "OLD_GENERATION"
	// NotDispatched: no dispatch with this subscription, ordinal, request ID, generation,
	// session generation and URI was ever issued.
	NotDispatched Outcome = "NOT_DISPATCHED"
	// Duplicate: a second, different response to a dispatch that already has its outcome.
	Duplicate Outcome = "DUPLICATE"
	// NotActive: the subscription is not ACTIVE, so no read ordinal is issued (R18).
	NotActive Outcome = "NOT_ACTIVE"
	// TombstonePending: a not-found read on an ACTIVE subscription passed the ordinal fence (R21).
	TombstonePending Outcome = "TOMBSTONE_PENDING"
	// Transitioned: the state change was applied.
	Transitioned Outcome = "TRANSITIONED"
	// AlreadyDone: the state change had already been applied by an identical earlier call.
	AlreadyDone Outcome = "ALREADY_DONE"
	// Refused: the state change is not allowed from the current state.
	Refused Outcome = "REFUSED"
)

// OK reports whether the outcome changed (or had already changed) ledger state as asked.
func (o Outcome) OK() bool {
	switch o {
	case Allocated, Accepted, Revalidated, TombstonePending, Transitioned, AlreadyDone:
		return true
	}
	return false
}

// State is a subscription state as the ledger stores it. The transient workflow states
// UPDATE_SEEN, READ_PENDING and VERSION_ACCEPTED are ACTIVE here: the fence only needs to know
// whether reads may still be accepted.
type State string

// Ledger states.
const (
	StateDiscovered             State = "DISCOVERED"
	StateSubscribing            State = "SUBSCRIBING"
	StateActive                 State = "ACTIVE"
	StateTombstonePending       State = "TOMBSTONE_PENDING"
	StateUnsubscribing          State = "UNSUBSCRIBING"
	StateUnsubscribeUnknown     State = "UNSUBSCRIBE_UNKNOWN"
	StateClosed                 State = "CLOSED"
	StateReconciliationRequired State = "RECONCILIATION_REQUIRED"
)

// Closing reports whether the close fence has been passed (R18, R19).
func (s State) Closing() bool {
	return s == StateUnsubscribing || s == StateUnsubscribeUnknown || s == StateClosed
}

// ReadReason is why a read was dispatched (R14).
type ReadReason string

// Read reasons.
const (
	ReasonNotification  ReadReason = "notification"
	ReasonBackstop      ReadReason = "backstop"
	ReasonPoll          ReadReason = "poll"
	ReasonSessionChange ReadReason = "session_change"
	ReasonInitial       ReadReason = "initial"
	ReasonRevalidate    ReadReason = "revalidate"
	ReasonReconcile     ReadReason = "reconcile"
)

// Valid reports whether r is one of the known reasons.
func (r ReadReason) Valid() bool {
	switch r {
	case ReasonNotification, ReasonBackstop, ReasonPoll, ReasonSessionChange, ReasonInitial, ReasonRevalidate, ReasonReconcile:
		return true
	}
	return false
}

// isRetryable reports whether a statement rolled back in a way a retry resolves: a unique
// violation (a concurrent call with the same key won), a deadlock or a serialization failure.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "23505", "40P01", "40001":
		return true
	}
	return false
}

func notFound(err error, what string) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// inTx runs fn in a READ COMMITTED transaction.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}
