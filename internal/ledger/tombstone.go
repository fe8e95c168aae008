package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// ConfirmTombstoneRequest confirms the deletion of a TOMBSTONE_PENDING subscription's resource
// with a published catalog.
type ConfirmTombstoneRequest struct {
	SubscriptionID int64
	Generation     int64
	CatalogID      int64
}

func (r ConfirmTombstoneRequest) idemKey() string {
	return fmt.Sprintf("tombstone/%d/%d/%d", r.SubscriptionID, r.Generation, r.CatalogID)
}

// TombstoneResult is the outcome of ConfirmTombstone. Transitioned (or AlreadyDone for a
// replay): the subscription is UNSUBSCRIBING with its close fence frozen at CloseOrdinal and
// CloseEpoch, and a tombstone version (VersionID, at ReadOrdinal) and a 'tombstone'
// invalidation were written. Refused: Refusal says why and nothing changed.
type TombstoneResult struct {
	Outcome      mcpsync.Outcome
	Refusal      mcpsync.TombstoneRefusal
	State        mcpsync.State
	ReadOrdinal  int64
	CloseOrdinal int64
	CloseEpoch   int64
	VersionID    int64
}

// ConfirmTombstone confirms a deletion by list reconciliation (R21) in one statement whose
// WHERE clause carries the whole fence: the subscription is TOMBSTONE_PENDING in generation
// Generation; its not-found read (the dispatch at last_accepted_ordinal, outcome
// TOMBSTONE_PENDING) is on the subscription's session generation; the catalog is of the same
// source and session generation, SNAPSHOT_PROVEN or SNAPSHOT_UNPROVEN, not invalidated, its
// rounds started after that read was dispatched, and it does not list the subscription's
// URI. Then, atomically: TOMBSTONE_PENDING → UNSUBSCRIBING with the close fence
// (close_ordinal = last_issued_ordinal, close_epoch + 1, R18), a resourceVersion.v1 of kind
// 'tombstone' at the not-found read's ordinal, a 'tombstone' invalidation outbox row, a
// TOMBSTONE_CONFIRMED receipt and the CLOSE_FENCE receipt BeginUnsubscribe would write. The
// accepted digest is cleared with it: the latest version is now the tombstone, so the next
// good read of the resource, whatever its bytes, is a new version with its invalidation (R21).
// Otherwise nothing changes and the result is OutcomeRefused with a mcpsync.TombstoneRefusal,
// recorded as a TOMBSTONE_REFUSED receipt, and a nil error. Replaying a confirmed request
// returns OutcomeAlreadyDone with the same version. The error is non-nil only when the
// subscription does not exist (ErrNotFound) or the database failed.
func (s *Store) ConfirmTombstone(ctx context.Context, req ConfirmTombstoneRequest) (TombstoneResult, error) {
	var res TombstoneResult
	var versionID *int64
	err := s.pool.QueryRow(ctx, `
		WITH upd AS (
			UPDATE subscriptions s SET state = 'UNSUBSCRIBING', close_ordinal = s.last_issued_ordinal,
				close_epoch = s.close_epoch + 1, updated_at = now(), last_accepted_digest = NULL,
				state_reason = 'deletion confirmed by catalog ' || $3::bigint
			FROM catalogs c, read_dispatches d
			WHERE s.id = $1 AND s.generation = $2 AND s.state = 'TOMBSTONE_PENDING'
			  AND d.subscription_id = s.id AND d.ordinal = s.last_accepted_ordinal
			  AND d.outcome = 'TOMBSTONE_PENDING' AND d.generation = s.generation
			  AND d.session_generation = s.session_generation
			  AND c.id = $3 AND c.source_id = s.source_id AND c.session_generation = s.session_generation
			  AND c.proof_level IN ('SNAPSHOT_PROVEN', 'SNAPSHOT_UNPROVEN') AND c.invalidated_at IS NULL
			  AND c.scans_started_at > d.issued_at
			  AND NOT EXISTS (SELECT 1 FROM catalog_entry_batches e
			                  WHERE e.scan_id = c.entries_scan_id AND e.kind = 'resource' AND s.uri = ANY (coalesce(e.uris, e.server_uris)))
			RETURNING s.id, s.principal, s.source_id, s.uri, s.generation, s.session_generation,
			          s.last_accepted_ordinal, s.close_ordinal, s.close_epoch, d.request_id),
		ver AS (
			INSERT INTO resource_versions (subscription_id, principal, source_id, uri, kind,
				read_ordinal, generation, session_generation, request_id, auth_subject,
				server_name, server_version)
			SELECT u.id, u.principal, u.source_id, u.uri, 'tombstone', u.last_accepted_ordinal,
			       u.generation, u.session_generation, u.request_id, so.subject,
			       coalesce(se.server_name, ''), coalesce(se.server_version, '')
			FROM upd u JOIN sources so ON so.id = u.source_id
			LEFT JOIN sessions se ON se.source_id = u.source_id AND se.generation = u.session_generation
			RETURNING id),
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, principal,
				source_id, uri, read_ordinal, detail)
			SELECT 'tombstone', 'tombstone/' || u.id || '/' || u.last_accepted_ordinal, u.id,
			       u.principal, u.source_id, u.uri, u.last_accepted_ordinal,
			       jsonb_build_object('catalog', $3::bigint)
			FROM upd u
			RETURNING id),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $4, 'TOMBSTONE_CONFIRMED', u.source_id, u.id, u.generation, u.session_generation,
			       u.last_accepted_ordinal, u.request_id, u.uri,
			       jsonb_build_object('catalog', $3::bigint, 'close_ordinal', u.close_ordinal,
			                          'close_epoch', u.close_epoch, 'version', (SELECT id FROM ver),
			                          'outbox', (SELECT id FROM ob))
			FROM upd u
			UNION ALL
			SELECT NULL, 'CLOSE_FENCE', u.source_id, u.id, u.generation, u.session_generation,
			       u.close_ordinal, NULL, u.uri,
			       jsonb_build_object('close_epoch', u.close_epoch,
			                          'reason', 'deletion confirmed by catalog ' || $3::bigint)
			FROM upd u
			RETURNING 1)
		SELECT u.last_accepted_ordinal, u.close_ordinal, u.close_epoch, (SELECT id FROM ver),
		       (SELECT count(*) FROM rc)
		FROM upd u`, req.SubscriptionID, req.Generation, req.CatalogID, req.idemKey()).
		Scan(&res.ReadOrdinal, &res.CloseOrdinal, &res.CloseEpoch, &versionID, new(int64))
	if err == nil {
		res.Outcome, res.State = mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing
		if versionID != nil {
			res.VersionID = *versionID
		}
		return res, nil
	}
	if err != pgx.ErrNoRows {
		return TombstoneResult{}, fmt.Errorf("ledger: confirm tombstone of subscription %d: %w", req.SubscriptionID, err)
	}
	res, err = s.refuseTombstone(ctx, req)
	if err != nil {
		return TombstoneResult{}, fmt.Errorf("ledger: confirm tombstone of subscription %d: %w", req.SubscriptionID, err)
	}
	return res, nil
}

// refuseTombstone labels a request the fence did not let through, recording one receipt per
// (request, refusal); a replay of a confirmed request is AlreadyDone. The labels decide
// nothing: the fence has already refused.
func (s *Store) refuseTombstone(ctx context.Context, req ConfirmTombstoneRequest) (TombstoneResult, error) {
	var res TombstoneResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var sourceID, gen, sgen, accepted int64
		var uri string
		var closeOrd *int64
		if err := tx.QueryRow(ctx, `SELECT source_id, state, generation, session_generation,
				last_accepted_ordinal, uri, close_ordinal, close_epoch
			FROM subscriptions WHERE id = $1`, req.SubscriptionID).Scan(&sourceID, &res.State, &gen, &sgen,
			&accepted, &uri, &closeOrd, &res.CloseEpoch); err != nil {
			return notFound(err, fmt.Sprintf("subscription %d", req.SubscriptionID))
		}
		if closeOrd != nil {
			res.CloseOrdinal = *closeOrd
		}
		var confirmed bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM receipts WHERE idem_key = $1)`, req.idemKey()).Scan(&confirmed); err != nil {
			return err
		}
		if confirmed {
			res.Outcome = mcpsync.OutcomeAlreadyDone
			return tx.QueryRow(ctx, `SELECT r.read_ordinal, v.id FROM receipts r
				JOIN resource_versions v ON v.subscription_id = r.subscription_id AND v.read_ordinal = r.read_ordinal
				WHERE r.idem_key = $1`, req.idemKey()).Scan(&res.ReadOrdinal, &res.VersionID)
		}
		res.Outcome, res.ReadOrdinal = mcpsync.OutcomeRefused, accepted
		var issuedAt, started *time.Time
		var readSession *int64
		_ = tx.QueryRow(ctx, `SELECT issued_at, session_generation FROM read_dispatches
			WHERE subscription_id = $1 AND ordinal = $2 AND outcome = 'TOMBSTONE_PENDING'`,
			req.SubscriptionID, accepted).Scan(&issuedAt, &readSession)
		var catSource, catSession int64
		var level string
		var invalidated, listed bool
		err := tx.QueryRow(ctx, `SELECT c.source_id, c.session_generation, c.proof_level,
				c.invalidated_at IS NOT NULL, c.scans_started_at,
				EXISTS (SELECT 1 FROM catalog_entry_batches e WHERE e.scan_id = c.entries_scan_id
				        AND e.kind = 'resource' AND $2 = ANY (coalesce(e.uris, e.server_uris)))
			FROM catalogs c WHERE c.id = $1`, req.CatalogID, uri).Scan(&catSource, &catSession, &level,
			&invalidated, &started, &listed)
		noCatalog := err == pgx.ErrNoRows
		if err != nil && !noCatalog {
			return err
		}
		switch {
		case gen != req.Generation:
			res.Refusal = mcpsync.TombstoneOldGeneration
		case res.State != mcpsync.StateTombstonePending || issuedAt == nil || readSession == nil || *readSession != sgen:
			res.Refusal = mcpsync.TombstoneNotPending
		case noCatalog:
			res.Refusal = mcpsync.TombstoneNoCatalog
		case catSource != sourceID:
			res.Refusal = mcpsync.TombstoneOtherSource
		case catSession != sgen:
			res.Refusal = mcpsync.TombstoneOtherSession
		case ProofLevel(level) == ProofReconciliationRequired:
			res.Refusal = mcpsync.TombstoneNotReconciled
		case invalidated:
			res.Refusal = mcpsync.TombstoneInvalidated
		case started == nil || !started.After(*issuedAt):
			res.Refusal = mcpsync.TombstoneScanTooEarly
		default:
			res.Refusal = mcpsync.TombstoneResourcePresent
		}
		_, err = tx.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, uri, detail)
			VALUES ($1, 'TOMBSTONE_REFUSED', $2, $3, $4, $5, $6, $7,
			        jsonb_build_object('catalog', $8::bigint, 'refusal', $9::text, 'state', $10::text))
			ON CONFLICT (idem_key) DO NOTHING`,
			req.idemKey()+"/refused/"+string(res.Refusal), sourceID, req.SubscriptionID, req.Generation,
			sgen, accepted, uri, req.CatalogID, string(res.Refusal), string(res.State))
		return err
	})
	return res, err
}
