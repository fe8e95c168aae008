package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Guard verdict outcomes as the ledger stores them.
const (
	VerdictPass      = "PASS"      // delivered as accepted
	VerdictSanitized = "SANITIZED" // delivered after the guard removed characters
	VerdictRejected  = "REJECTED"  // never delivered
)

// ErrGuardRejected: the output guard rejected the content, so it is not delivered. Errors
// that carry it are *GuardRefusal.
var ErrGuardRejected = errors.New("ledger: content rejected by the output guard")

// GuardRefusal says which verdict refused a read. It matches ErrGuardRejected with errors.Is.
type GuardRefusal struct {
	Verdict GuardVerdict
}

// Error names the content, the policy and the reasons of the rejection.
func (e *GuardRefusal) Error() string {
	return fmt.Sprintf("content %s rejected by output guard policy %s: %s", e.Verdict.Digest, e.Verdict.PolicyID,
		strings.Join(e.Verdict.Reasons, "; "))
}

// Unwrap makes errors.Is(err, ErrGuardRejected) hold.
func (e *GuardRefusal) Unwrap() error { return ErrGuardRejected }

// GuardVerdict is the output guard's stored verdict on one content digest under one policy
// (R22). DeliveredDigest names the bytes that may reach a model: Digest itself for PASS, the
// sanitized bytes for SANITIZED, none for REJECTED.
type GuardVerdict struct {
	Digest          string
	PolicyID        string
	Policy          string
	Outcome         string
	Reasons         []string
	DeliveredDigest string
	Stripped        int
	CheckedAt       time.Time
}

// Delivers reports whether the verdict lets content through.
func (v GuardVerdict) Delivers() bool {
	return v.Outcome == VerdictPass || v.Outcome == VerdictSanitized
}

// StoreVerdict records the guard's verdict on v.Digest under v.PolicyID, with delivered (the
// sanitized bytes) stored as a blob for SANITIZED. A verdict is a function of the content and
// the policy, so the first stored verdict stands and is returned.
func (s *Store) StoreVerdict(ctx context.Context, v GuardVerdict, delivered []byte) (GuardVerdict, error) {
	switch v.Outcome {
	case VerdictPass:
		v.DeliveredDigest = v.Digest
	case VerdictSanitized:
		d, err := s.PutBlob(ctx, delivered, "")
		if err != nil {
			return GuardVerdict{}, err
		}
		v.DeliveredDigest = d
	case VerdictRejected:
		v.DeliveredDigest = ""
	default:
		return GuardVerdict{}, fmt.Errorf("ledger: store verdict: outcome %q: %w", v.Outcome, ErrInvalid)
	}
	if v.Digest == "" || v.PolicyID == "" {
		return GuardVerdict{}, fmt.Errorf("ledger: store verdict: digest %q, policy %q: %w", v.Digest, v.PolicyID, ErrInvalid)
	}
	if v.Reasons == nil {
		v.Reasons = []string{}
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO guard_verdicts (digest, policy_id, policy, outcome, reasons, delivered_digest, stripped)
		VALUES ($1, $2, $3, $4, $5, nullif($6, ''), $7) ON CONFLICT (digest, policy_id) DO NOTHING`,
		v.Digest, v.PolicyID, v.Policy, v.Outcome, v.Reasons, v.DeliveredDigest, v.Stripped)
	if err != nil {
		return GuardVerdict{}, fmt.Errorf("ledger: store verdict on %s: %w", v.Digest, err)
	}
	return s.Verdict(ctx, v.Digest, v.PolicyID)
}

// Verdict returns the stored verdict on digest under policyID, or ErrNotFound.
func (s *Store) Verdict(ctx context.Context, digest, policyID string) (GuardVerdict, error) {
	v := GuardVerdict{Digest: digest, PolicyID: policyID}
	var delivered *string
	err := s.pool.QueryRow(ctx, `SELECT policy, outcome, reasons, delivered_digest, stripped, checked_at
		FROM guard_verdicts WHERE digest = $1 AND policy_id = $2`, digest, policyID).
		Scan(&v.Policy, &v.Outcome, &v.Reasons, &delivered, &v.Stripped, &v.CheckedAt)
	if err != nil {
		return GuardVerdict{}, notFound(err, fmt.Sprintf("ledger: verdict on %s under %s", digest, policyID))
	}
	if delivered != nil {
		v.DeliveredDigest = *delivered
	}
	return v, nil
}

// ReadRequest asks for the newest accepted version of (principal, source, URI) as a consumer
// sees it: through the principal's grant and the output guard policy PolicyID. ForIndex, if
// set, names the derived index that takes the content; its lineage is recorded.
type ReadRequest struct {
	Principal string
	SourceID  int64
	URI       string // normalized
	PolicyID  string
	ForIndex  string
}

// ReadResult is a consumer read. Body holds the bytes the guard lets through (the accepted
// body, or its sanitized form); it is nil unless the read delivered content.
type ReadResult struct {
	GrantEpoch     int64
	SubscriptionID int64
	SourceName     string
	State          mcpsync.State
	StateReason    string
	LastVerifiedAt *time.Time
	// Refresh is how the subscription learns of changes while its session is live: "notify"
	// (resources.subscribe plus a backstop re-read) or "poll" (R11); "" when the
	// subscription is not live on the source's current session. StalenessBoundSeconds is then
	// one refresh period plus its ±20 % jitter (the bound status reports), else 0: unbounded.
	// NotAcknowledged: the server left the URI out of its 2026-07-28 subscriptions/listen
	// acknowledgement on the live session, so Refresh is "poll" whatever the session's
	// capabilities say (issue 13 item 3, R11); false when the subscription is not live.
	Refresh               string
	StalenessBoundSeconds int
	NotAcknowledged       bool
	Version               Version
	Verdict               *GuardVerdict
	Body                  []byte
	LineageID             int64 // the lineage entry ForIndex recorded (0 when none)
}

// Evaluator runs the output guard on a version's accepted body under the request's policy. It
// returns the verdict (Outcome, Reasons, Stripped, Policy) and, for SANITIZED, the bytes that
// may be delivered.
type Evaluator func(ctx context.Context, v Version, body []byte) (GuardVerdict, []byte, error)

// Read returns the newest accepted version of (principal, source, URI) with its freshness,
// only while the principal's grant on the source stands and only through the output guard
// (R22, R23 "cache hit after permission revocation"). One statement locks the grant row
// (FOR SHARE), finds the version and its stored verdict, returns the deliverable bytes and,
// with ForIndex, records the lineage entry; a revocation updates the grant row, so it waits
// for this statement and every later one finds the grant revoked: once a revocation has
// committed, no read returns a single byte to that principal. When no verdict is stored yet,
// eval runs on the accepted body, its verdict is stored, and the statement runs again: the
// bytes delivered always come from a statement that held the grant.
//
// Errors: a *GrantError (ErrNoGrant) without a standing grant; ErrNotFound when the principal
// has no subscription to the URI, no version was accepted yet, or the newest version is a
// tombstone (the result then describes what exists); a *GuardRefusal (ErrGuardRejected) when
// the guard rejected the content.
func (s *Store) Read(ctx context.Context, req ReadRequest, eval Evaluator) (ReadResult, error) {
	if req.Principal == "" || req.URI == "" || req.PolicyID == "" {
		return ReadResult{}, fmt.Errorf("ledger: read: principal %q, uri %q, policy %q: %w", req.Principal, req.URI, req.PolicyID, ErrInvalid)
	}
	for attempt := 0; ; attempt++ {
		res, err := s.readOnce(ctx, req)
		if err != nil {
			return res, err
		}
		if res.Verdict != nil || attempt > 0 {
			if res.Verdict == nil {
				return res, fmt.Errorf("ledger: read: verdict on %s under %s vanished", res.Version.Digest, req.PolicyID)
			}
			if !res.Verdict.Delivers() {
				return res, &GuardRefusal{Verdict: *res.Verdict}
			}
			return res, nil
		}
		if eval == nil {
			return res, fmt.Errorf("ledger: read: no verdict on %s under %s and no evaluator: %w", res.Version.Digest, req.PolicyID, ErrInvalid)
		}
		body := res.Body
		res.Body = nil
		v, delivered, err := eval(ctx, res.Version, body)
		if err != nil {
			return ReadResult{}, fmt.Errorf("ledger: read: output guard on %s: %w", res.Version.Digest, err)
		}
		v.Digest, v.PolicyID = res.Version.Digest, req.PolicyID
		if _, err := s.StoreVerdict(ctx, v, delivered); err != nil {
			return ReadResult{}, err
		}
	}
}

const readSQL = `
	WITH g AS MATERIALIZED (
		SELECT epoch FROM grants
		WHERE principal = $1 AND source_id = $2 AND revoked_at IS NULL
		FOR SHARE),
	s AS MATERIALIZED (
		SELECT id, state, state_reason, session_generation, last_verified_at, not_acknowledged,
		       mcpsync_published(workflow_id) AS published FROM subscriptions
		WHERE principal = $1 AND source_id = $2 AND uri = $3 AND EXISTS (SELECT 1 FROM g)),
	v AS MATERIALIZED (
		SELECT * FROM resource_versions WHERE subscription_id = (SELECT id FROM s WHERE published)
		ORDER BY read_ordinal DESC LIMIT 1),
	gv AS MATERIALIZED (
		SELECT * FROM guard_verdicts WHERE digest = (SELECT digest FROM v) AND policy_id = $4),
	lin AS (
		INSERT INTO index_lineage AS l (index_name, principal, source_id, subscription_id, uri, version_id,
			read_ordinal, digest, delivered_digest, policy_id, grant_epoch)
		SELECT $5, $1, $2, v.subscription_id, v.uri, v.id, v.read_ordinal, v.digest, gv.delivered_digest, $4, g.epoch
		FROM g, v, gv
		WHERE $5 <> '' AND v.kind = 'content' AND gv.outcome IN ('PASS', 'SANITIZED')
		ON CONFLICT (index_name, principal, version_id) WHERE revocation_id IS NULL
		DO UPDATE SET last_taken_at = now(), takes = l.takes + 1
		RETURNING id),
	sess AS (
		SELECT so.name, se.generation, se.cap_subscribe, so.backstop_seconds, so.poll_seconds
		FROM sources so LEFT JOIN sessions se
		  ON se.source_id = so.id AND se.generation = so.current_generation AND se.ended_at IS NULL
		WHERE so.id = $2)
	SELECT (SELECT epoch FROM g), s.id, s.state, s.state_reason, s.session_generation, s.last_verified_at, s.published,
	       s.not_acknowledged,
	       sess.name, sess.generation, sess.cap_subscribe, sess.backstop_seconds, sess.poll_seconds,
	       v.id, v.subscription_id, v.principal, v.source_id, v.uri, v.kind, v.mime_type, v.digest, v.size,
	       v.read_ordinal, v.generation, v.session_generation, v.request_id, v.auth_subject, v.server_name,
	       v.server_version, v.last_modified, v.accepted_at,
	       gv.policy, gv.outcome, gv.reasons, gv.delivered_digest, gv.stripped, gv.checked_at,
	       CASE WHEN v.kind = 'content' AND gv.digest IS NULL
	                THEN (SELECT body FROM content_blobs WHERE digest = v.digest)
	            WHEN v.kind = 'content' AND gv.outcome IN ('PASS', 'SANITIZED')
	                THEN (SELECT body FROM content_blobs WHERE digest = gv.delivered_digest) END,
	       (SELECT id FROM lin)
	FROM (SELECT 1) one LEFT JOIN s ON true LEFT JOIN v ON true LEFT JOIN gv ON true LEFT JOIN sess ON true`

// readRow holds the nullable columns of readSQL.
type readRow struct {
	epoch, subID, subSessGen                                *int64
	published, notAcknowledged                              *bool
	state, reason, sourceName                               *string
	verified                                                *time.Time
	sessGen                                                 *int64
	capSubscribe                                            *bool
	backstop, poll                                          *int
	vID, vSub, vSource, vSize, vOrd, vGen, vSessGen         *int64
	vPrincipal, vURI, vKind, vMIME, vDigest, vReq, vSubject *string
	vServerName, vServerVersion, vLastModified              *string
	vAccepted                                               *time.Time
	gvPolicy, gvOutcome, gvDelivered                        *string
	gvReasons                                               []string
	gvStripped                                              *int
	gvChecked                                               *time.Time
	body                                                    []byte
	lineage                                                 *int64
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func (s *Store) readOnce(ctx context.Context, req ReadRequest) (ReadResult, error) {
	var r readRow
	err := s.pool.QueryRow(ctx, readSQL, req.Principal, req.SourceID, req.URI, req.PolicyID, req.ForIndex).Scan(
		&r.epoch, &r.subID, &r.state, &r.reason, &r.subSessGen, &r.verified, &r.published, &r.notAcknowledged,
		&r.sourceName, &r.sessGen, &r.capSubscribe, &r.backstop, &r.poll,
		&r.vID, &r.vSub, &r.vPrincipal, &r.vSource, &r.vURI, &r.vKind, &r.vMIME, &r.vDigest, &r.vSize,
		&r.vOrd, &r.vGen, &r.vSessGen, &r.vReq, &r.vSubject, &r.vServerName,
		&r.vServerVersion, &r.vLastModified, &r.vAccepted,
		&r.gvPolicy, &r.gvOutcome, &r.gvReasons, &r.gvDelivered, &r.gvStripped, &r.gvChecked,
		&r.body, &r.lineage)
	if err != nil {
		return ReadResult{}, fmt.Errorf("ledger: read %s for %q: %w", req.URI, req.Principal, err)
	}
	if r.sourceName == nil {
		return ReadResult{}, fmt.Errorf("ledger: read: source %d: %w", req.SourceID, ErrNotFound)
	}
	if r.epoch == nil {
		if err := s.CheckGrant(ctx, req.Principal, req.SourceID); err != nil {
			return ReadResult{}, err
		}
		// Granted again since the statement ran: still nothing was read.
		return ReadResult{}, &GrantError{Principal: req.Principal, SourceID: req.SourceID}
	}
	res := ReadResult{GrantEpoch: *r.epoch, SourceName: *r.sourceName}
	if r.subID == nil {
		return res, fmt.Errorf("ledger: no subscription of %q to %s on %s: %w", req.Principal, req.URI, res.SourceName, ErrNotFound)
	}
	res.SubscriptionID, res.State, res.StateReason, res.LastVerifiedAt = *r.subID, mcpsync.State(*r.state), *r.reason, r.verified
	if (res.State == mcpsync.StateActive || res.State == mcpsync.StateTombstonePending) && r.sessGen != nil && *r.sessGen == deref(r.subSessGen) {
		period := deref(r.poll)
		res.Refresh = "poll"
		// A URI the server left out of its subscriptions/listen acknowledgement on this
		// session is not watched: it polls, never real-time (issue 13 item 3, R11).
		res.NotAcknowledged = deref(r.notAcknowledged)
		if deref(r.capSubscribe) && !res.NotAcknowledged {
			period, res.Refresh = deref(r.backstop), "notify"
		}
		res.StalenessBoundSeconds = period + (period+4)/5
	}
	if !deref(r.published) {
		return res, fmt.Errorf("ledger: %s of %q: %w (shadow mode or outside the refresh percentage; see mcpsync rollout)", req.URI, req.Principal, ErrNotPublished)
	}
	if r.vID == nil {
		return res, fmt.Errorf("ledger: no accepted version of %s yet (state %s): %w", req.URI, res.State, ErrNotFound)
	}
	res.Version = Version{
		ID: *r.vID, SubscriptionID: deref(r.vSub), Principal: deref(r.vPrincipal), SourceID: deref(r.vSource),
		URI: deref(r.vURI), Kind: deref(r.vKind), MIMEType: deref(r.vMIME), Digest: deref(r.vDigest),
		Size: deref(r.vSize), ReadOrdinal: deref(r.vOrd), Generation: deref(r.vGen),
		SessionGeneration: deref(r.vSessGen), RequestID: deref(r.vReq), AuthSubject: deref(r.vSubject),
		ServerName: deref(r.vServerName), ServerVersion: deref(r.vServerVersion),
		LastModified: deref(r.vLastModified), AcceptedAt: deref(r.vAccepted),
	}
	if res.Version.Kind != "content" {
		return res, fmt.Errorf("ledger: %s was deleted (tombstone at ordinal %d): %w", req.URI, res.Version.ReadOrdinal, ErrNotFound)
	}
	if r.gvOutcome != nil {
		res.Verdict = &GuardVerdict{
			Digest: res.Version.Digest, PolicyID: req.PolicyID, Policy: deref(r.gvPolicy), Outcome: *r.gvOutcome,
			Reasons: r.gvReasons, DeliveredDigest: deref(r.gvDelivered), Stripped: deref(r.gvStripped),
			CheckedAt: deref(r.gvChecked),
		}
	}
	res.Body = r.body
	if res.Body == nil && (res.Verdict == nil || res.Verdict.Delivers()) {
		return res, fmt.Errorf("ledger: read: blob of %s: %w", res.Version.Digest, ErrNotFound)
	}
	res.LineageID = deref(r.lineage)
	return res, nil
}

// LineageEntry records that a derived index took one version through a principal (R24).
// RevocationID is set once a revocation invalidated the entry.
type LineageEntry struct {
	ID              int64
	Index           string
	Principal       string
	SourceName      string
	URI             string
	VersionID       int64
	ReadOrdinal     int64
	Digest          string
	DeliveredDigest string
	PolicyID        string
	GrantEpoch      int64
	FirstTakenAt    time.Time
	LastTakenAt     time.Time
	Takes           int64
	RevocationID    *int64
	InvalidatedAt   *time.Time
}

// LineageFilter narrows Lineage; zero fields match everything.
type LineageFilter struct {
	Index        string
	Principal    string
	RevocationID int64
	LiveOnly     bool // only entries no revocation invalidated
}

// Lineage returns the lineage entries matching f in the order they were first taken.
func (s *Store) Lineage(ctx context.Context, f LineageFilter) ([]LineageEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT l.id, l.index_name, l.principal, so.name, l.uri, l.version_id,
			l.read_ordinal, l.digest, l.delivered_digest, l.policy_id, l.grant_epoch, l.first_taken_at,
			l.last_taken_at, l.takes, l.revocation_id, l.invalidated_at
		FROM index_lineage l JOIN sources so ON so.id = l.source_id
		WHERE ($1 = '' OR l.index_name = $1) AND ($2 = '' OR l.principal = $2)
		  AND ($3 = 0 OR l.revocation_id = $3) AND (NOT $4 OR l.revocation_id IS NULL)
		ORDER BY l.id`, f.Index, f.Principal, f.RevocationID, f.LiveOnly)
	if err != nil {
		return nil, fmt.Errorf("ledger: lineage: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[LineageEntry])
	if err != nil {
		return nil, fmt.Errorf("ledger: lineage: %w", err)
	}
	return out, nil
}

// UntracedLineage counts lineage entries a revocation should have invalidated but did not:
// live entries whose grant no longer stands, or stands again under a later epoch than the
// one the content was taken under. R24 ("a permission revocation can be traced to every
// derived index") holds when it is zero; Read and Revoke keep it zero.
func (s *Store) UntracedLineage(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM index_lineage l
		LEFT JOIN grants g ON g.principal = l.principal AND g.source_id = l.source_id
		WHERE l.revocation_id IS NULL AND (g.principal IS NULL OR g.revoked_at IS NOT NULL OR g.epoch <> l.grant_epoch)`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("ledger: untraced lineage: %w", err)
	}
	return n, nil
}
