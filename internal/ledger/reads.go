package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// AllocateRequest asks for the next readOrdinal of a subscription (R14).
type AllocateRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string // normalized
	RequestID         string // unique per subscription; replaying it returns the same ordinal
	Reason            ReadReason
}

// Dispatch is the result of AllocateReadOrdinal. Ordinal is set only when Outcome is Allocated.
type Dispatch struct {
	Outcome Outcome
	Ordinal int64
	State   State // the subscription's state when refused
}

// AllocateReadOrdinal issues the next readOrdinal by compare-and-set (R14): one statement
// raises last_issued_ordinal and stores the dispatch (request ID, reason, generation, session
// generation, URI), only while the subscription is ACTIVE in that generation and session and
// the session is the source's current one. Refusals are NotActive (closing or not yet active,
// R18), OldGeneration, OldSession or Refused (URI mismatch), each with a receipt. Replaying a
// request ID returns the ordinal first issued for it.
func (s *Store) AllocateReadOrdinal(ctx context.Context, req AllocateRequest) (Dispatch, error) {
	if !req.Reason.Valid() || req.RequestID == "" {
		return Dispatch{}, fmt.Errorf("ledger: allocate read ordinal: reason %q, request %q: %w", req.Reason, req.RequestID, ErrInvalid)
	}
	for attempt := 0; ; attempt++ {
		d, err := s.allocateOnce(ctx, req)
		if err != nil && isUniqueViolation(err) && attempt == 0 {
			continue // a concurrent replay of the same request ID won; read its ordinal
		}
		if err != nil {
			return Dispatch{}, fmt.Errorf("ledger: allocate read ordinal for subscription %d: %w", req.SubscriptionID, err)
		}
		return d, nil
	}
}

func (s *Store) allocateOnce(ctx context.Context, req AllocateRequest) (Dispatch, error) {
	var d Dispatch
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `SELECT ordinal FROM read_dispatches WHERE subscription_id = $1 AND request_id = $2`,
			req.SubscriptionID, req.RequestID).Scan(&d.Ordinal)
		if err == nil {
			d.Outcome = Allocated
			return nil
		}
		if err != pgx.ErrNoRows {
			return err
		}
		err = tx.QueryRow(ctx, `
			WITH s AS (
				UPDATE subscriptions s SET last_issued_ordinal = s.last_issued_ordinal + 1
				FROM sources so
				WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3 AND s.uri = $4
				  AND s.state = 'ACTIVE' AND so.id = s.source_id AND so.current_generation = $3
				RETURNING s.id, s.last_issued_ordinal)
			INSERT INTO read_dispatches (subscription_id, ordinal, generation, session_generation, uri, request_id, reason)
			SELECT id, last_issued_ordinal, $2, $3, $4, $5, $6 FROM s
			RETURNING ordinal`, req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI,
			req.RequestID, string(req.Reason)).Scan(&d.Ordinal)
		if err == nil {
			d.Outcome = Allocated
			return nil
		}
		if err != pgx.ErrNoRows {
			return err
		}
		var gen, sgen, current int64
		var uri string
		if err := tx.QueryRow(ctx, `SELECT s.state, s.generation, s.session_generation, s.uri, so.current_generation
			FROM subscriptions s JOIN sources so ON so.id = s.source_id WHERE s.id = $1`, req.SubscriptionID).
			Scan(&d.State, &gen, &sgen, &uri, &current); err != nil {
			return notFound(err, fmt.Sprintf("subscription %d", req.SubscriptionID))
		}
		switch {
		case req.Generation != gen:
			d.Outcome = OldGeneration
		case req.SessionGeneration != sgen || req.SessionGeneration != current:
			d.Outcome = OldSession
		case req.URI != uri:
			d.Outcome = Refused
		default:
			d.Outcome = NotActive
		}
		_, err = tx.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation, session_generation, request_id, uri, detail)
			SELECT $2, $3, source_id, id, $4, $5, $6, $7, jsonb_build_object('phase', 'allocate', 'reason', $8::text, 'state', state)
			FROM subscriptions WHERE id = $1
			ON CONFLICT (idem_key) DO NOTHING`,
			req.SubscriptionID, fmt.Sprintf("allocate/%d/%s", req.SubscriptionID, req.RequestID), string(d.Outcome),
			req.Generation, req.SessionGeneration, req.RequestID, req.URI, string(req.Reason))
		return err
	})
	return d, err
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

// AcceptRequest offers a read's response to the single acceptance point (R16).
type AcceptRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	URI               string // normalized
	Ordinal           int64
	RequestID         string
	Version           VersionInfo
}

// AcceptResult is the outcome of AcceptResourceVersion; VersionID is set for Accepted.
type AcceptResult struct {
	Outcome   Outcome
	VersionID int64
}

func (r AcceptRequest) idemKey() string {
	return fmt.Sprintf("accept/%d/%d/%s/%s", r.SubscriptionID, r.Ordinal, r.RequestID, r.Version.Digest)
}

// AcceptResourceVersion is the single acceptance point acceptResourceVersion (R16, R17). In
// one statement it accepts only if the subscription is still ACTIVE and its generation,
// session generation and URI match a dispatched, not yet answered request with this ordinal
// and request ID, and readOrdinal > lastAcceptedOrdinal; then it raises the watermark and
// writes the resourceVersion.v1 receipt and the invalidation outbox row together. A read that
// confirms the digest already accepted raises the watermark as Revalidated, without a new
// version or invalidation. Otherwise it writes exactly one receipt: StaleAfterClose (R19),
// OldGeneration, OldSession (R12), NotDispatched, Duplicate or Stale. Replaying the same
// request (subscription, ordinal, request ID, digest) returns the first outcome and writes
// nothing.
func (s *Store) AcceptResourceVersion(ctx context.Context, req AcceptRequest) (AcceptResult, error) {
	if req.Version.Digest == "" || req.RequestID == "" {
		return AcceptResult{}, fmt.Errorf("ledger: accept: digest %q, request %q: %w", req.Version.Digest, req.RequestID, ErrInvalid)
	}
	var res AcceptResult
	var kind *string
	var versionID *int64
	err := s.pool.QueryRow(ctx, `
		WITH upd AS (
			UPDATE subscriptions s SET
				previous_accepted_digest = s.last_accepted_digest,
				last_accepted_ordinal = $5,
				last_accepted_digest = $7,
				last_accepted_at = CASE WHEN s.last_accepted_digest IS DISTINCT FROM $7 THEN now() ELSE s.last_accepted_at END,
				last_verified_at = now(),
				updated_at = now()
			WHERE s.id = $1 AND s.state = 'ACTIVE' AND s.generation = $2 AND s.session_generation = $3
			  AND s.uri = $4 AND s.last_accepted_ordinal < $5 AND $5 <= s.last_issued_ordinal
			  AND EXISTS (SELECT 1 FROM read_dispatches d
			              WHERE d.subscription_id = $1 AND d.ordinal = $5 AND d.request_id = $6
			                AND d.generation = $2 AND d.session_generation = $3 AND d.uri = $4
			                AND d.outcome IS NULL)
			RETURNING s.id, s.principal, s.source_id, s.uri,
			          (s.previous_accepted_digest IS DISTINCT FROM s.last_accepted_digest) AS changed),
		ver AS (
			INSERT INTO resource_versions (subscription_id, principal, source_id, uri, kind, mime_type,
				digest, size, read_ordinal, generation, session_generation, request_id, auth_subject,
				server_name, server_version, last_modified)
			SELECT u.id, u.principal, u.source_id, u.uri, 'content', $8, $7, $9, $5, $2, $3, $6,
			       so.subject, $10, $11, nullif($12, '')
			FROM upd u JOIN sources so ON so.id = u.source_id WHERE u.changed
			RETURNING id),
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, principal,
				source_id, uri, digest, read_ordinal)
			SELECT 'version', 'version/' || u.id || '/' || $5::bigint, u.id, u.principal, u.source_id, u.uri, $7, $5
			FROM upd u WHERE u.changed
			RETURNING id),
		dis AS (
			UPDATE read_dispatches SET completed_at = now(),
				outcome = CASE WHEN (SELECT changed FROM upd) THEN 'ACCEPTED' ELSE 'REVALIDATED' END
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM upd)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, digest, detail)
			SELECT $13, CASE WHEN u.changed THEN 'ACCEPTED' ELSE 'REVALIDATED' END, u.source_id, u.id,
			       $2, $3, $5, $6, u.uri, $7,
			       jsonb_build_object('outbox', (SELECT id FROM ob), 'dispatch', (SELECT count(*) FROM dis))
			FROM upd u
			RETURNING kind)
		SELECT (SELECT kind FROM rc), (SELECT id FROM ver)`,
		req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI, req.Ordinal,
		req.RequestID, req.Version.Digest, req.Version.MIMEType, req.Version.Size,
		req.Version.ServerName, req.Version.ServerVersion, req.Version.LastModified,
		req.idemKey()).Scan(&kind, &versionID)
	if err != nil {
		return AcceptResult{}, fmt.Errorf("ledger: accept ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	if kind != nil {
		res.Outcome = Outcome(*kind)
		if versionID != nil {
			res.VersionID = *versionID
		}
		return res, nil
	}
	out, err := s.refuse(ctx, refusal{
		phase: "accept", idemKey: req.idemKey(), subscriptionID: req.SubscriptionID,
		generation: req.Generation, sessionGeneration: req.SessionGeneration, uri: req.URI,
		ordinal: req.Ordinal, requestID: req.RequestID, digest: req.Version.Digest,
	})
	if err != nil {
		return AcceptResult{}, fmt.Errorf("ledger: accept ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	res.Outcome = out
	if out == Accepted {
		// A replay of a call that was accepted: report its version.
		_ = s.pool.QueryRow(ctx, `SELECT id FROM resource_versions WHERE subscription_id = $1 AND read_ordinal = $2`,
			req.SubscriptionID, req.Ordinal).Scan(&res.VersionID)
	}
	return res, nil
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

// RecordNotFound passes a not-found answer through the same ordinal fence as content (R21):
// only on an ACTIVE subscription, for a dispatched request with readOrdinal above the
// watermark, does it move to TOMBSTONE_PENDING (raising the watermark, so no older read can
// be accepted afterwards). No tombstone and no invalidation are written until list
// reconciliation confirms the deletion. After the close fence it only leaves a
// STALE_AFTER_CLOSE receipt (R19); other refusals are classified as for accepts.
func (s *Store) RecordNotFound(ctx context.Context, req NotFoundRequest) (Outcome, error) {
	if req.RequestID == "" {
		return "", fmt.Errorf("ledger: record not found: empty request ID: %w", ErrInvalid)
	}
	var kind *string
	err := s.pool.QueryRow(ctx, `
		WITH upd AS (
			UPDATE subscriptions s SET state = 'TOMBSTONE_PENDING',
				state_reason = 'read ' || $5::bigint || ' answered not found', last_accepted_ordinal = $5,
				updated_at = now()
			WHERE s.id = $1 AND s.state = 'ACTIVE' AND s.generation = $2 AND s.session_generation = $3
			  AND s.uri = $4 AND s.last_accepted_ordinal < $5 AND $5 <= s.last_issued_ordinal
			  AND EXISTS (SELECT 1 FROM read_dispatches d
			              WHERE d.subscription_id = $1 AND d.ordinal = $5 AND d.request_id = $6
			                AND d.generation = $2 AND d.session_generation = $3 AND d.uri = $4
			                AND d.outcome IS NULL)
			RETURNING s.id, s.source_id, s.uri),
		dis AS (
			UPDATE read_dispatches SET completed_at = now(), outcome = 'TOMBSTONE_PENDING'
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM upd)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $7, 'TOMBSTONE_PENDING', u.source_id, u.id, $2, $3, $5, $6, u.uri,
			       jsonb_build_object('dispatch', (SELECT count(*) FROM dis))
			FROM upd u
			RETURNING kind)
		SELECT kind FROM rc`,
		req.SubscriptionID, req.Generation, req.SessionGeneration, req.URI, req.Ordinal,
		req.RequestID, req.idemKey()).Scan(&kind)
	if err != nil && err != pgx.ErrNoRows {
		return "", fmt.Errorf("ledger: not-found for ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	if kind != nil {
		return Outcome(*kind), nil
	}
	out, err := s.refuse(ctx, refusal{
		phase: "not_found", idemKey: req.idemKey(), subscriptionID: req.SubscriptionID,
		generation: req.Generation, sessionGeneration: req.SessionGeneration, uri: req.URI,
		ordinal: req.Ordinal, requestID: req.RequestID,
	})
	if err != nil {
		return "", fmt.Errorf("ledger: not-found for ordinal %d of subscription %d: %w", req.Ordinal, req.SubscriptionID, err)
	}
	return out, nil
}

type refusal struct {
	phase             string
	idemKey           string
	subscriptionID    int64
	generation        int64
	sessionGeneration int64
	uri               string
	ordinal           int64
	requestID         string
	digest            string
}

// refuse classifies a response the fence did not let through and records exactly one receipt
// for it (the idempotency key makes a replay find the first one). The classification labels
// the receipt; it decides nothing, since the fence has already refused.
func (s *Store) refuse(ctx context.Context, r refusal) (Outcome, error) {
	var out Outcome
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var prior string
		err := tx.QueryRow(ctx, `SELECT kind FROM receipts WHERE idem_key = $1`, r.idemKey).Scan(&prior)
		if err == nil {
			out = Outcome(prior)
			return nil
		}
		if err != pgx.ErrNoRows {
			return err
		}
		var st State
		var gen, sgen, accepted int64
		if err := tx.QueryRow(ctx, `SELECT state, generation, session_generation, last_accepted_ordinal
			FROM subscriptions WHERE id = $1`, r.subscriptionID).Scan(&st, &gen, &sgen, &accepted); err != nil {
			return notFound(err, fmt.Sprintf("subscription %d", r.subscriptionID))
		}
		var dGen, dSgen int64
		var dURI string
		var dOutcome *string
		dispatched := true
		err = tx.QueryRow(ctx, `SELECT generation, session_generation, uri, outcome FROM read_dispatches
			WHERE subscription_id = $1 AND ordinal = $2 AND request_id = $3`,
			r.subscriptionID, r.ordinal, r.requestID).Scan(&dGen, &dSgen, &dURI, &dOutcome)
		if err == pgx.ErrNoRows {
			dispatched = false
		} else if err != nil {
			return err
		}
		switch {
		case !dispatched || dGen != r.generation || dSgen != r.sessionGeneration || dURI != r.uri:
			out = NotDispatched
		case r.generation != gen:
			out = OldGeneration
		case st.Closing():
			out = StaleAfterClose // R19: audit only, whenever the read was sent
		case dOutcome != nil:
			out = Duplicate
		case r.sessionGeneration != sgen:
			out = OldSession
		default:
			out = Stale
		}
		var kind string
		err = tx.QueryRow(ctx, `INSERT INTO receipts (idem_key, kind, source_id, subscription_id,
				generation, session_generation, read_ordinal, request_id, uri, digest, detail)
			SELECT $2, $3, source_id, id, $4, $5, $6, $7, $8, nullif($9, ''),
			       jsonb_build_object('phase', $10::text, 'state', state, 'watermark', last_accepted_ordinal)
			FROM subscriptions WHERE id = $1
			ON CONFLICT (idem_key) DO NOTHING
			RETURNING kind`, r.subscriptionID, r.idemKey, string(out), r.generation, r.sessionGeneration,
			r.ordinal, r.requestID, r.uri, r.digest, r.phase).Scan(&kind)
		if err == pgx.ErrNoRows {
			// A concurrent identical call recorded first; report its outcome.
			return tx.QueryRow(ctx, `SELECT kind FROM receipts WHERE idem_key = $1`, r.idemKey).Scan(&prior)
		}
		if err != nil {
			return err
		}
		if dispatched && dOutcome == nil {
			_, err = tx.Exec(ctx, `UPDATE read_dispatches SET outcome = $3, completed_at = now()
				WHERE subscription_id = $1 AND ordinal = $2 AND outcome IS NULL`, r.subscriptionID, r.ordinal, string(out))
		}
		return err
	})
	return out, err
}

// Digest returns the content digest mcpsync uses everywhere: "sha256:" and the lower-case hex
// SHA-256 of body.
func Digest(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// PutBlob stores body under its digest (content-addressed; storing it twice is a no-op) and
// returns the digest.
func (s *Store) PutBlob(ctx context.Context, body []byte, mimeType string) (string, error) {
	d := Digest(body)
	if body == nil {
		body = []byte{}
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO content_blobs (digest, mime_type, size, body) VALUES ($1, $2, $3, $4)
		ON CONFLICT (digest) DO NOTHING`, d, mimeType, len(body), body)
	if err != nil {
		return "", fmt.Errorf("ledger: put blob: %w", err)
	}
	return d, nil
}

// Blob returns the body stored under digest, or ErrNotFound.
func (s *Store) Blob(ctx context.Context, digest string) ([]byte, error) {
	var body []byte
	if err := s.pool.QueryRow(ctx, `SELECT body FROM content_blobs WHERE digest = $1`, digest).Scan(&body); err != nil {
		return nil, notFound(err, "ledger: blob "+digest)
	}
	return body, nil
}

// Version is a stored resourceVersion.v1 (R15).
type Version struct {
	ID                int64
	SubscriptionID    int64
	Principal         string
	SourceID          int64
	URI               string
	Kind              string // "content" or "tombstone"
	MIMEType          string
	Digest            string
	Size              int64
	ReadOrdinal       int64
	Generation        int64
	SessionGeneration int64
	RequestID         string
	AuthSubject       string
	ServerName        string
	ServerVersion     string
	LastModified      string
	AcceptedAt        time.Time
}

const versionColumns = `id, subscription_id, principal, source_id, uri, kind, mime_type,
	coalesce(digest, ''), size, read_ordinal, generation, session_generation, request_id,
	auth_subject, server_name, server_version, coalesce(last_modified, ''), accepted_at`

func scanVersion(row pgx.Row) (Version, error) {
	var v Version
	err := row.Scan(&v.ID, &v.SubscriptionID, &v.Principal, &v.SourceID, &v.URI, &v.Kind,
		&v.MIMEType, &v.Digest, &v.Size, &v.ReadOrdinal, &v.Generation, &v.SessionGeneration,
		&v.RequestID, &v.AuthSubject, &v.ServerName, &v.ServerVersion, &v.LastModified, &v.AcceptedAt)
	return v, err
}

// LatestVersion returns the newest accepted version (or tombstone) of a subscription, or
// ErrNotFound when none was ever accepted.
func (s *Store) LatestVersion(ctx context.Context, subscriptionID int64) (Version, error) {
	v, err := scanVersion(s.pool.QueryRow(ctx, `SELECT `+versionColumns+` FROM resource_versions
		WHERE subscription_id = $1 ORDER BY read_ordinal DESC LIMIT 1`, subscriptionID))
	if err != nil {
		return Version{}, notFound(err, fmt.Sprintf("ledger: version of subscription %d", subscriptionID))
	}
	return v, nil
}

// Versions returns every accepted version of a subscription in acceptance order.
func (s *Store) Versions(ctx context.Context, subscriptionID int64) ([]Version, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+versionColumns+` FROM resource_versions
		WHERE subscription_id = $1 ORDER BY id`, subscriptionID)
	if err != nil {
		return nil, fmt.Errorf("ledger: versions of subscription %d: %w", subscriptionID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Version, error) { return scanVersion(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: versions of subscription %d: %w", subscriptionID, err)
	}
	return out, nil
}

// Receipt is one recorded outcome or audited event.
type Receipt struct {
	ID                int64
	Kind              string
	SubscriptionID    *int64
	Generation        *int64
	SessionGeneration *int64
	ReadOrdinal       *int64
	RequestID         string
	URI               string
	Digest            string
	CreatedAt         time.Time
}

// Receipts returns the receipts of a subscription in the order they were written.
func (s *Store) Receipts(ctx context.Context, subscriptionID int64) ([]Receipt, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, kind, subscription_id, generation, session_generation,
			read_ordinal, coalesce(request_id, ''), coalesce(uri, ''), coalesce(digest, ''), created_at
		FROM receipts WHERE subscription_id = $1 ORDER BY id`, subscriptionID)
	if err != nil {
		return nil, fmt.Errorf("ledger: receipts of subscription %d: %w", subscriptionID, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Receipt])
	if err != nil {
		return nil, fmt.Errorf("ledger: receipts of subscription %d: %w", subscriptionID, err)
	}
	return out, nil
}
