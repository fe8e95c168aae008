package ledger

import (
	"context"
	"errors"
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
// rounds started after that read was dispatched, it does not list the subscription's
// URI as a resource, and none of its resource templates can produce the URI (templateMatch:
// a URI a template produces never appears in a list, so its absence proves nothing; such a
// subscription is confirmed by ConfirmTombstoneByReads instead). The catalog serves a per-URI
// fact here, not a complete enumeration, so SNAPSHOT_UNPROVEN is enough (R7, R21). Then,
// atomically: TOMBSTONE_PENDING → UNSUBSCRIBING with the close fence
// (close_ordinal = last_issued_ordinal, close_epoch + 1, R18), a resourceVersion.v1 of kind
// 'tombstone' at the not-found read's ordinal, a 'tombstone' invalidation outbox row, a
// TOMBSTONE_CONFIRMED receipt, the CLOSE_FENCE receipt BeginUnsubscribe would write, and an
// ACCEPTED catalog_consumptions row of purpose 'tombstone' naming the catalog, its proof level
// and the subscription, so the release gate counts every catalog used this way (R25). The
// accepted digest is cleared with it: the latest version is now the tombstone, so the next
// good read of the resource, whatever its bytes, is a new version with its invalidation (R21).
// Otherwise nothing changes and the result is OutcomeRefused with a mcpsync.TombstoneRefusal,
// recorded as a TOMBSTONE_REFUSED receipt and a REFUSED 'tombstone' consumption (one of each
// per request and refusal, as ConsumeCatalog records its refusals), and a nil error. Replaying a confirmed request
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
			  AND NOT EXISTS (SELECT 1 FROM catalog_entry_arrays e
			                  WHERE e.scan_id = c.entries_scan_id AND e.kind = 'resource' AND s.uri = ANY (coalesce(e.uris, e.server_uris)))
			  AND NOT `+templateMatch+`
			RETURNING s.id, s.principal, s.source_id, s.uri, s.generation, s.session_generation,
			          s.last_accepted_ordinal, s.close_ordinal, s.close_epoch, d.request_id, c.proof_level),
		cc AS (
			INSERT INTO catalog_consumptions (source_id, catalog_id, consumer, purpose, proof_level, outcome, subscription_id)
			SELECT u.source_id, $3, 'subscription ' || u.id, 'tombstone', u.proof_level, 'ACCEPTED', u.id
			FROM upd u
			RETURNING id),
`+tombstoneVersionCTE+`
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
			                          'outbox', (SELECT id FROM ob), 'consumption', (SELECT id FROM cc),
			                          'reason', 'absent_from_catalog')
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
		sub, done, err := beginTombstoneRefusal(ctx, tx, req.SubscriptionID, req.idemKey(), &res)
		if err != nil || done {
			return err
		}
		sourceID, gen, sgen, accepted, uri := sub.sourceID, sub.gen, sub.sgen, sub.accepted, sub.uri
		var issuedAt, started *time.Time
		var readSession *int64
		// No pending not-found dispatch leaves both nil: the subscription is not pending.
		if err := tx.QueryRow(ctx, `SELECT issued_at, session_generation FROM read_dispatches
			WHERE subscription_id = $1 AND ordinal = $2 AND outcome = 'TOMBSTONE_PENDING'`,
			req.SubscriptionID, accepted).Scan(&issuedAt, &readSession); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var catSource, catSession int64
		var level string
		var invalidated, listed, template bool
		err = tx.QueryRow(ctx, `SELECT c.source_id, c.session_generation, c.proof_level,
				c.invalidated_at IS NOT NULL, c.scans_started_at,
				EXISTS (SELECT 1 FROM catalog_entry_arrays e WHERE e.scan_id = c.entries_scan_id
				        AND e.kind = 'resource' AND s.uri = ANY (coalesce(e.uris, e.server_uris))),
				`+templateMatch+`
			FROM catalogs c, subscriptions s WHERE c.id = $1 AND s.id = $2`, req.CatalogID, req.SubscriptionID).Scan(&catSource, &catSession, &level,
			&invalidated, &started, &listed, &template)
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
		case listed:
			res.Refusal = mcpsync.TombstoneResourcePresent
		case template:
			res.Refusal = mcpsync.TombstoneTemplateURI
		default:
			// The fence refused, yet no label applies: the row moved since (a concurrent
			// confirmation or session change). Report what the row says now.
			res.Refusal = mcpsync.TombstoneNotPending
		}
		// One receipt and one REFUSED 'tombstone' consumption per (request, refusal), in this
		// transaction (R25): the consumption is written only if the receipt was.
		var catalog *int64
		var proof *string
		if !noCatalog {
			catalog, proof = &req.CatalogID, &level
		}
		_, err = tx.Exec(ctx, `WITH rc AS (
				INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
					session_generation, read_ordinal, uri, detail)
				VALUES ($1, 'TOMBSTONE_REFUSED', $2, $3, $4, $5, $6, $7,
				        jsonb_build_object('catalog', $8::bigint, 'refusal', $9::text, 'state', $10::text))
				ON CONFLICT (idem_key) DO NOTHING
				RETURNING 1)
			INSERT INTO catalog_consumptions (source_id, catalog_id, consumer, purpose, proof_level, outcome, refusal, subscription_id)
			SELECT $2, $11, 'subscription ' || $3::bigint, 'tombstone', $12, 'REFUSED', $9, $3
			FROM rc`,
			req.idemKey()+"/refused/"+string(res.Refusal), sourceID, req.SubscriptionID, req.Generation,
			sgen, accepted, uri, req.CatalogID, string(res.Refusal), string(res.State), catalog, proof)
		return err
	})
	return res, err
}

// templateMatch is true when one of catalog c's resource templates, as the server listed
// them, can produce subscription s's URI (normalized or in the server's spelling), by the
// RFC 6570 matching of mcpsync_uri_template_matches (migration 0007), which errs towards
// "can produce". Used in ConfirmTombstone's fence and in its refusal labels.
const templateMatch = `EXISTS (SELECT 1 FROM catalog_entry_arrays e, unnest(e.server_uris) AS t (tpl)
	WHERE e.scan_id = c.entries_scan_id AND e.kind = 'template'
	  AND (mcpsync_uri_template_matches(t.tpl, s.uri) OR mcpsync_uri_template_matches(t.tpl, s.server_uri)))`

// TombstoneProbesRequired is how many not-found reads, after the one that made a subscription
// TOMBSTONE_PENDING, ConfirmTombstoneByReads needs to confirm a deletion (R21).
const TombstoneProbesRequired = 3

// TombstoneProbeRequest reports that a read of a TOMBSTONE_PENDING subscription's URI,
// sent on session generation SessionGeneration with request ID RequestID, answered
// not-found again.
type TombstoneProbeRequest struct {
	SubscriptionID    int64
	Generation        int64
	SessionGeneration int64
	RequestID         string
}

func (r TombstoneProbeRequest) idemKey() string {
	return fmt.Sprintf("tombstone-probe/%d/%s", r.SubscriptionID, r.RequestID)
}

// TombstoneProbeResult is the outcome of RecordTombstoneProbe: Outcome ACCEPTED (recorded),
// ALREADY_DONE (a replay of a recorded probe; it does not count twice) or REFUSED (the
// subscription is not TOMBSTONE_PENDING in that generation and session generation: nothing
// recorded). State is the subscription's state as the statement saw it; Probes counts the
// probes recorded for the current pending read, this one included.
type TombstoneProbeResult struct {
	Outcome mcpsync.Outcome
	State   mcpsync.State
	Probes  int64
}

// RecordTombstoneProbe records a repeated not-found read of a TOMBSTONE_PENDING subscription
// in one statement: only while the subscription is TOMBSTONE_PENDING in Generation on
// SessionGeneration does it write a TOMBSTONE_PROBE_NOT_FOUND receipt tied to the pending
// read's ordinal (last_accepted_ordinal), keyed by (subscription, request ID). Probes of an
// earlier pending period carry an older ordinal and never count for a later one. A probe that
// finds the resource is not recorded here: the caller restores the subscription
// (RestoreFromTombstone). The error is non-nil only for an empty request ID (ErrInvalid), an
// unknown subscription (ErrNotFound) or a database failure.
func (s *Store) RecordTombstoneProbe(ctx context.Context, req TombstoneProbeRequest) (TombstoneProbeResult, error) {
	if req.RequestID == "" {
		return TombstoneProbeResult{}, fmt.Errorf("ledger: record tombstone probe: empty request ID: %w", ErrInvalid)
	}
	var res TombstoneProbeResult
	var inserted, prior bool
	var state *string
	err := s.pool.QueryRow(ctx, `
		WITH prior AS (SELECT 1 FROM receipts WHERE idem_key = $5),
		ins AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $5, 'TOMBSTONE_PROBE_NOT_FOUND', s.source_id, s.id, s.generation, s.session_generation,
			       s.last_accepted_ordinal, $4, s.uri, jsonb_build_object('result', 'not_found')
			FROM subscriptions s
			WHERE s.id = $1 AND s.generation = $2 AND s.session_generation = $3
			  AND s.state = 'TOMBSTONE_PENDING' AND NOT EXISTS (SELECT 1 FROM prior)
			ON CONFLICT (idem_key) DO NOTHING
			RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM ins), EXISTS (SELECT 1 FROM prior), s.state,
		       (SELECT count(*) FROM receipts r WHERE r.subscription_id = s.id
		          AND r.kind = 'TOMBSTONE_PROBE_NOT_FOUND' AND r.generation = s.generation
		          AND r.session_generation = s.session_generation AND r.read_ordinal = s.last_accepted_ordinal)
		FROM (SELECT 1) one LEFT JOIN subscriptions s ON s.id = $1`,
		req.SubscriptionID, req.Generation, req.SessionGeneration, req.RequestID, req.idemKey()).
		Scan(&inserted, &prior, &state, &res.Probes)
	if err != nil {
		return TombstoneProbeResult{}, fmt.Errorf("ledger: tombstone probe of subscription %d: %w", req.SubscriptionID, err)
	}
	if state == nil {
		return TombstoneProbeResult{}, fmt.Errorf("ledger: tombstone probe: subscription %d: %w", req.SubscriptionID, ErrNotFound)
	}
	res.State = mcpsync.State(*state)
	switch {
	case inserted:
		res.Outcome = mcpsync.OutcomeAccepted
		res.Probes++ // the statement's snapshot does not see its own receipt
	case prior:
		res.Outcome = mcpsync.OutcomeAlreadyDone
	default:
		res.Outcome = mcpsync.OutcomeRefused
	}
	return res, nil
}

// ConfirmByReadsRequest confirms the deletion of a TOMBSTONE_PENDING subscription's resource
// by repeated not-found reads.
type ConfirmByReadsRequest struct {
	SubscriptionID int64
	Generation     int64
}

func (r ConfirmByReadsRequest) idemKey() string {
	return fmt.Sprintf("tombstone-reads/%d/%d", r.SubscriptionID, r.Generation)
}

// ConfirmTombstoneByReads confirms a deletion that no list can prove, that of a URI a
// resource template produces (R21), in one statement whose WHERE clause carries the whole
// fence: the subscription is TOMBSTONE_PENDING in Generation; its not-found read (the
// dispatch at last_accepted_ordinal, outcome TOMBSTONE_PENDING) is on the subscription's
// session generation; and at least TombstoneProbesRequired TOMBSTONE_PROBE_NOT_FOUND receipts
// (RecordTombstoneProbe) were recorded for that read's ordinal, in that generation and session
// generation, after the read was dispatched. Then it writes what ConfirmTombstone writes (the
// close fence, the tombstone version, its invalidation, the CLOSE_FENCE receipt, the accepted
// digest cleared) with a TOMBSTONE_CONFIRMED receipt of reason 'repeated_not_found' and no
// catalog consumption. Otherwise nothing changes and the result is OutcomeRefused with
// OLD_GENERATION, NOT_TOMBSTONE_PENDING or TOO_FEW_NOT_FOUND_READS, recorded as a
// TOMBSTONE_REFUSED receipt (one per refusal and probe count). A replay of a confirmed
// request returns OutcomeAlreadyDone with the same version. The error is non-nil only for an
// unknown subscription (ErrNotFound) or a database failure.
func (s *Store) ConfirmTombstoneByReads(ctx context.Context, req ConfirmByReadsRequest) (TombstoneResult, error) {
	var res TombstoneResult
	var versionID *int64
	err := s.pool.QueryRow(ctx, `
		WITH upd AS (
			UPDATE subscriptions s SET state = 'UNSUBSCRIBING', close_ordinal = s.last_issued_ordinal,
				close_epoch = s.close_epoch + 1, updated_at = now(), last_accepted_digest = NULL,
				state_reason = 'deletion confirmed by repeated not-found reads'
			FROM read_dispatches d
			WHERE s.id = $1 AND s.generation = $2 AND s.state = 'TOMBSTONE_PENDING'
			  AND d.subscription_id = s.id AND d.ordinal = s.last_accepted_ordinal
			  AND d.outcome = 'TOMBSTONE_PENDING' AND d.generation = s.generation
			  AND d.session_generation = s.session_generation
			  AND `+probeCount+` >= $3
			RETURNING s.id, s.principal, s.source_id, s.uri, s.generation, s.session_generation,
			          s.last_accepted_ordinal, s.close_ordinal, s.close_epoch, d.request_id, `+probeCount+` AS probes),
`+tombstoneVersionCTE+`
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, principal,
				source_id, uri, read_ordinal, detail)
			SELECT 'tombstone', 'tombstone/' || u.id || '/' || u.last_accepted_ordinal, u.id,
			       u.principal, u.source_id, u.uri, u.last_accepted_ordinal,
			       jsonb_build_object('reason', 'repeated_not_found', 'probes', u.probes)
			FROM upd u
			RETURNING id),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $4, 'TOMBSTONE_CONFIRMED', u.source_id, u.id, u.generation, u.session_generation,
			       u.last_accepted_ordinal, u.request_id, u.uri,
			       jsonb_build_object('reason', 'repeated_not_found', 'probes', u.probes,
			                          'close_ordinal', u.close_ordinal, 'close_epoch', u.close_epoch,
			                          'version', (SELECT id FROM ver), 'outbox', (SELECT id FROM ob))
			FROM upd u
			UNION ALL
			SELECT NULL, 'CLOSE_FENCE', u.source_id, u.id, u.generation, u.session_generation,
			       u.close_ordinal, NULL, u.uri,
			       jsonb_build_object('close_epoch', u.close_epoch,
			                          'reason', 'deletion confirmed by repeated not-found reads')
			FROM upd u
			RETURNING 1)
		SELECT u.last_accepted_ordinal, u.close_ordinal, u.close_epoch, (SELECT id FROM ver),
		       (SELECT count(*) FROM rc)
		FROM upd u`, req.SubscriptionID, req.Generation, TombstoneProbesRequired, req.idemKey()).
		Scan(&res.ReadOrdinal, &res.CloseOrdinal, &res.CloseEpoch, &versionID, new(int64))
	if err == nil {
		res.Outcome, res.State = mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing
		if versionID != nil {
			res.VersionID = *versionID
		}
		return res, nil
	}
	if err != pgx.ErrNoRows {
		return TombstoneResult{}, fmt.Errorf("ledger: confirm tombstone by reads of subscription %d: %w", req.SubscriptionID, err)
	}
	if res, err = s.refuseTombstoneByReads(ctx, req); err != nil {
		return TombstoneResult{}, fmt.Errorf("ledger: confirm tombstone by reads of subscription %d: %w", req.SubscriptionID, err)
	}
	return res, nil
}

// probeCount counts the TOMBSTONE_PROBE_NOT_FOUND receipts of subscription s's pending read
// (dispatch d): same ordinal, generation and session generation, recorded after the dispatch.
const probeCount = `(SELECT count(*) FROM receipts r WHERE r.subscription_id = s.id
	AND r.kind = 'TOMBSTONE_PROBE_NOT_FOUND' AND r.generation = s.generation
	AND r.session_generation = s.session_generation AND r.read_ordinal = s.last_accepted_ordinal
	AND r.created_at >= d.issued_at)`

// refuseTombstoneByReads labels a request ConfirmTombstoneByReads's fence did not let
// through; a replay of a confirmed request is AlreadyDone. The labels decide nothing.
func (s *Store) refuseTombstoneByReads(ctx context.Context, req ConfirmByReadsRequest) (TombstoneResult, error) {
	var res TombstoneResult
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		sub, done, err := beginTombstoneRefusal(ctx, tx, req.SubscriptionID, req.idemKey(), &res)
		if err != nil || done {
			return err
		}
		sourceID, gen, sgen, accepted, uri := sub.sourceID, sub.gen, sub.sgen, sub.accepted, sub.uri
		var pending bool
		var probes int64
		if err := tx.QueryRow(ctx, `SELECT true, `+probeCount+`
			FROM subscriptions s JOIN read_dispatches d ON d.subscription_id = s.id AND d.ordinal = s.last_accepted_ordinal
			WHERE s.id = $1 AND d.outcome = 'TOMBSTONE_PENDING' AND d.generation = s.generation
			  AND d.session_generation = s.session_generation`, req.SubscriptionID).Scan(&pending, &probes); err != nil && err != pgx.ErrNoRows {
			return err
		}
		switch {
		case gen != req.Generation:
			res.Refusal = mcpsync.TombstoneOldGeneration
		case res.State != mcpsync.StateTombstonePending || !pending:
			res.Refusal = mcpsync.TombstoneNotPending
		default:
			res.Refusal = mcpsync.TombstoneTooFewReads
		}
		_, err = tx.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, uri, detail)
			VALUES ($1, 'TOMBSTONE_REFUSED', $2, $3, $4, $5, $6, $7,
			        jsonb_build_object('reason', 'repeated_not_found', 'refusal', $8::text, 'state', $9::text,
			                           'probes', $10::bigint, 'required', $11::int))
			ON CONFLICT (idem_key) DO NOTHING`,
			fmt.Sprintf("%s/%d/refused/%s/%d", req.idemKey(), accepted, res.Refusal, probes), sourceID,
			req.SubscriptionID, req.Generation, sgen, accepted, uri, string(res.Refusal), string(res.State),
			probes, TombstoneProbesRequired)
		return err
	})
	return res, err
}

// refusalSubject is the subscription row a tombstone refusal is labelled from, as the refusing
// transaction reads it.
type refusalSubject struct {
	sourceID, gen, sgen, accepted int64
	uri                           string
}

// beginTombstoneRefusal reads subscription id for a refused confirmation into res (state, close
// ordinal and epoch). When the request under key already confirmed the deletion, res is
// AlreadyDone with the confirmed ordinal and version and done is true: there is nothing to
// label. Otherwise res is Refused at the accepted ordinal, for the caller to label.
func beginTombstoneRefusal(ctx context.Context, tx pgx.Tx, id int64, key string, res *TombstoneResult) (sub refusalSubject, done bool, err error) {
	var closeOrd *int64
	if err := tx.QueryRow(ctx, `SELECT source_id, state, generation, session_generation,
			last_accepted_ordinal, uri, close_ordinal, close_epoch
		FROM subscriptions WHERE id = $1`, id).Scan(&sub.sourceID, &res.State, &sub.gen, &sub.sgen,
		&sub.accepted, &sub.uri, &closeOrd, &res.CloseEpoch); err != nil {
		return sub, false, notFound(err, fmt.Sprintf("subscription %d", id))
	}
	if closeOrd != nil {
		res.CloseOrdinal = *closeOrd
	}
	var confirmed bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM receipts WHERE idem_key = $1)`, key).Scan(&confirmed); err != nil {
		return sub, false, err
	}
	if confirmed {
		res.Outcome = mcpsync.OutcomeAlreadyDone
		return sub, true, tx.QueryRow(ctx, `SELECT r.read_ordinal, v.id FROM receipts r
			JOIN resource_versions v ON v.subscription_id = r.subscription_id AND v.read_ordinal = r.read_ordinal
			WHERE r.idem_key = $1`, key).Scan(&res.ReadOrdinal, &res.VersionID)
	}
	res.Outcome, res.ReadOrdinal = mcpsync.OutcomeRefused, sub.accepted
	return sub, false, nil
}

// tombstoneVersionCTE writes the tombstone version of the subscription a confirming statement
// moved (its CTE upd: id, principal, source_id, uri, generation, session_generation,
// last_accepted_ordinal, request_id), with the subject and server of its session, for
// ConfirmTombstone and ConfirmTombstoneByReads alike (R21).
const tombstoneVersionCTE = `		ver AS (
			INSERT INTO resource_versions (subscription_id, principal, source_id, uri, kind,
				read_ordinal, generation, session_generation, request_id, auth_subject,
				server_name, server_version)
			SELECT u.id, u.principal, u.source_id, u.uri, 'tombstone', u.last_accepted_ordinal,
			       u.generation, u.session_generation, u.request_id, so.subject,
			       coalesce(se.server_name, ''), coalesce(se.server_version, '')
			FROM upd u JOIN sources so ON so.id = u.source_id
			LEFT JOIN sessions se ON se.source_id = u.source_id AND se.generation = u.session_generation
			RETURNING id),`
