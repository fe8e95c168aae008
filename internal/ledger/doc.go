// Package ledger is mcpsync's single source of truth and its only fence. Every transition that
// SPEC.md guards by compare-and-set is one SQL statement (or one transaction) whose WHERE clause
// carries the whole condition: state, subscription generation, session generation and ordinal.
// Callers branch on the typed mcpsync.Outcome each call returns.
//
// # Refusals are outcomes, errors are failures
//
// A guarded transition of a subscription, a read or a tombstone (BeginSubscribe, Activate,
// MarkReconciliationRequired, RestoreFromTombstone, BeginUnsubscribe, CompleteUnsubscribe,
// MarkUnsubscribeUnknown, AllocateReadOrdinal, AcceptResourceVersion, RecordNotFound,
// ConfirmTombstone, CloseSession) reports every refusal of its fence as an mcpsync.Outcome
// (mcpsync.OutcomeRefused, OutcomeStale, OutcomeOldSession, OutcomeRevoked, ..., with an
// mcpsync.TombstoneRefusal saying why for ConfirmTombstone) and a nil error. Such a call
// returns an error only when the ledger could not decide: the database failed, the request is
// malformed (ErrInvalid), or it names a subscription or source that does not exist
// (ErrNotFound). ConfirmTombstone's missing catalog is a refusal
// (mcpsync.TombstoneNoCatalog), not an error: a catalog may legitimately be gone, while the
// subscription is the caller's own. A caller never sees an outcome and an error together:
// when the error is non-nil the result is the zero value.
//
// A few refusals are errors on purpose: they guard content or authority, and a caller that
// ignored an outcome would use something it must not. Each is a sentinel for errors.Is and,
// where it carries detail, a type for errors.As:
//
//   - ErrNoGrant (*GrantError): the principal holds no standing grant (R23): EnsureSubscription,
//     CheckGrant and Read refuse to act for it, and Revoke has nothing to revoke.
//   - ErrGuardRejected (*GuardRefusal) and ErrNotPublished: Read must not return the content:
//     the output guard rejected it (R22), or the roll-out does not publish it to the caller
//     (shadow mode or outside the refresh percentage). Read is the one call that returns its
//     result together with an error (ErrGuardRejected, ErrNotPublished, or ErrNotFound when
//     there is no content): the result then describes what exists, without the content.
//   - ErrCatalogRefused (*CatalogRefusal; also ErrNotFound for NO_CATALOG): ConsumeCatalog
//     refused the newest catalog for the purpose (R7, R25). The refusal is recorded in the same
//     statement before it is returned.
//   - ErrProofRefused (*ProofRefusal): PublishCatalog's basis rounds do not prove the level
//     (R4-R8); the discovery activity turns it back into a refusal field of its payload.
//   - ErrStaleScan, ErrLeaseLost, ErrNoSession, ErrConsumerBusy, ErrSourceExists: the caller's
//     own scan, lease, session, consumer hold or source definition is not what it assumed;
//     the caller must stop, not branch on an outcome.
//
// The activities (package activities) turn ErrInvalid, ErrNotFound and ErrNoGrant into
// non-retryable application errors of type contract.ErrTypePermanent, since a retry cannot
// change them; every other error is retried by Temporal.
//
// # Isolation and locks
//
// Every transaction the ledger opens sets READ COMMITTED itself (inTx), whatever the server's
// default_transaction_isolation: a statement that follows a lock in the same transaction then
// takes a new snapshot and sees everything committed before the lock was granted, and a
// statement that waits for a row re-checks its condition on the row's newest version. Revoke
// relies on the first (its lineage is read after the grant rows are revoked); the answers to
// reads rely on both: AllocateReadOrdinal, AcceptResourceVersion and RecordNotFound first lock
// the subscription row, then run their one fenced statement, so a refusal is labelled from the
// row as it was decided on (an answer that waited behind the close fence is
// STALE_AFTER_CLOSE, R19), and that statement locks the principal's standing grant FOR SHARE
// until it commits, so a revocation and an acceptance serialise on the grant row: nothing is
// allocated or accepted in a transaction that commits after a revocation (mcpsync.OutcomeRevoked,
// R23, R24). A call that is a single statement runs in its own implicit transaction at the
// server's default level; each is one compare-and-set whose whole condition is in its WHERE,
// so a stricter default changes no outcome: a concurrent update then fails it with a
// serialization failure, which it retries (retryOnConflict) or returns as an error.
//
// # Receipts and replays
//
// Every call that has an idempotency key — AllocateReadOrdinal (the
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
// history to check the fences). Refusal receipts carry no state and need no order. Receipt
// kinds are mcpsync.ReceiptKind values; every read outcome is also a receipt kind.
package ledger
