package ledger

import (
	"context"
	"fmt"

	"github.com/mcpsync/mcpsync"
)

// AllocateRequest asks for the next readOrdinal of a subscription (R14).
type AllocateRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string // normalized
	RequestID         string // unique per subscription; replaying it returns the first outcome
	Reason            mcpsync.ReadReason
}

// Dispatch is the result of AllocateReadOrdinal. Ordinal is set only when Outcome is Allocated.
type Dispatch struct {
	Outcome mcpsync.Outcome
	Ordinal int64
	State   mcpsync.State // the subscription's state when the outcome was first decided
}

func (req AllocateRequest) idemKey() string {
	return fmt.Sprintf("allocate/%d/%s", req.SubscriptionID, req.RequestID)
}

// AllocateReadOrdinal issues the next readOrdinal by compare-and-set (R14): one statement
// raises last_issued_ordinal and stores the dispatch (request ID, reason, generation, session
// generation, URI) and its ALLOCATED receipt, only while the subscription is ACTIVE in that
// generation and session, the session is the source's current one and the subscription's
// principal holds a standing grant on the source (R23, R24). Otherwise the same statement
// records one receipt with the refusal: OldGeneration, OldSession (R12), Refused (URI
// mismatch, a generation or session never issued), NotActive (closing, R18), Revoked (the
// grant was revoked) or NotActive (not yet active). The statement runs in a READ COMMITTED
// transaction after the subscription's row lock (lockedRow), so its label describes
// the row as it was decided on. The request ID is the idempotency key: replaying it returns
// the first outcome (the ordinal first issued, or the first refusal) and writes nothing.
func (s *Store) AllocateReadOrdinal(ctx context.Context, req AllocateRequest) (Dispatch, error) {
	if !req.Reason.Valid() || req.RequestID == "" {
		return Dispatch{}, fmt.Errorf("ledger: allocate read ordinal: reason %q, request %q: %w", req.Reason, req.RequestID, ErrInvalid)
	}
	d, err := retryOnConflict(func() (Dispatch, error) { return s.allocateOnce(ctx, req) })
	if err != nil {
		return Dispatch{}, fmt.Errorf("ledger: allocate read ordinal for subscription %d: %w", req.SubscriptionID, err)
	}
	return d, nil
}

// grantCTE locks the standing grant of subscription $1's principal on its source FOR SHARE,
// for the fences of reads (AllocateReadOrdinal, AcceptResourceVersion, RecordNotFound; R23,
// R24). Revoke updates that row, so the two serialise on it: a fence that locked it first
// holds it until its transaction commits, and the revocation's UPDATE waits for that commit;
// a fence that comes after the revocation's UPDATE waits for the revocation to end and then,
// READ COMMITTED re-checking the row's newest version, finds it revoked and refuses. Either
// way no read is allocated or accepted in a transaction that commits after the revocation.
// It is empty when the grant is revoked (grants are never deleted).
const grantCTE = `
		g AS MATERIALIZED (
			SELECT gr.epoch FROM grants gr
			JOIN subscriptions sg ON sg.principal = gr.principal AND sg.source_id = gr.source_id
			WHERE sg.id = $1 AND gr.revoked_at IS NULL
			FOR SHARE OF gr),`

// allocateSQL is AllocateReadOrdinal's one statement: the compare-and-set that issues the
// ordinal with its dispatch and ALLOCATED receipt, or else the labelled refusal receipt.
var allocateSQL = `
		WITH prior AS (
			SELECT kind, read_ordinal, detail->>'state' AS state FROM receipts WHERE idem_key = $7),` + grantCTE + `
		alloc AS (
			UPDATE subscriptions s SET last_issued_ordinal = s.last_issued_ordinal + 1
			FROM sources so
			WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3 AND s.uri = $4
			  AND s.state = 'ACTIVE' AND so.id = s.source_id AND so.current_generation = $3
			  AND EXISTS (SELECT 1 FROM g) AND NOT EXISTS (SELECT 1 FROM prior)
			RETURNING s.id, s.source_id, s.last_issued_ordinal),
		d AS (
			INSERT INTO read_dispatches (subscription_id, ordinal, generation, session_generation, uri, request_id, reason)
			SELECT id, last_issued_ordinal, $2, $3, $4, $5, $6 FROM alloc
			RETURNING ordinal),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $7, 'ALLOCATED', source_id, id, $2, $3, last_issued_ordinal, $5, $4,
			       jsonb_build_object('phase', 'allocate', 'reason', $6::text, 'state', 'ACTIVE')
			FROM alloc
			RETURNING 1),
		-- Refused: label the refusal from the current row (locked by the transaction's first
		-- statement) and the grant as locked, and record it once. The label decides nothing;
		-- the compare-and-set above already refused.
		cur AS (
			SELECT s.id, s.source_id, s.state, s.generation, s.session_generation, s.uri, so.current_generation
			FROM subscriptions s JOIN sources so ON so.id = s.source_id
			WHERE s.id = $1),
		cls AS (
			SELECT cur.*, CASE
				WHEN $2 < generation THEN 'OLD_GENERATION'
				WHEN $2 > generation THEN 'REFUSED'
				WHEN $3 < greatest(session_generation, current_generation) THEN 'OLD_SESSION'
				WHEN $3 > current_generation OR $4 <> uri THEN 'REFUSED'
				WHEN state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED') THEN 'NOT_ACTIVE'
				WHEN NOT EXISTS (SELECT 1 FROM g) THEN 'REVOKED'
				ELSE 'NOT_ACTIVE' END AS kind
			FROM cur
			WHERE NOT EXISTS (SELECT 1 FROM alloc) AND NOT EXISTS (SELECT 1 FROM prior)),
		ref AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, request_id, uri, detail)
			SELECT $7, kind, source_id, id, $2, $3, $5, $4,
			       jsonb_build_object('phase', 'allocate', 'reason', $6::text, 'state', state)
			FROM cls
			ON CONFLICT (idem_key) DO NOTHING
			RETURNING kind, detail->>'state' AS state)
		SELECT p.kind, p.read_ordinal, p.state, (SELECT ordinal FROM d),
		       (SELECT kind FROM ref), (SELECT state FROM ref), EXISTS (SELECT 1 FROM cur),
		       (SELECT count(*) FROM rc)
		FROM (SELECT 1) one LEFT JOIN prior p ON true`

func (s *Store) allocateOnce(ctx context.Context, req AllocateRequest) (Dispatch, error) {
	var priorKind, priorState, refusedKind, refusedState *string
	var priorOrdinal, issued *int64
	var exists bool
	err := s.lockedRow(ctx, req.SubscriptionID, allocateSQL,
		[]any{req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI, req.RequestID, string(req.Reason), req.idemKey()},
		&priorKind, &priorOrdinal, &priorState, &issued, &refusedKind, &refusedState, &exists, new(int64))
	if err != nil {
		return Dispatch{}, err
	}
	switch {
	case issued != nil:
		return Dispatch{Outcome: mcpsync.OutcomeAllocated, Ordinal: *issued, State: mcpsync.StateActive}, nil
	case priorKind != nil:
		return priorDispatch(*priorKind, priorOrdinal, priorState), nil
	case refusedKind != nil:
		return priorDispatch(*refusedKind, nil, refusedState), nil
	case !exists:
		return Dispatch{}, fmt.Errorf("subscription %d: %w", req.SubscriptionID, ErrNotFound)
	}
	// A concurrent call with the same request ID recorded first (the refusal's insert found
	// its key); its outcome stands.
	err = s.pool.QueryRow(ctx, `SELECT kind, read_ordinal, detail->>'state' FROM receipts WHERE idem_key = $1`,
		req.idemKey()).Scan(&priorKind, &priorOrdinal, &priorState)
	if err != nil {
		return Dispatch{}, fmt.Errorf("first outcome of %s: %w", req.idemKey(), err)
	}
	return priorDispatch(*priorKind, priorOrdinal, priorState), nil
}

// priorDispatch rebuilds the first outcome of an allocation from its receipt.
func priorDispatch(kind string, ordinal *int64, state *string) Dispatch {
	d := Dispatch{Outcome: mcpsync.Outcome(kind)}
	if ordinal != nil && d.Outcome == mcpsync.OutcomeAllocated {
		d.Ordinal = *ordinal
	}
	if state != nil {
		d.State = mcpsync.State(*state)
	}
	return d
}

// VersionInfo describes a read's response (R15). The body itself is in the blob table, under
// Digest; LastModified is the server's hint and never replaces the digest.
type VersionInfo struct {
	MIMEType      string
	Digest        string // "sha256:<hex>"
	Size          int64
	ServerName    string
	ServerVersion string
	LastModified  string
}

// readFence is the ordinal fence every answer to a read passes, content (R16) and not-found
// (R21) alike: the subscription is ACTIVE in the read's generation and session, the URI
// matches, the ordinal is above the watermark and was issued, the dispatch with this request
// ID exists unanswered, the principal's grant stands (g, locked by grantCTE; R23, R24) and no
// identical call recorded its outcome already (prior). It expects $1 subscription, $2
// generation, $3 session generation, $4 URI, $5 ordinal, $6 request ID.
const readFence = `s.id = $1 AND s.state = 'ACTIVE' AND s.generation = $2 AND s.session_generation = $3
			  AND s.uri = $4 AND s.last_accepted_ordinal < $5 AND $5 <= s.last_issued_ordinal
			  AND EXISTS (SELECT 1 FROM read_dispatches d
			              WHERE d.subscription_id = $1 AND d.ordinal = $5 AND d.request_id = $6
			                AND d.generation = $2 AND d.session_generation = $3 AND d.uri = $4
			                AND d.outcome IS NULL)
			  AND EXISTS (SELECT 1 FROM g) AND NOT EXISTS (SELECT 1 FROM prior)`

// AcceptRequest offers a read's response to the single acceptance point (R16).
type AcceptRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string // normalized
	Ordinal           int64
	RequestID         string
	Version           VersionInfo
	// Body, when not nil, is the read's body: it is stored under Version.Digest (as PutBlob
	// stores it, with Version.MIMEType) in the acceptance's own transaction, so that the
	// answer costs one transaction and one commit instead of two. It is stored after the
	// acceptance's statement, whose foreign-key checks lock the source's row: the order in
	// which a source's purge takes the two (the source, then its blobs), so the two cannot
	// deadlock. It is stored whatever the outcome, as PutBlob before an acceptance would have
	// stored it (Prune removes a body no version names, SPEC.md "Retention"). Version.Digest
	// must be its digest (Digest).
	Body []byte
}

// AcceptResult is the outcome of AcceptResourceVersion; VersionID is set for Accepted.
type AcceptResult struct {
	Outcome   mcpsync.Outcome
	VersionID int64
}

func (r AcceptRequest) idemKey() string {
	return fmt.Sprintf("accept/%d/%d/%s/%s", r.SubscriptionID, r.Ordinal, r.RequestID, r.Version.Digest)
}

// refusalCTEs label an answer ($1 subscription, $2 generation, $3 session generation, $4 URI,
// $5 ordinal, $6 request ID) that the fence CTE named by the caller as "fence" did not let
// through, and record its receipt under the key in prior, once. The label decides nothing:
// the fence has already refused. It is read from the subscription row as the transaction
// locked it (lockedRow takes it first, so an answer that waited behind the close fence sees
// the fence) and from the grant as grantCTE locked it. It is, in this order: NOT_DISPATCHED
// (no dispatch with that ordinal, request ID, generation, session generation and URI),
// OLD_GENERATION, STALE_AFTER_CLOSE (R19: whenever the read was sent), REVOKED (the grant was
// revoked), DUPLICATE (the dispatch already has its answer), OLD_SESSION, STALE. A refused answer to the very dispatch it names settles that
// dispatch, so a second, different answer to it is a DUPLICATE; an answer that names no
// dispatch settles nothing. %[1]s is the phase, %[2]s the digest expression.
const refusalCTEs = `
		cur AS (
			SELECT s.id, s.source_id, s.state, s.generation, s.session_generation, s.last_accepted_ordinal
			FROM subscriptions s WHERE s.id = $1),
		disp AS (
			SELECT outcome FROM read_dispatches
			WHERE subscription_id = $1 AND ordinal = $5 AND request_id = $6
			  AND generation = $2 AND session_generation = $3 AND uri = $4),
		cls AS (
			SELECT cur.*, CASE
				WHEN NOT EXISTS (SELECT 1 FROM disp) THEN 'NOT_DISPATCHED'
				WHEN $2 <> generation THEN 'OLD_GENERATION'
				WHEN state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED') THEN 'STALE_AFTER_CLOSE'
				WHEN NOT EXISTS (SELECT 1 FROM g) THEN 'REVOKED'
				WHEN (SELECT outcome FROM disp) IS NOT NULL THEN 'DUPLICATE'
				WHEN $3 <> session_generation THEN 'OLD_SESSION'
				ELSE 'STALE' END AS kind
			FROM cur
			WHERE NOT EXISTS (SELECT 1 FROM fence) AND NOT EXISTS (SELECT 1 FROM prior)),
		ref AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, digest, detail)
			SELECT (SELECT key FROM k), kind, source_id, id, $2, $3, $5, $6, $4, %[2]s,
			       jsonb_build_object('phase', '%[1]s', 'state', state, 'watermark', last_accepted_ordinal)
			FROM cls
			ON CONFLICT (idem_key) DO NOTHING
			RETURNING kind),
		settle AS (
			UPDATE read_dispatches SET outcome = (SELECT kind FROM ref), completed_at = now()
			WHERE subscription_id = $1 AND ordinal = $5 AND request_id = $6 AND generation = $2
			  AND session_generation = $3 AND uri = $4 AND outcome IS NULL
			  AND (SELECT kind FROM ref) <> 'NOT_DISPATCHED'
			RETURNING 1)`

// AcceptResourceVersion is the single acceptance point acceptResourceVersion (R16, R17). In
// one statement it accepts only if the subscription is still ACTIVE and its generation,
// session generation and URI match a dispatched, not yet answered request with this ordinal
// and request ID, readOrdinal > lastAcceptedOrdinal, and the subscription's principal holds a
// standing grant on the source, locked until the statement's transaction commits (grantCTE;
// R23, R24: nothing is accepted once a revocation has committed); then it raises the watermark and
// writes the resourceVersion.v1 row, the invalidation outbox row and the ACCEPTED receipt
// together. A read that confirms the digest already accepted raises the watermark as
// Revalidated, without a new version or invalidation. Otherwise the same statement writes
// exactly one receipt: StaleAfterClose (R19), Revoked, OldGeneration, OldSession (R12),
// NotDispatched, Duplicate or Stale, labelled from the subscription row as the statement's
// READ COMMITTED transaction locked it first (lockedRow). The idempotency key is
// (subscription, ordinal, request ID, digest): replaying it returns the first outcome and
// writes nothing.
func (s *Store) AcceptResourceVersion(ctx context.Context, req AcceptRequest) (AcceptResult, error) {
	if req.Version.Digest == "" || req.RequestID == "" {
		return AcceptResult{}, fmt.Errorf("ledger: accept: digest %q, request %q: %w", req.Version.Digest, req.RequestID, ErrInvalid)
	}
	if req.Body != nil {
		if d := Digest(req.Body); d != req.Version.Digest {
			return AcceptResult{}, fmt.Errorf("ledger: accept: the body's digest is %s, not %s: %w", d, req.Version.Digest, ErrInvalid)
		}
	}
	res, err := retryOnConflict(func() (AcceptResult, error) { return s.acceptOnce(ctx, req) })
	if err != nil {
		return AcceptResult{}, fmt.Errorf("ledger: accept ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	return res, nil
}

// acceptSQL is AcceptResourceVersion's one statement: the fence, the version, the outbox row,
// the settled dispatch and the receipt, or else the labelled refusal receipt (refusalCTEs).
var acceptSQL = `
		WITH k AS (SELECT $13::text AS key),
		prior AS (SELECT kind FROM receipts WHERE idem_key = $13),` + grantCTE + `
		fence AS (
			UPDATE subscriptions s SET
				previous_accepted_digest = s.last_accepted_digest,
				last_accepted_ordinal = $5,
				last_accepted_digest = $7,
				last_accepted_at = CASE WHEN s.last_accepted_digest IS DISTINCT FROM $7 THEN now() ELSE s.last_accepted_at END,
				last_verified_at = now(),
				state_reason = CASE WHEN s.state_reason LIKE '` + tooLargeReasonPrefix + `%' THEN '' ELSE s.state_reason END,
				updated_at = now()
			WHERE ` + readFence + `
			RETURNING s.id, s.principal, s.source_id, s.uri,
			          (s.previous_accepted_digest IS DISTINCT FROM s.last_accepted_digest) AS changed),
		ver AS (
			INSERT INTO resource_versions (subscription_id, principal, source_id, uri, kind, mime_type,
				digest, size, read_ordinal, generation, session_generation, request_id, auth_subject,
				server_name, server_version, last_modified)
			SELECT u.id, u.principal, u.source_id, u.uri, 'content', $8, $7, $9, $5, $2, $3, $6,
			       so.subject, $10, $11, nullif($12, '')
			FROM fence u JOIN sources so ON so.id = u.source_id WHERE u.changed
			RETURNING id),
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, principal,
				source_id, uri, digest, read_ordinal)
			SELECT 'version', 'version/' || u.id || '/' || $5::bigint, u.id, u.principal, u.source_id, u.uri, $7, $5
			FROM fence u WHERE u.changed
			RETURNING id),
		dis AS (
			UPDATE read_dispatches SET completed_at = now(),
				outcome = CASE WHEN (SELECT changed FROM fence) THEN 'ACCEPTED' ELSE 'REVALIDATED' END
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM fence)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, digest, detail)
			SELECT $13, CASE WHEN u.changed THEN 'ACCEPTED' ELSE 'REVALIDATED' END, u.source_id, u.id,
			       $2, $3, $5, $6, u.uri, $7,
			       jsonb_build_object('outbox', (SELECT id FROM ob), 'dispatch', (SELECT count(*) FROM dis))
			FROM fence u
			RETURNING kind),` + fmt.Sprintf(refusalCTEs, "accept", "$7") + `
		SELECT coalesce((SELECT kind FROM rc), (SELECT kind FROM prior), (SELECT kind FROM ref)),
		       coalesce((SELECT id FROM ver),
		                (SELECT v.id FROM resource_versions v WHERE v.subscription_id = $1 AND v.read_ordinal = $5
		                   AND v.request_id = $6 AND v.digest = $7 AND (SELECT kind FROM prior) = 'ACCEPTED')),
		       EXISTS (SELECT 1 FROM cur), (SELECT count(*) FROM settle)`

func (s *Store) acceptOnce(ctx context.Context, req AcceptRequest) (AcceptResult, error) {
	var kind *string
	var versionID *int64
	var exists bool
	var then []queued
	if req.Body != nil {
		then = append(then, putBlob(req.Version.Digest, req.Body, req.Version.MIMEType))
	}
	err := s.lockedRowThen(ctx, req.SubscriptionID, acceptSQL,
		[]any{req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI, req.Ordinal,
			req.RequestID, req.Version.Digest, SafeText(req.Version.MIMEType), req.Version.Size,
			SafeText(req.Version.ServerName), SafeText(req.Version.ServerVersion), SafeText(req.Version.LastModified),
			req.idemKey()},
		then, &kind, &versionID, &exists, new(int64))
	if err != nil {
		return AcceptResult{}, err
	}
	if kind == nil {
		kind, err = s.firstOutcome(ctx, exists, req.SubscriptionID, req.idemKey())
		if err != nil {
			return AcceptResult{}, err
		}
		if mcpsync.Outcome(*kind) == mcpsync.OutcomeAccepted {
			err := s.pool.QueryRow(ctx, `SELECT id FROM resource_versions WHERE subscription_id = $1 AND read_ordinal = $2`,
				req.SubscriptionID, req.Ordinal).Scan(&versionID)
			if err != nil {
				return AcceptResult{}, fmt.Errorf("version of the first, accepted call: %w", err)
			}
		}
	}
	res := AcceptResult{Outcome: mcpsync.Outcome(*kind)}
	if versionID != nil {
		res.VersionID = *versionID
	}
	return res, nil
}

// firstOutcome reads the outcome recorded under key when a statement found neither its own
// outcome nor a prior one: a concurrent call with the same key recorded first (its insert won
// the key), or the subscription does not exist.
func (s *Store) firstOutcome(ctx context.Context, exists bool, subscriptionID int64, key string) (*string, error) {
	if !exists {
		return nil, fmt.Errorf("subscription %d: %w", subscriptionID, ErrNotFound)
	}
	var kind string
	if err := s.pool.QueryRow(ctx, `SELECT kind FROM receipts WHERE idem_key = $1`, key).Scan(&kind); err != nil {
		return nil, fmt.Errorf("first outcome of %s: %w", key, err)
	}
	return &kind, nil
}

// NotFoundRequest reports that a dispatched read answered not-found.
type NotFoundRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string // normalized
	Ordinal           int64
	RequestID         string
}

func (r NotFoundRequest) idemKey() string {
	return fmt.Sprintf("notfound/%d/%d/%s", r.SubscriptionID, r.Ordinal, r.RequestID)
}

// notFoundSQL is RecordNotFound's one statement: the fence into TOMBSTONE_PENDING with its
// receipt, or else the labelled refusal receipt (refusalCTEs).
var notFoundSQL = `
		WITH k AS (SELECT $7::text AS key),
		prior AS (SELECT kind FROM receipts WHERE idem_key = $7),` + grantCTE + `
		fence AS (
			UPDATE subscriptions s SET state = 'TOMBSTONE_PENDING',
				state_reason = 'read ' || $5::bigint || ' answered not found', last_accepted_ordinal = $5,
				updated_at = now()
			WHERE ` + readFence + `
			RETURNING s.id, s.source_id, s.uri),
		dis AS (
			UPDATE read_dispatches SET completed_at = now(), outcome = 'TOMBSTONE_PENDING'
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM fence)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $7, 'TOMBSTONE_PENDING', u.source_id, u.id, $2, $3, $5, $6, u.uri,
			       jsonb_build_object('dispatch', (SELECT count(*) FROM dis))
			FROM fence u
			RETURNING kind),` + fmt.Sprintf(refusalCTEs, "not_found", "NULL::text") + `
		SELECT coalesce((SELECT kind FROM rc), (SELECT kind FROM prior), (SELECT kind FROM ref)),
		       EXISTS (SELECT 1 FROM cur), (SELECT count(*) FROM settle)`

// RecordNotFound passes a not-found answer through the same ordinal fence as content (R21), in
// one statement: only on an ACTIVE subscription, for a dispatched, not yet answered request
// with readOrdinal above the watermark, does it move to TOMBSTONE_PENDING (raising the
// watermark, so no older read can be accepted afterwards), and only while the principal's grant
// stands (grantCTE: after a revocation it leaves a REVOKED receipt). No tombstone and no
// invalidation are written until list reconciliation confirms the deletion. After the close
// fence it only leaves a STALE_AFTER_CLOSE receipt (R19); other refusals are labelled as for
// accepts, from the row as locked, each with one receipt. The idempotency key is (subscription, ordinal, request ID): replaying it
// returns the first outcome and writes nothing.
func (s *Store) RecordNotFound(ctx context.Context, req NotFoundRequest) (mcpsync.Outcome, error) {
	if req.RequestID == "" {
		return "", fmt.Errorf("ledger: record not found: empty request ID: %w", ErrInvalid)
	}
	out, err := s.keyedAnswer(ctx, req.SubscriptionID, req.idemKey(), notFoundSQL,
		req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI, req.Ordinal, req.RequestID, req.idemKey())
	if err != nil {
		return "", fmt.Errorf("ledger: not-found for ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	return out, nil
}

// keyedAnswer runs one answer statement (not-found, too-large) behind the subscription's row
// lock, in its own transaction: the statement returns the outcome it recorded (kind), or
// none and whether a receipt under key exists; then the first outcome recorded under key is
// the answer (a retry of the same call). Retried on a key conflict or a deadlock.
func (s *Store) keyedAnswer(ctx context.Context, subscriptionID int64, key, stmt string, args ...any) (mcpsync.Outcome, error) {
	return retryOnConflict(func() (mcpsync.Outcome, error) {
		var kind *string
		var exists bool
		err := s.lockedRow(ctx, subscriptionID, stmt, args, &kind, &exists, new(int64))
		if err != nil {
			return "", err
		}
		if kind == nil {
			if kind, err = s.firstOutcome(ctx, exists, subscriptionID, key); err != nil {
				return "", err
			}
		}
		return mcpsync.Outcome(*kind), nil
	})
}

// TooLargeRequest reports that a dispatched read answered with contents larger than the
// source's size bound (issue 14 item 6): Size bytes (text bytes plus decoded blob bytes) over
// MaxBytes. Nothing of the contents is stored.
type TooLargeRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string // normalized
	Ordinal           int64
	RequestID         string
	Size              int64
	MaxBytes          int64
}

func (r TooLargeRequest) idemKey() string {
	return fmt.Sprintf("toolarge/%d/%d/%s", r.SubscriptionID, r.Ordinal, r.RequestID)
}

// tooLargeReasonPrefix starts the state reason a TOO_LARGE read leaves on its subscription;
// the next read the acceptance point lets through (accepted or revalidated) clears it.
const tooLargeReasonPrefix = "too large: "

// tooLargeSQL is RecordTooLarge's one statement: the fence raising the watermark with the
// TOO_LARGE receipt and reason, or else the labelled refusal receipt (refusalCTEs).
var tooLargeSQL = `
		WITH k AS (SELECT $7::text AS key),
		prior AS (SELECT kind FROM receipts WHERE idem_key = $7),` + grantCTE + `
		fence AS (
			UPDATE subscriptions s SET last_accepted_ordinal = $5,
				state_reason = '` + tooLargeReasonPrefix + `read ' || $5::bigint || ' returned ' || $8::bigint
				               || ' bytes, over the source''s bound of ' || $9::bigint
				               || ' (--max-bytes); the previous version is kept',
				updated_at = now()
			WHERE ` + readFence + `
			RETURNING s.id, s.source_id, s.uri),
		dis AS (
			UPDATE read_dispatches SET completed_at = now(), outcome = 'TOO_LARGE'
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM fence)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $7, 'TOO_LARGE', u.source_id, u.id, $2, $3, $5, $6, u.uri,
			       jsonb_build_object('dispatch', (SELECT count(*) FROM dis), 'size', $8::bigint, 'max_bytes', $9::bigint)
			FROM fence u
			RETURNING kind),` + fmt.Sprintf(refusalCTEs, "too_large", "NULL::text") + `
		SELECT coalesce((SELECT kind FROM rc), (SELECT kind FROM prior), (SELECT kind FROM ref)),
		       EXISTS (SELECT 1 FROM cur), (SELECT count(*) FROM settle)`

// RecordTooLarge passes a too-large answer through the same ordinal fence as content (R16)
// and not-found (R21), in one statement (issue 14 item 6): only on an ACTIVE subscription,
// for a dispatched, not yet answered request with readOrdinal above the watermark, while the
// principal's grant stands, does it raise the watermark (so no older read can be accepted
// afterwards), settle the dispatch and write one TOO_LARGE receipt with the size and the
// bound, and set the subscription's state reason to say so (status shows it); no blob, no
// version and no invalidation are written, so the subscription keeps its previous version.
// Otherwise it writes exactly one labelled refusal receipt, as accepts do. The idempotency key
// is (subscription, ordinal, request ID): replaying it returns the first outcome and writes
// nothing.
func (s *Store) RecordTooLarge(ctx context.Context, req TooLargeRequest) (mcpsync.Outcome, error) {
	if req.RequestID == "" || req.Size <= req.MaxBytes {
		return "", fmt.Errorf("ledger: record too large: request %q, %d bytes within %d: %w", req.RequestID, req.Size, req.MaxBytes, ErrInvalid)
	}
	out, err := s.keyedAnswer(ctx, req.SubscriptionID, req.idemKey(), tooLargeSQL,
		req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI, req.Ordinal, req.RequestID, req.idemKey(), req.Size, req.MaxBytes)
	if err != nil {
		return "", fmt.Errorf("ledger: too-large read for ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	return out, nil
}
