package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcpsync/mcpsync"
)

// ErrNoGrant: the principal holds no standing grant on the source (never granted, or
// revoked). Errors that carry it are *GrantError.
var ErrNoGrant = errors.New("ledger: no standing grant")

// GrantError says which principal lacks a standing grant on which source. It matches
// ErrNoGrant with errors.Is.
type GrantError struct {
	Principal string
	SourceID  int64 // 0: any source
	// SourceName, when a caller that knows the source sets it, is what Error names the source
	// by instead of its row ID.
	SourceName string
	// RevocationID is the revocation that ended the grant, 0 when it was never granted (or
	// when the error is about any source).
	RevocationID int64
}

// Error says who lacks which grant.
func (e *GrantError) Error() string {
	what := fmt.Sprintf("principal %q holds no standing grant on source %d", e.Principal, e.SourceID)
	switch {
	case e.SourceName != "":
		what = fmt.Sprintf("principal %q holds no standing grant on source %q", e.Principal, e.SourceName)
	case e.SourceID == 0:
		what = fmt.Sprintf("principal %q holds no standing grant", e.Principal)
	}
	if e.RevocationID != 0 {
		what += fmt.Sprintf(" (revoked by revocation %d)", e.RevocationID)
	}
	return what
}

// Unwrap makes errors.Is(err, ErrNoGrant) hold.
func (e *GrantError) Unwrap() error { return ErrNoGrant }

// Grant is a principal's permission to read a source, standing while RevokedAt is nil.
type Grant struct {
	Principal    string
	SourceID     int64
	SourceName   string
	Epoch        int64 // raised by every grant that follows a revocation
	GrantedAt    time.Time
	GrantedBy    string
	RevokedAt    *time.Time
	RevocationID *int64
}

// Standing reports whether the grant is in force.
func (g Grant) Standing() bool { return g.RevokedAt == nil }

const grantColumns = `g.principal, g.source_id, so.name, g.epoch, g.granted_at, g.granted_by, g.revoked_at, g.revocation_id`

func scanGrant(row pgx.Row) (Grant, error) {
	var g Grant
	err := row.Scan(&g.Principal, &g.SourceID, &g.SourceName, &g.Epoch, &g.GrantedAt, &g.GrantedBy, &g.RevokedAt, &g.RevocationID)
	return g, err
}

// GrantAccess lets principal read source sourceID. Granting a standing grant again changes
// nothing (created=false); granting after a revocation stands the grant again under the next
// epoch. grantedBy says who or what granted it, for the record.
func (s *Store) GrantAccess(ctx context.Context, principal string, sourceID int64, grantedBy string) (g Grant, created bool, err error) {
	if principal == "" {
		return Grant{}, false, fmt.Errorf("ledger: grant: empty principal: %w", ErrInvalid)
	}
	g, err = scanGrant(s.pool.QueryRow(ctx, `
		WITH up AS (
			INSERT INTO grants AS g (principal, source_id, granted_by) VALUES ($1, $2, $3)
			ON CONFLICT (principal, source_id) DO UPDATE SET epoch = g.epoch + 1, granted_at = now(),
				granted_by = EXCLUDED.granted_by, revoked_at = NULL, revocation_id = NULL
			WHERE g.revoked_at IS NOT NULL
			RETURNING g.*)
		SELECT `+grantColumns+` FROM up g JOIN sources so ON so.id = g.source_id`, principal, sourceID, grantedBy))
	if err == nil {
		return g, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		if isForeignKeyViolation(err) {
			return Grant{}, false, fmt.Errorf("ledger: grant: source %d: %w", sourceID, ErrNotFound)
		}
		return Grant{}, false, fmt.Errorf("ledger: grant %q on source %d: %w", principal, sourceID, err)
	}
	g, err = s.GrantOf(ctx, principal, sourceID)
	return g, false, err
}

// GrantOf returns the grant of principal on a source, standing or revoked, or ErrNotFound when
// none was ever made.
func (s *Store) GrantOf(ctx context.Context, principal string, sourceID int64) (Grant, error) {
	g, err := scanGrant(s.pool.QueryRow(ctx, `SELECT `+grantColumns+`
		FROM grants g JOIN sources so ON so.id = g.source_id WHERE g.principal = $1 AND g.source_id = $2`, principal, sourceID))
	if err != nil {
		return Grant{}, notFound(err, fmt.Sprintf("ledger: grant of %q on source %d", principal, sourceID))
	}
	return g, nil
}

// Grants returns the grants of principal ("" = every principal), standing and revoked,
// ordered by principal and source name.
func (s *Store) Grants(ctx context.Context, principal string) ([]Grant, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+grantColumns+`
		FROM grants g JOIN sources so ON so.id = g.source_id
		WHERE $1 = '' OR g.principal = $1 ORDER BY g.principal, so.name`, principal)
	if err != nil {
		return nil, fmt.Errorf("ledger: list grants: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Grant, error) { return scanGrant(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: list grants: %w", err)
	}
	return out, nil
}

// CheckGrant returns nil if principal holds a standing grant on the source, else a
// *GrantError (errors.Is ErrNoGrant). It is an advisory check for commands that start work on
// the principal's behalf (subscribe); reads of content never rely on it: they join the grant
// in the statement that returns the content (Read).
func (s *Store) CheckGrant(ctx context.Context, principal string, sourceID int64) error {
	var standing bool
	var revocation *int64
	err := s.pool.QueryRow(ctx, `SELECT revoked_at IS NULL, revocation_id FROM grants WHERE principal = $1 AND source_id = $2`,
		principal, sourceID).Scan(&standing, &revocation)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return &GrantError{Principal: principal, SourceID: sourceID}
	case err != nil:
		return fmt.Errorf("ledger: check grant of %q on source %d: %w", principal, sourceID, err)
	case !standing:
		ge := &GrantError{Principal: principal, SourceID: sourceID}
		if revocation != nil {
			ge.RevocationID = *revocation
		}
		return ge
	}
	return nil
}

// RevokeRequest names the grants to revoke: principal's grant on SourceID, or every grant of
// the principal when SourceID is 0.
type RevokeRequest struct {
	Principal string
	SourceID  int64
	Reason    string
}

// RevokedGrant is a grant a revocation ended.
type RevokedGrant struct {
	SourceID   int64
	SourceName string
	Epoch      int64
}

// RevokedSubscription is a subscription of the principal that a revocation must close: its
// workflow is to be signalled (contract.SignalRevoke) so that it passes the close fence.
type RevokedSubscription struct {
	SubscriptionID    int64
	WorkflowID        string
	SourceName        string
	URI               string
	StateAtRevocation mcpsync.State
}

// IndexInvalidation is one derived index a revocation invalidated: the lineage entries it
// held through the principal and the outbox row that tells its consumers.
type IndexInvalidation struct {
	Index          string
	Entries        int
	OutboxKey      string
	OutboxID       int64
	AckedConsumers []string // consumers whose committed offset is at or past the row (trace only)
}

// Revocation is the trace of one revocation (R24): the grants it ended, the subscriptions it
// closed and every derived index it invalidated.
type Revocation struct {
	ID            int64
	Principal     string
	SourceID      *int64
	Reason        string
	RevokedAt     time.Time
	Grants        []RevokedGrant
	Subscriptions []RevokedSubscription
	Indexes       []IndexInvalidation
	OutboxKey     string // the outbox row announcing the revocation itself
}

// Outbox kinds written by revocations.
const (
	// OutboxRevocation announces a revocation (one row per revocation).
	OutboxRevocation = "revocation"
	// OutboxIndexInvalidation tells one derived index to drop the entries it took through the
	// revoked principal (one row per revocation and index); its detail lists them.
	OutboxIndexInvalidation = "index_invalidation"
)

// Revoke ends the principal's standing grants (one source, or all), in one transaction that
// also invalidates every derived index holding content obtained through them (R24): the
// index's live lineage entries are stamped with the revocation and one outbox row per index
// lists them; the subscriptions of the principal on those sources that are not CLOSED are
// recorded for the caller to signal through the close fence; one more outbox row announces
// the revocation. The grant row is updated first: that update waits for every read holding
// the grant (Read locks it) and every later read finds it revoked, so the lineage the
// transaction then reads is complete and no read straddles the revocation. It fails with a
// *GrantError when no standing grant matches.
func (s *Store) Revoke(ctx context.Context, req RevokeRequest) (Revocation, error) {
	if req.Principal == "" {
		return Revocation{}, fmt.Errorf("ledger: revoke: empty principal: %w", ErrInvalid)
	}
	rv := Revocation{Principal: req.Principal, Reason: req.Reason}
	if req.SourceID != 0 {
		rv.SourceID = &req.SourceID
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		if rv.ID, rv.RevokedAt, err = insertRevocation(ctx, tx, req, rv.SourceID); err != nil {
			return err
		}
		// The fence: revoke the grant rows. This waits for reads that hold them.
		if rv.Grants, err = revokeGrants(ctx, tx, req, rv.ID); err != nil {
			return err
		}
		sources := make([]int64, len(rv.Grants))
		for i, g := range rv.Grants {
			sources[i] = g.SourceID
		}
		// A new statement, so a new snapshot: it sees the lineage of every read that held the
		// grant until the update above could take it.
		if rv.Indexes, err = invalidateIndexes(ctx, tx, rv.ID, req.Principal, sources, rv.SourceID); err != nil {
			return err
		}
		if rv.Subscriptions, err = recordRevokedSubscriptions(ctx, tx, rv.ID, req.Principal, sources); err != nil {
			return err
		}
		rv.OutboxKey = fmt.Sprintf("revocation/%d", rv.ID)
		return announceRevocation(ctx, tx, rv, sources)
	})
	if err != nil {
		var ge *GrantError
		if errors.As(err, &ge) || errors.Is(err, ErrNotFound) {
			return Revocation{}, fmt.Errorf("ledger: revoke: %w", err)
		}
		return Revocation{}, fmt.Errorf("ledger: revoke %q: %w", req.Principal, err)
	}
	return rv, nil
}

// insertRevocation writes the revocation row, the first statement of Revoke's transaction.
func insertRevocation(ctx context.Context, tx pgx.Tx, req RevokeRequest, sourceID *int64) (int64, time.Time, error) {
	var id int64
	var at time.Time
	if err := tx.QueryRow(ctx, `INSERT INTO revocations (principal, source_id, reason) VALUES ($1, $2, $3)
			RETURNING id, revoked_at`, req.Principal, sourceID, req.Reason).Scan(&id, &at); err != nil {
		if isForeignKeyViolation(err) {
			return 0, time.Time{}, fmt.Errorf("source %d: %w", req.SourceID, ErrNotFound)
		}
		return 0, time.Time{}, err
	}
	return id, at, nil
}

// revokeGrants revokes the principal's standing grants (the fence of Revoke): the UPDATE waits
// for every read holding one. It fails with a *GrantError when none matches.
func revokeGrants(ctx context.Context, tx pgx.Tx, req RevokeRequest, revocationID int64) ([]RevokedGrant, error) {
	sql, args := revokeGrantsStatement(req.Principal, revocationID, req.SourceID)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	grants, err := pgx.CollectRows(rows, pgx.RowToStructByPos[RevokedGrant])
	if err != nil {
		return nil, err
	}
	if len(grants) == 0 {
		return nil, &GrantError{Principal: req.Principal, SourceID: req.SourceID}
	}
	return grants, nil
}

// revokeGrantsStatement is revokeGrants' statement for principal's grant on sourceID (0: on
// every source) as revocation revocationID, with its arguments.
func revokeGrantsStatement(principal string, revocationID, sourceID int64) (string, []any) {
	if sourceID == 0 {
		return revokeGrantsSQL(false), []any{principal, revocationID}
	}
	return revokeGrantsSQL(true), []any{principal, revocationID, sourceID}
}

// revokeGrantsSQL is revokeGrants' statement: $1 the principal, $2 the revocation and, when
// oneSource, $3 the source. For one source its WHERE names the grant's whole key, so the UPDATE
// reads that one row under any plan, however many sources the principal holds grants on (a
// predicate like "$3 = 0 OR source_id = $3" leaves the source out of the index condition of
// the generic plan a prepared statement settles on: every grant of the principal is read).
func revokeGrantsSQL(oneSource bool) string {
	where := "principal = $1 AND revoked_at IS NULL"
	if oneSource {
		where += " AND source_id = $3"
	}
	return `
		WITH g AS (
			UPDATE grants SET revoked_at = now(), revocation_id = $2
			WHERE ` + where + `
			RETURNING source_id, epoch),
		rg AS (
			INSERT INTO revocation_grants (revocation_id, source_id, grant_epoch)
			SELECT $2, source_id, epoch FROM g RETURNING source_id)
		SELECT g.source_id, so.name, g.epoch FROM g JOIN sources so ON so.id = g.source_id ORDER BY so.name`
}

// invalidateIndexesSQL is invalidateIndexes' statement: $1 the revocation, $2 the principal, $3
// the sources, $4 the one source revoked (NULL: all).
const invalidateIndexesSQL = `
		WITH lin AS (
			UPDATE index_lineage l SET revocation_id = $1, invalidated_at = now()
			FROM (SELECT e.id FROM unnest($3::bigint[]) AS src(id) CROSS JOIN LATERAL (
					SELECT id FROM index_lineage
					WHERE principal = $2 AND source_id = src.id AND revocation_id IS NULL OFFSET 0) e) m
			WHERE l.id = m.id AND l.revocation_id IS NULL
			RETURNING l.id, l.index_name, l.source_id, l.uri, l.version_id, l.read_ordinal, l.digest, l.delivered_digest),
		per AS (
			SELECT lin.index_name, count(*) AS entries,
			       jsonb_agg(jsonb_build_object('lineage', lin.id, 'source', so.name, 'uri', lin.uri,
			           'version', lin.version_id, 'readOrdinal', lin.read_ordinal, 'digest', lin.digest,
			           'deliveredDigest', lin.delivered_digest) ORDER BY lin.id) AS list
			FROM lin JOIN sources so ON so.id = lin.source_id
			GROUP BY lin.index_name),
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, principal, source_id, detail)
			SELECT '` + OutboxIndexInvalidation + `', 'revocation/' || $1 || '/index/' || per.index_name, $2, $4,
			       jsonb_build_object('revocation', $1::bigint, 'index', per.index_name, 'principal', $2::text,
			           'entries', per.list)
			FROM per ORDER BY per.index_name
			RETURNING id, idempotency_key),
		ri AS (
			INSERT INTO revocation_indexes (revocation_id, index_name, entries, outbox_key)
			SELECT $1, per.index_name, per.entries, 'revocation/' || $1 || '/index/' || per.index_name FROM per
			RETURNING index_name)
		SELECT per.index_name, per.entries::int, ob.idempotency_key, ob.id
		FROM per JOIN ob ON ob.idempotency_key = 'revocation/' || $1 || '/index/' || per.index_name
		ORDER BY per.index_name`

// invalidateIndexes stamps the principal's live lineage entries on sources with the
// revocation and writes one outbox row per derived index listing them (R24). Each source is
// looked up by (principal, source) in a LATERAL subquery that OFFSET 0 keeps from being
// flattened, so no plan reads every live entry of the principal ("source_id = ANY($3)" was
// left to a filter under a generic plan).
func invalidateIndexes(ctx context.Context, tx pgx.Tx, revocationID int64, principal string, sources []int64, sourceID *int64) ([]IndexInvalidation, error) {
	sql, args := invalidateIndexesStatement(revocationID, principal, sources, sourceID)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (IndexInvalidation, error) {
		var ix IndexInvalidation
		err := r.Scan(&ix.Index, &ix.Entries, &ix.OutboxKey, &ix.OutboxID)
		return ix, err
	})
}

// invalidateIndexesStatement is invalidateIndexes' statement with its arguments.
func invalidateIndexesStatement(revocationID int64, principal string, sources []int64, sourceID *int64) (string, []any) {
	return invalidateIndexesSQL, []any{revocationID, principal, sources, sourceID}
}

// recordRevokedSubscriptionsSQL is recordRevokedSubscriptions' statement: $1 the revocation,
// $2 the principal, $3 the sources.
const recordRevokedSubscriptionsSQL = `
		WITH ins AS (
			INSERT INTO revocation_subscriptions (revocation_id, subscription_id, workflow_id, state_at_revocation)
			SELECT $1, s.id, s.workflow_id, s.state FROM unnest($3::bigint[]) AS src(id) CROSS JOIN LATERAL (
				SELECT id, workflow_id, state FROM subscriptions
				WHERE principal = $2 AND source_id = src.id AND state <> 'CLOSED' OFFSET 0) s
			RETURNING subscription_id, workflow_id, state_at_revocation)
		SELECT ins.subscription_id, ins.workflow_id, so.name, s.uri, ins.state_at_revocation
		FROM ins JOIN subscriptions s ON s.id = ins.subscription_id JOIN sources so ON so.id = s.source_id
		ORDER BY ins.subscription_id`

// recordRevokedSubscriptions records the principal's subscriptions on sources that are not
// CLOSED, for the caller to signal through the close fence. Like invalidateIndexes it looks
// each source up by (principal, source), not every subscription of the principal.
func recordRevokedSubscriptions(ctx context.Context, tx pgx.Tx, revocationID int64, principal string, sources []int64) ([]RevokedSubscription, error) {
	sql, args := recordRevokedSubscriptionsStatement(revocationID, principal, sources)
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[RevokedSubscription])
}

// recordRevokedSubscriptionsStatement is recordRevokedSubscriptions' statement with its
// arguments.
func recordRevokedSubscriptionsStatement(revocationID int64, principal string, sources []int64) (string, []any) {
	return recordRevokedSubscriptionsSQL, []any{revocationID, principal, sources}
}

// announceRevocation writes the outbox row announcing the revocation itself, the last
// statement of Revoke's transaction.
func announceRevocation(ctx context.Context, tx pgx.Tx, rv Revocation, sources []int64) error {
	indexes := make([]string, len(rv.Indexes))
	for i, ix := range rv.Indexes {
		indexes[i] = ix.Index
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO invalidation_outbox (kind, idempotency_key, principal, source_id, detail)
		VALUES ('`+OutboxRevocation+`', $1, $2, $3, jsonb_build_object('revocation', $4::bigint, 'principal', $2::text,
			'sources', $5::bigint[], 'indexes', $6::text[], 'subscriptions', $7::int, 'reason', $8::text))`,
		rv.OutboxKey, rv.Principal, rv.SourceID, rv.ID, sources, indexes, len(rv.Subscriptions), rv.Reason)
	return err
}

// OpenSubscriptionsOf returns the subscriptions of principal (on one source, or all when
// sourceID is 0) that are not CLOSED, for signalling them again after a revocation whose
// signals did not all arrive.
func (s *Store) OpenSubscriptionsOf(ctx context.Context, principal string, sourceID int64) ([]RevokedSubscription, error) {
	rows, err := s.pool.Query(ctx, `SELECT s.id, s.workflow_id, so.name, s.uri, s.state
		FROM subscriptions s JOIN sources so ON so.id = s.source_id
		WHERE s.principal = $1 AND ($2 = 0 OR s.source_id = $2) AND s.state <> 'CLOSED'
		ORDER BY s.id`, principal, sourceID)
	if err != nil {
		return nil, fmt.Errorf("ledger: open subscriptions of %q: %w", principal, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[RevokedSubscription])
	if err != nil {
		return nil, fmt.Errorf("ledger: open subscriptions of %q: %w", principal, err)
	}
	return out, nil
}

// RevocationByID returns the stored trace of a revocation, with the consumers that have
// committed each index invalidation, or ErrNotFound.
func (s *Store) RevocationByID(ctx context.Context, id int64) (Revocation, error) {
	rv := Revocation{ID: id, OutboxKey: fmt.Sprintf("revocation/%d", id)}
	err := s.pool.QueryRow(ctx, `SELECT principal, source_id, reason, revoked_at FROM revocations WHERE id = $1`, id).
		Scan(&rv.Principal, &rv.SourceID, &rv.Reason, &rv.RevokedAt)
	if err != nil {
		return Revocation{}, notFound(err, fmt.Sprintf("ledger: revocation %d", id))
	}
	rows, err := s.pool.Query(ctx, `SELECT rg.source_id, so.name, rg.grant_epoch FROM revocation_grants rg
		JOIN sources so ON so.id = rg.source_id WHERE rg.revocation_id = $1 ORDER BY so.name`, id)
	if err != nil {
		return Revocation{}, fmt.Errorf("ledger: revocation %d: %w", id, err)
	}
	if rv.Grants, err = pgx.CollectRows(rows, pgx.RowToStructByPos[RevokedGrant]); err != nil {
		return Revocation{}, fmt.Errorf("ledger: revocation %d: %w", id, err)
	}
	rows, err = s.pool.Query(ctx, `SELECT rs.subscription_id, rs.workflow_id, so.name, s.uri, rs.state_at_revocation
		FROM revocation_subscriptions rs JOIN subscriptions s ON s.id = rs.subscription_id
		JOIN sources so ON so.id = s.source_id WHERE rs.revocation_id = $1 ORDER BY rs.subscription_id`, id)
	if err != nil {
		return Revocation{}, fmt.Errorf("ledger: revocation %d: %w", id, err)
	}
	if rv.Subscriptions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[RevokedSubscription]); err != nil {
		return Revocation{}, fmt.Errorf("ledger: revocation %d: %w", id, err)
	}
	rows, err = s.pool.Query(ctx, `SELECT ri.index_name, ri.entries, ri.outbox_key, o.id,
			coalesce(array(SELECT c.name FROM outbox_consumers c WHERE (c.txid, c.last_id) >= (o.txid, o.id) ORDER BY c.name), '{}')
		FROM revocation_indexes ri JOIN invalidation_outbox o ON o.idempotency_key = ri.outbox_key
		WHERE ri.revocation_id = $1 ORDER BY ri.index_name`, id)
	if err != nil {
		return Revocation{}, fmt.Errorf("ledger: revocation %d: %w", id, err)
	}
	rv.Indexes, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (IndexInvalidation, error) {
		var ix IndexInvalidation
		err := r.Scan(&ix.Index, &ix.Entries, &ix.OutboxKey, &ix.OutboxID, &ix.AckedConsumers)
		return ix, err
	})
	if err != nil {
		return Revocation{}, fmt.Errorf("ledger: revocation %d: %w", id, err)
	}
	return rv, nil
}

// isForeignKeyViolation reports a statement refused because a referenced row does not exist.
func isForeignKeyViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23503"
}

// SubscriptionStates returns the current state of each subscription in ids; ids that do not
// exist are absent from the map.
func (s *Store) SubscriptionStates(ctx context.Context, ids []int64) (map[int64]mcpsync.State, error) {
	out := make(map[int64]mcpsync.State, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id, state FROM subscriptions WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("ledger: subscription states: %w", err)
	}
	var id int64
	var st mcpsync.State
	_, err = pgx.ForEachRow(rows, []any{&id, &st}, func() error {
		out[id] = st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: subscription states: %w", err)
	}
	return out, nil
}
