package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// ProofLevel is the proof level of a published catalog (R5-R7).
type ProofLevel string

// Proof levels.
const (
	// ProofSnapshotProven: rounds A and B on one session carried the same ID of a negotiated
	// snapshot extension on every page and listed the same set (R5).
	ProofSnapshotProven ProofLevel = "SNAPSHOT_PROVEN"
	// ProofSnapshotUnproven: rounds A and B on one session listed the same set and saw no
	// list_changed (R6, R7). Never handed to an integrity task.
	ProofSnapshotUnproven ProofLevel = "SNAPSHOT_UNPROVEN"
	// ProofReconciliationRequired: no two rounds agreed. Accepted by nobody (R25).
	ProofReconciliationRequired ProofLevel = "RECONCILIATION_REQUIRED"
)

// Valid reports whether l is one of the proof levels.
func (l ProofLevel) Valid() bool {
	switch l {
	case ProofSnapshotProven, ProofSnapshotUnproven, ProofReconciliationRequired:
		return true
	}
	return false
}

// ErrProofRefused: the rounds named in a PublishCatalog request do not prove the level asked
// for. errors.As with *ProofRefusal gives the level.
var ErrProofRefused = errors.New("ledger: rounds do not prove the requested level")

// ProofRefusal is the error PublishCatalog returns when the basis rounds do not qualify.
type ProofRefusal struct {
	Level  ProofLevel
	Reason string
}

// Error describes the refusal.
func (e *ProofRefusal) Error() string {
	return fmt.Sprintf("ledger: rounds do not prove %s: %s", e.Level, e.Reason)
}

// Is makes errors.Is(err, ErrProofRefused) hold.
func (e *ProofRefusal) Is(target error) bool { return target == ErrProofRefused }

// PublishRequest asks for a catalog of Level resting on rounds A and B (BasisScanIDs).
type PublishRequest struct {
	Key               string // one catalog per key (the scan run): replaying returns it
	ScanWorkflowID    string
	SourceID          int64
	SessionGeneration int64 // RECONCILIATION_REQUIRED only; A and B's otherwise
	Level             ProofLevel
	Reason            string
	RoundsUsed        int
	BasisScanIDs      []int64 // A, B; required for PROVEN and UNPROVEN
	EntriesScanID     int64   // RECONCILIATION_REQUIRED: a round whose entries to show (0: none)
	Recheck           time.Duration
}

// Catalog is a published catalog.
type Catalog struct {
	ID                int64
	SourceID          int64
	SourceName        string
	SessionGeneration int64
	ScanWorkflowID    string
	Level             ProofLevel
	Reason            string
	RoundsUsed        int
	BasisScanIDs      []int64
	EntriesScanID     *int64
	SetDigest         string
	SnapshotID        string
	Resources         int
	Templates         int
	ScansStartedAt    *time.Time
	MeasuredAt        time.Time
	StalenessBound    time.Duration
	NextCheckAt       time.Time
	PublishedAt       time.Time
	InvalidatedAt     *time.Time
	InvalidatedReason string
}

const catalogColumns = `c.id, c.source_id, so.name, c.session_generation, c.scan_workflow_id,
	c.proof_level, c.reason, c.rounds_used, c.basis_scan_ids, c.entries_scan_id,
	coalesce(c.set_digest, ''), coalesce(c.snapshot_id, ''), c.resource_count, c.template_count,
	c.scans_started_at, c.measured_at, c.staleness_bound, c.next_check_at, c.published_at,
	c.invalidated_at, coalesce(c.invalidated_reason, '')`

func scanCatalog(row pgx.Row) (Catalog, error) {
	var c Catalog
	err := row.Scan(&c.ID, &c.SourceID, &c.SourceName, &c.SessionGeneration, &c.ScanWorkflowID,
		&c.Level, &c.Reason, &c.RoundsUsed, &c.BasisScanIDs, &c.EntriesScanID, &c.SetDigest,
		&c.SnapshotID, &c.Resources, &c.Templates, &c.ScansStartedAt, &c.MeasuredAt,
		&c.StalenessBound, &c.NextCheckAt, &c.PublishedAt, &c.InvalidatedAt, &c.InvalidatedReason)
	return c, err
}

// PublishCatalog publishes a catalog, re-checking in its one INSERT's WHERE clause that the
// basis rounds prove the level (the workflow's decision is not trusted, R5-R7, R24):
//   - SNAPSHOT_UNPROVEN: A and B are two distinct, consecutive rounds of the same scan run on
//     the same source and session generation, both COMPLETE, B started after A ended, equal
//     set digests, no duplicate entries, and no list_changed observed in either.
//   - SNAPSHOT_PROVEN: all of that, both rounds on a session that negotiated the snapshot
//     extension, every page of both carrying one and the same ID, and no complete round of
//     that session ever listed another set under that ID (a forged ID disproves).
//   - RECONCILIATION_REQUIRED: always publishable; it is accepted by nobody.
//
// measuredAt is B's end, nextCheckAt measuredAt + Recheck, and the staleness bound is the
// scan window (A's first request to B's end) plus Recheck: the longest a change can go unseen
// when the server sends no list_changed. A list_changed recorded for the source
// (InvalidateCatalogs) since round A began, even one after round B's end, is found by the same
// INSERT: the catalog is published invalidated (integrity consumers refuse it) with nextCheckAt
// now, so that no catalog a list_changed overtook is ever served as valid (R3, R6). A refused
// level returns a *ProofRefusal (errors.Is ErrProofRefused). Replaying a published key returns
// the stored catalog. A basis round (or the entries round of a RECONCILIATION_REQUIRED
// catalog) whose entries are still being stored (EndScanDeferred) is waited for first.
func (s *Store) PublishCatalog(ctx context.Context, req PublishRequest) (Catalog, error) {
	if req.Key == "" || !req.Level.Valid() || req.Recheck <= 0 {
		return Catalog{}, fmt.Errorf("ledger: publish catalog %q level %q recheck %s: %w", req.Key, req.Level, req.Recheck, ErrInvalid)
	}
	if c, err := s.catalogByKey(ctx, req.Key); err == nil {
		return c, nil
	} else if !errors.Is(err, ErrNotFound) {
		return Catalog{}, err
	}
	var id int64
	var err error
	if req.Level == ProofReconciliationRequired {
		var entries *int64
		if req.EntriesScanID != 0 {
			entries = &req.EntriesScanID
		}
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			// A round whose entries are still being stored (EndScanDeferred) is waited for.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM discovery_scans WHERE id = $1 FOR SHARE`, entries); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `
			INSERT INTO catalogs (catalog_key, source_id, session_generation, scan_workflow_id,
				proof_level, reason, rounds_used, entries_scan_id, set_digest, resource_count,
				template_count, measured_at, staleness_bound, next_check_at)
			SELECT $1, so.id, $3, $4, 'RECONCILIATION_REQUIRED', $5, $6, e.entries_scan_id, e.set_digest,
			       coalesce(e.resource_count, 0), coalesce(e.template_count, 0),
			       now(), make_interval(secs => $8), now() + make_interval(secs => $8)
			FROM sources so LEFT JOIN discovery_scans e ON e.id = $7 AND e.source_id = so.id AND e.outcome = 'COMPLETE'
			WHERE so.id = $2
			ON CONFLICT (catalog_key) DO NOTHING
			RETURNING id`, req.Key, req.SourceID, req.SessionGeneration, req.ScanWorkflowID,
				req.Reason, req.RoundsUsed, entries, req.Recheck.Seconds()).Scan(&id)
		})
	} else {
		if len(req.BasisScanIDs) != 2 {
			return Catalog{}, &ProofRefusal{Level: req.Level, Reason: "two rounds are required (R24)"}
		}
		err = s.inTx(ctx, func(tx pgx.Tx) error {
			// The list_changed fence (R3, R6): lock the source row FOR SHARE first.
			// InvalidateCatalogs updates it before it invalidates, so the two serialise on it:
			// a list_changed recorded before this lock is in the count the INSERT (a new
			// snapshot) compares with round A's; one recorded after waits for this commit and
			// then invalidates the catalog it finds.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM sources WHERE id = $1 FOR SHARE`, req.SourceID); err != nil {
				return err
			}
			// Rounds whose entries are still being stored (EndScanDeferred) are waited for, so
			// the INSERT's new snapshot sees where their entries are.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM discovery_scans WHERE id = ANY ($1) FOR SHARE`, req.BasisScanIDs); err != nil {
				return err
			}
			return tx.QueryRow(ctx, publishBasisSQL, req.Key, req.SourceID, req.ScanWorkflowID, string(req.Level), req.Reason,
				req.RoundsUsed, req.BasisScanIDs[0], req.BasisScanIDs[1], req.Recheck.Seconds()).Scan(&id)
		})
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if c, err := s.catalogByKey(ctx, req.Key); err == nil {
			return c, nil // a concurrent replay published first
		}
		if req.Level == ProofReconciliationRequired {
			return Catalog{}, fmt.Errorf("ledger: publish catalog: source %d: %w", req.SourceID, ErrNotFound)
		}
		return Catalog{}, &ProofRefusal{Level: req.Level, Reason: s.explainBasis(ctx, req)}
	}
	if err != nil {
		return Catalog{}, fmt.Errorf("ledger: publish catalog %s: %w", req.Key, err)
	}
	return s.CatalogByID(ctx, id)
}

// publishBasisSQL is PublishCatalog's INSERT of a SNAPSHOT_PROVEN or SNAPSHOT_UNPROVEN catalog:
// its WHERE re-checks rounds A ($7) and B ($8), and a list_changed recorded for the source
// since round A began (sources.list_changed_seq past A's copy) publishes it invalidated with
// its re-check due at once. It expects $1 key, $2 source, $3 scan workflow ID, $4 level, $5
// reason, $6 rounds used, $9 re-check seconds.
const publishBasisSQL = `
			INSERT INTO catalogs (catalog_key, source_id, session_generation, scan_workflow_id,
				proof_level, reason, rounds_used, basis_scan_ids, entries_scan_id, set_digest,
				snapshot_id, resource_count, template_count, scans_started_at, measured_at,
				staleness_bound, next_check_at, invalidated_at, invalidated_reason)
			SELECT $1, b.source_id, b.session_generation, $3, $4, $5, $6, ARRAY[a.id, b.id], b.entries_scan_id,
			       b.set_digest, CASE WHEN $4 = 'SNAPSHOT_PROVEN' THEN b.snapshot_id END,
			       b.resource_count, b.template_count, a.started_at, b.ended_at,
			       (b.ended_at - a.started_at) + make_interval(secs => $9),
			       CASE WHEN lc.overtaken THEN now() ELSE b.ended_at + make_interval(secs => $9) END,
			       CASE WHEN lc.overtaken THEN now() END,
			       CASE WHEN lc.overtaken THEN format('%s list_changed recorded since round %s began (last at %s)',
			                 so.list_changed_seq - a.source_list_changed_seq, a.round, so.list_changed_at) END
			FROM discovery_scans a JOIN discovery_scans b ON b.id = $8
			JOIN sources so ON so.id = a.source_id
			CROSS JOIN LATERAL (SELECT so.list_changed_seq > a.source_list_changed_seq AS overtaken) lc
			WHERE a.id = $7 AND a.id <> b.id AND a.source_id = $2 AND b.source_id = $2
			  AND a.scan_run = b.scan_run AND b.round = a.round + 1
			  AND a.session_generation = b.session_generation
			  AND a.outcome = 'COMPLETE' AND b.outcome = 'COMPLETE' AND b.started_at >= a.ended_at
			  AND b.entries_scan_id IS NOT NULL
			  AND a.set_digest = b.set_digest AND a.duplicate_count = 0 AND b.duplicate_count = 0
			  AND a.list_changed_observed = 0 AND b.list_changed_observed = 0
			  AND ($4 = 'SNAPSHOT_UNPROVEN' OR (
			        a.snapshot_negotiated AND b.snapshot_negotiated
			        AND a.snapshot_id IS NOT NULL AND a.snapshot_id = b.snapshot_id
			        AND a.snapshot_pages = a.resource_pages + a.template_pages
			        AND b.snapshot_pages = b.resource_pages + b.template_pages
			        AND NOT EXISTS (SELECT 1 FROM discovery_scans x
			                        WHERE x.source_id = a.source_id
			                          AND x.session_generation = a.session_generation
			                          AND x.outcome = 'COMPLETE' AND x.snapshot_id = a.snapshot_id
			                          AND x.set_digest <> a.set_digest)))
			ON CONFLICT (catalog_key) DO NOTHING
			RETURNING id`

// explainBasis says why rounds A and B do not prove req.Level. It only labels a refusal the
// INSERT already made.
func (s *Store) explainBasis(ctx context.Context, req PublishRequest) string {
	a, errA := s.ScanByID(ctx, req.BasisScanIDs[0])
	b, errB := s.ScanByID(ctx, req.BasisScanIDs[1])
	switch {
	case errA != nil || errB != nil:
		return "basis round not found"
	case a.ID == b.ID:
		return "a single round never proves a catalog (R24)"
	case a.SourceID != req.SourceID || b.SourceID != req.SourceID:
		return "basis rounds of another source"
	case a.Run != b.Run || b.Round != a.Round+1:
		return "rounds are not consecutive rounds of one scan"
	case a.SessionGeneration != b.SessionGeneration:
		return "rounds on different session generations"
	case a.Outcome != ScanComplete || b.Outcome != ScanComplete:
		return "a round did not complete"
	case b.EntriesScanID == nil:
		return "round B's entries were not stored"
	case a.EndedAt == nil || b.StartedAt.Before(*a.EndedAt):
		return "rounds overlap"
	case a.SetDigest != b.SetDigest:
		return "set digests differ"
	case a.Duplicates > 0 || b.Duplicates > 0:
		return "a round listed an entry twice"
	case a.ListChangedObserved > 0 || b.ListChangedObserved > 0:
		return "list_changed observed during a round"
	case !a.SnapshotNegotiated || !b.SnapshotNegotiated:
		return "snapshot extension not negotiated"
	case a.SnapshotID == "" || a.SnapshotID != b.SnapshotID:
		return "snapshot IDs vary or are missing"
	default:
		return "snapshot ID " + a.SnapshotID + " also named another set on this session (forged)"
	}
}

func (s *Store) catalogByKey(ctx context.Context, key string) (Catalog, error) {
	c, err := scanCatalog(s.pool.QueryRow(ctx, `SELECT `+catalogColumns+`
		FROM catalogs c JOIN sources so ON so.id = c.source_id WHERE c.catalog_key = $1`, key))
	if err != nil {
		return Catalog{}, notFound(err, "ledger: catalog "+key)
	}
	return c, nil
}

// CatalogByID returns one catalog, or ErrNotFound.
func (s *Store) CatalogByID(ctx context.Context, id int64) (Catalog, error) {
	c, err := scanCatalog(s.pool.QueryRow(ctx, `SELECT `+catalogColumns+`
		FROM catalogs c JOIN sources so ON so.id = c.source_id WHERE c.id = $1`, id))
	if err != nil {
		return Catalog{}, notFound(err, fmt.Sprintf("ledger: catalog %d", id))
	}
	return c, nil
}

// Catalogs returns the catalogs of a source, newest first.
func (s *Store) Catalogs(ctx context.Context, sourceID int64) ([]Catalog, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+catalogColumns+`
		FROM catalogs c JOIN sources so ON so.id = c.source_id
		WHERE c.source_id = $1 ORDER BY c.measured_at DESC, c.id DESC`, sourceID)
	if err != nil {
		return nil, fmt.Errorf("ledger: catalogs of source %d: %w", sourceID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Catalog, error) { return scanCatalog(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: catalogs of source %d: %w", sourceID, err)
	}
	return out, nil
}

// CatalogEntries returns the entries of a catalog in the order the round stored them
// (resources, then templates, each by server URI); a catalog without entries returns none.
func (s *Store) CatalogEntries(ctx context.Context, catalogID int64) ([]ScanEntry, error) {
	rows, err := s.pool.Query(ctx, `SELECT e.kind, e.uri, e.server_uri, e.name, e.mime_type
		FROM catalogs c JOIN catalog_entries e ON e.scan_id = c.entries_scan_id
		WHERE c.id = $1 ORDER BY e.batch, e.ord`, catalogID)
	if err != nil {
		return nil, fmt.Errorf("ledger: entries of catalog %d: %w", catalogID, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[ScanEntry])
	if err != nil {
		return nil, fmt.Errorf("ledger: entries of catalog %d: %w", catalogID, err)
	}
	return out, nil
}

// InvalidateCatalogs records a list_changed of a source and marks every not yet invalidated
// catalog of it as invalidated: none of them may vouch for the current set any more (R3). It
// returns how many catalogs it marked. The record (sources.list_changed_seq) is written first,
// in the same READ COMMITTED transaction: that UPDATE waits for a PublishCatalog holding the
// source row, and the invalidation that follows (a new snapshot) then finds its catalog; a
// PublishCatalog that comes after finds the record and publishes invalidated. Either way a
// catalog whose round A began before the record is invalidated.
func (s *Store) InvalidateCatalogs(ctx context.Context, sourceID int64, reason string) (int64, error) {
	var n int64
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE sources SET list_changed_seq = list_changed_seq + 1,
				list_changed_at = now() WHERE id = $1`, sourceID); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, `UPDATE catalogs SET invalidated_at = now(), invalidated_reason = $2
			WHERE source_id = $1 AND invalidated_at IS NULL`, sourceID, reason)
		n = tag.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("ledger: invalidate catalogs of source %d: %w", sourceID, err)
	}
	return n, nil
}
