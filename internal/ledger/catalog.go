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

// Scan outcomes of a discovery round.
const (
	ScanRunning  = "RUNNING"
	ScanComplete = "COMPLETE"
	ScanFailed   = "FAILED"
)

// Entry kinds of a catalog.
const (
	EntryResource = "resource"
	EntryTemplate = "template"
)

// ErrStaleScan: a round was started for a session generation that is not the source's
// current one, or a round's row is no longer RUNNING.
var ErrStaleScan = errors.New("ledger: scan is not on the current session or no longer running")

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

// ScanStart opens a round's resourceDiscoveryScan.v1 row.
type ScanStart struct {
	Key               string // unique per round
	Run               string // scan workflow ID and run ID
	ScanWorkflowID    string
	Round             int
	SourceID          int64
	SessionGeneration int64
	HostQueue         string
	ListChangedBefore int64
}

// BeginScan records the start of a round just before its first request: the row's started_at
// is the time of the first request (R4), and whether the snapshot extension was negotiated is
// taken from the session's own capability receipt. It fails with ErrStaleScan unless
// SessionGeneration is the source's current, live session, and with ErrInvalid if the key was
// used before.
func (s *Store) BeginScan(ctx context.Context, st ScanStart) (int64, time.Time, error) {
	if st.Key == "" || st.Run == "" || st.Round < 1 {
		return 0, time.Time{}, fmt.Errorf("ledger: begin scan %+v: %w", st, ErrInvalid)
	}
	var id int64
	var started time.Time
	err := s.pool.QueryRow(ctx, `
		INSERT INTO discovery_scans (scan_key, scan_run, scan_workflow_id, round, source_id,
			session_generation, host_queue, snapshot_negotiated, list_changed_before)
		SELECT $1, $2, $3, $4, so.id, $6, $7, se.cap_snapshot_ids, $8
		FROM sources so JOIN sessions se ON se.source_id = so.id AND se.generation = so.current_generation
		WHERE so.id = $5 AND so.current_generation = $6 AND se.ended_at IS NULL
		ON CONFLICT (scan_key) DO NOTHING
		RETURNING id, started_at`, st.Key, st.Run, st.ScanWorkflowID, st.Round, st.SourceID,
		st.SessionGeneration, st.HostQueue, st.ListChangedBefore).Scan(&id, &started)
	if err == nil {
		return id, started, nil
	}
	if err != pgx.ErrNoRows {
		return 0, time.Time{}, fmt.Errorf("ledger: begin scan %s: %w", st.Key, err)
	}
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM discovery_scans WHERE scan_key = $1)`, st.Key).Scan(&exists); err != nil {
		return 0, time.Time{}, fmt.Errorf("ledger: begin scan %s: %w", st.Key, err)
	}
	if exists {
		return 0, time.Time{}, fmt.Errorf("ledger: begin scan: key %s already used: %w", st.Key, ErrInvalid)
	}
	return 0, time.Time{}, fmt.Errorf("ledger: begin scan of source %d on generation %d: %w", st.SourceID, st.SessionGeneration, ErrStaleScan)
}

// ScanProgress is a running round's progress.
type ScanProgress struct {
	ResourcePages int
	TemplatePages int
	Resources     int
	Templates     int
}

// RecordScanProgress stores a running round's progress (for `mcpsync scan --wait`).
func (s *Store) RecordScanProgress(ctx context.Context, scanID int64, p ScanProgress) error {
	_, err := s.pool.Exec(ctx, `UPDATE discovery_scans SET resource_pages = $2, template_pages = $3,
			resource_count = $4, template_count = $5, progress_at = clock_timestamp()
		WHERE id = $1 AND outcome = 'RUNNING'`, scanID, p.ResourcePages, p.TemplatePages, p.Resources, p.Templates)
	if err != nil {
		return fmt.Errorf("ledger: scan %d progress: %w", scanID, err)
	}
	return nil
}

// ScanEnd is what a finished round reports, complete or failed.
type ScanEnd struct {
	ScanID                int64
	FailureKind           string // empty for a complete round
	Failure               string
	Progress              ScanProgress
	Duplicates            int
	ResourceCursorDigests []string
	TemplateCursorDigests []string
	SetDigest             string // required for a complete round
	SnapshotIDs           []string
	SnapshotPages         int
	SnapshotID            string // the one ID every page carried, if any
	ListChangedAfter      int64
}

// ScanEntry is one entry of the set a round listed.
type ScanEntry struct {
	Kind      string // EntryResource or EntryTemplate
	URI       string // normalized URI, or the URI template
	ServerURI string
	Name      string
	MIMEType  string
}

// EndScan records a round's end in one transaction: for a complete round (FailureKind empty)
// its digests, counts, snapshot IDs, list_changed window and entries; for a failed one its
// failure and what it saw until then. Only a RUNNING row ends; otherwise ErrStaleScan. The
// entries are written only if no earlier complete round of the source listed the same set
// (same set digest): then the round points at that round's entries, so re-checking an
// unchanged catalog writes no entries at all.
func (s *Store) EndScan(ctx context.Context, end ScanEnd, entries []ScanEntry) (time.Time, error) {
	complete := end.FailureKind == ""
	if complete && end.SetDigest == "" {
		return time.Time{}, fmt.Errorf("ledger: end scan %d: complete round without set digest: %w", end.ScanID, ErrInvalid)
	}
	var ended time.Time
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		outcome, kind, failure, digest := ScanComplete, (*string)(nil), (*string)(nil), &end.SetDigest
		if !complete {
			outcome, kind, failure, digest = ScanFailed, &end.FailureKind, &end.Failure, nil
		}
		var snapshot *string
		if end.SnapshotID != "" {
			snapshot = &end.SnapshotID
		}
		var stored *int64
		err := tx.QueryRow(ctx, `UPDATE discovery_scans me SET outcome = $2, failure_kind = $3, failure = $4,
				ended_at = clock_timestamp(), resource_pages = $5, template_pages = $6,
				resource_count = $7, template_count = $8, duplicate_count = $9,
				resource_cursor_digests = $10, template_cursor_digests = $11, set_digest = $12,
				snapshot_ids = $13, snapshot_pages = $14, snapshot_id = $15,
				list_changed_after = $16, list_changed_observed = greatest($16 - list_changed_before, 0),
				entries_scan_id = CASE WHEN $2 = 'COMPLETE' THEN coalesce(
					(SELECT x.entries_scan_id FROM discovery_scans x
					 WHERE x.source_id = me.source_id AND x.outcome = 'COMPLETE' AND x.set_digest = $12
					   AND x.entries_scan_id IS NOT NULL
					 ORDER BY x.id DESC LIMIT 1), me.id) END
			WHERE me.id = $1 AND me.outcome = 'RUNNING'
			RETURNING ended_at, entries_scan_id`, end.ScanID, outcome, kind, failure,
			end.Progress.ResourcePages, end.Progress.TemplatePages, end.Progress.Resources,
			end.Progress.Templates, end.Duplicates, nonNil(end.ResourceCursorDigests),
			nonNil(end.TemplateCursorDigests), digest, nonNil(end.SnapshotIDs), end.SnapshotPages,
			snapshot, end.ListChangedAfter).Scan(&ended, &stored)
		if err == pgx.ErrNoRows {
			return fmt.Errorf("scan %d: %w", end.ScanID, ErrStaleScan)
		}
		if err != nil || !complete || stored == nil || *stored != end.ScanID || len(entries) == 0 {
			return err // failed, or the set is already stored under an earlier round
		}
		batches := entryBatches(end.ScanID, entries)
		_, err = tx.CopyFrom(ctx, pgx.Identifier{"catalog_entry_batches"},
			[]string{"scan_id", "batch", "kind", "uris", "server_uris", "names", "mime_types"},
			pgx.CopyFromRows(batches))
		return err
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("ledger: end scan %d: %w", end.ScanID, err)
	}
	return ended, nil
}

// entryBatchSize is the most entries stored in one catalog_entry_batches row.
const entryBatchSize = 1000

// entryBatches cuts entries, in their order, into rows of catalog_entry_batches: at most
// entryBatchSize entries of one kind each.
func entryBatches(scanID int64, entries []ScanEntry) [][]any {
	var rows [][]any
	for start := 0; start < len(entries); {
		end := start
		for end < len(entries) && end-start < entryBatchSize && entries[end].Kind == entries[start].Kind {
			end++
		}
		n := end - start
		uris, servers, names, mimes := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		normalized := false
		for i, e := range entries[start:end] {
			uris[i], servers[i], names[i], mimes[i] = e.URI, e.ServerURI, e.Name, e.MIMEType
			normalized = normalized || e.URI != e.ServerURI
		}
		if !normalized {
			uris = nil // stored as NULL: every URI is already in normal form
		}
		rows = append(rows, []any{scanID, len(rows), entries[start].Kind, uris, servers, names, mimes})
		start = end
	}
	return rows
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// AbandonScan fails a round whose activity ended without recording its end (timeout, lost
// worker), so that no row stays RUNNING. It reports whether a RUNNING row was failed.
func (s *Store) AbandonScan(ctx context.Context, key, reason string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE discovery_scans SET outcome = 'FAILED', failure_kind = 'ABANDONED',
			failure = $2, ended_at = clock_timestamp()
		WHERE scan_key = $1 AND outcome = 'RUNNING'`, key, reason)
	if err != nil {
		return false, fmt.Errorf("ledger: abandon scan %s: %w", key, err)
	}
	return tag.RowsAffected() > 0, nil
}

// Scan is a stored resourceDiscoveryScan.v1.
type Scan struct {
	ID                    int64
	Key                   string
	Run                   string
	ScanWorkflowID        string
	Round                 int
	SourceID              int64
	SessionGeneration     int64
	HostQueue             string
	StartedAt             time.Time
	EndedAt               *time.Time
	Outcome               string
	FailureKind           string
	Failure               string
	Progress              ScanProgress
	Duplicates            int
	ResourceCursorDigests []string
	TemplateCursorDigests []string
	SetDigest             string
	EntriesScanID         *int64 // the round whose catalog_entries hold this round's set
	SnapshotNegotiated    bool
	SnapshotIDs           []string
	SnapshotPages         int
	SnapshotID            string
	ListChangedBefore     int64
	ListChangedAfter      *int64
	ListChangedObserved   int64
	ProgressAt            *time.Time
}

const scanColumns = `id, scan_key, scan_run, scan_workflow_id, round, source_id, session_generation,
	host_queue, started_at, ended_at, outcome, coalesce(failure_kind, ''), coalesce(failure, ''),
	resource_pages, template_pages, resource_count, template_count, duplicate_count,
	resource_cursor_digests, template_cursor_digests, coalesce(set_digest, ''), entries_scan_id, snapshot_negotiated,
	snapshot_ids, snapshot_pages, coalesce(snapshot_id, ''), list_changed_before, list_changed_after,
	list_changed_observed, progress_at`

func scanScan(row pgx.Row) (Scan, error) {
	var x Scan
	err := row.Scan(&x.ID, &x.Key, &x.Run, &x.ScanWorkflowID, &x.Round, &x.SourceID,
		&x.SessionGeneration, &x.HostQueue, &x.StartedAt, &x.EndedAt, &x.Outcome, &x.FailureKind,
		&x.Failure, &x.Progress.ResourcePages, &x.Progress.TemplatePages, &x.Progress.Resources,
		&x.Progress.Templates, &x.Duplicates, &x.ResourceCursorDigests, &x.TemplateCursorDigests,
		&x.SetDigest, &x.EntriesScanID, &x.SnapshotNegotiated, &x.SnapshotIDs, &x.SnapshotPages, &x.SnapshotID,
		&x.ListChangedBefore, &x.ListChangedAfter, &x.ListChangedObserved, &x.ProgressAt)
	return x, err
}

// ScanByID returns one round, or ErrNotFound.
func (s *Store) ScanByID(ctx context.Context, id int64) (Scan, error) {
	x, err := scanScan(s.pool.QueryRow(ctx, `SELECT `+scanColumns+` FROM discovery_scans WHERE id = $1`, id))
	if err != nil {
		return Scan{}, notFound(err, fmt.Sprintf("ledger: scan %d", id))
	}
	return x, nil
}

// ScansOfWorkflow returns the rounds of a scan workflow (all its runs) in the order they
// started.
func (s *Store) ScansOfWorkflow(ctx context.Context, scanWorkflowID string) ([]Scan, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+scanColumns+` FROM discovery_scans
		WHERE scan_workflow_id = $1 ORDER BY id`, scanWorkflowID)
	if err != nil {
		return nil, fmt.Errorf("ledger: scans of %s: %w", scanWorkflowID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Scan, error) { return scanScan(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: scans of %s: %w", scanWorkflowID, err)
	}
	return out, nil
}

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
// when the server sends no list_changed. A refused level returns a *ProofRefusal
// (errors.Is ErrProofRefused). Replaying a published key returns the stored catalog.
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
		err = s.pool.QueryRow(ctx, `
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
	} else {
		if len(req.BasisScanIDs) != 2 {
			return Catalog{}, &ProofRefusal{Level: req.Level, Reason: "two rounds are required (R24)"}
		}
		err = s.pool.QueryRow(ctx, `
			INSERT INTO catalogs (catalog_key, source_id, session_generation, scan_workflow_id,
				proof_level, reason, rounds_used, basis_scan_ids, entries_scan_id, set_digest,
				snapshot_id, resource_count, template_count, scans_started_at, measured_at,
				staleness_bound, next_check_at)
			SELECT $1, b.source_id, b.session_generation, $3, $4, $5, $6, ARRAY[a.id, b.id], b.entries_scan_id,
			       b.set_digest, CASE WHEN $4 = 'SNAPSHOT_PROVEN' THEN b.snapshot_id END,
			       b.resource_count, b.template_count, a.started_at, b.ended_at,
			       (b.ended_at - a.started_at) + make_interval(secs => $9),
			       b.ended_at + make_interval(secs => $9)
			FROM discovery_scans a JOIN discovery_scans b ON b.id = $8
			WHERE a.id = $7 AND a.id <> b.id AND a.source_id = $2 AND b.source_id = $2
			  AND a.scan_run = b.scan_run AND b.round = a.round + 1
			  AND a.session_generation = b.session_generation
			  AND a.outcome = 'COMPLETE' AND b.outcome = 'COMPLETE' AND b.started_at >= a.ended_at
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
			RETURNING id`, req.Key, req.SourceID, req.ScanWorkflowID, string(req.Level), req.Reason,
			req.RoundsUsed, req.BasisScanIDs[0], req.BasisScanIDs[1], req.Recheck.Seconds()).Scan(&id)
	}
	if err == pgx.ErrNoRows {
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

// InvalidateCatalogs marks every not yet invalidated catalog of a source as invalidated: a
// list_changed arrived, so none of them may vouch for the current set any more (R3). It
// returns how many catalogs it marked.
func (s *Store) InvalidateCatalogs(ctx context.Context, sourceID int64, reason string) (int64, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE catalogs SET invalidated_at = now(), invalidated_reason = $2
		WHERE source_id = $1 AND invalidated_at IS NULL`, sourceID, reason)
	if err != nil {
		return 0, fmt.Errorf("ledger: invalidate catalogs of source %d: %w", sourceID, err)
	}
	return tag.RowsAffected(), nil
}

// CatalogPurpose is what a consumer needs a catalog for.
type CatalogPurpose string

// Catalog purposes.
const (
	// PurposeIntegrity: a task that needs a complete enumeration (permission revocation,
	// cleanup). Only SNAPSHOT_PROVEN, not invalidated and not overdue, is handed out (R7, R25).
	PurposeIntegrity CatalogPurpose = "integrity"
	// PurposeDisplay: showing or browsing. SNAPSHOT_PROVEN and SNAPSHOT_UNPROVEN are handed
	// out with their proof level and freshness.
	PurposeDisplay CatalogPurpose = "display"
)

// Valid reports whether p is a known purpose.
func (p CatalogPurpose) Valid() bool { return p == PurposeIntegrity || p == PurposeDisplay }

// Refusal reasons of ConsumeCatalog.
const (
	// RefusalNoCatalog: the source has no published catalog yet.
	RefusalNoCatalog = "NO_CATALOG"
	// RefusalNotProven: an integrity task asked and the newest catalog is not SNAPSHOT_PROVEN.
	RefusalNotProven = "NOT_PROVEN"
	// RefusalReconciliationRequired: the newest catalog needs reconciliation.
	RefusalReconciliationRequired = "RECONCILIATION_REQUIRED"
	// RefusalInvalidated: an integrity task asked and a list_changed invalidated the catalog.
	RefusalInvalidated = "INVALIDATED"
	// RefusalExpired: an integrity task asked and the catalog's promised re-check is overdue
	// by more than its staleness bound (now > nextCheckAt + stalenessBound).
	RefusalExpired = "EXPIRED"
)

// ErrCatalogRefused: ConsumeCatalog refused the source's newest catalog for the purpose.
// errors.As with *CatalogRefusal gives the reason and the catalog.
var ErrCatalogRefused = errors.New("ledger: catalog refused")

// CatalogRefusal is the typed refusal of ConsumeCatalog. It satisfies errors.Is with
// ErrCatalogRefused, and with ErrNotFound when the source has no catalog at all.
type CatalogRefusal struct {
	Source        string
	Purpose       CatalogPurpose
	Reason        string   // one of the Refusal* constants
	Catalog       *Catalog // the refused catalog; nil for RefusalNoCatalog
	ConsumptionID int64    // the recorded refusal
}

// Error describes the refusal.
func (e *CatalogRefusal) Error() string {
	if e.Catalog == nil {
		return fmt.Sprintf("ledger: catalog of %s refused for %s: %s", e.Source, e.Purpose, e.Reason)
	}
	return fmt.Sprintf("ledger: catalog %d of %s refused for %s: %s (proof level %s)",
		e.Catalog.ID, e.Source, e.Purpose, e.Reason, e.Catalog.Level)
}

// Is makes errors.Is(err, ErrCatalogRefused) hold, and errors.Is(err, ErrNotFound) for a
// source without catalog.
func (e *CatalogRefusal) Is(target error) bool {
	return target == ErrCatalogRefused || (target == ErrNotFound && e.Reason == RefusalNoCatalog)
}

// CatalogRequest asks for the newest catalog of a source for a purpose; Consumer names the
// task asking, for the record.
type CatalogRequest struct {
	Source   string
	Purpose  CatalogPurpose
	Consumer string
}

// ConsumedCatalog is an accepted catalog with its entries and the consumption record.
type ConsumedCatalog struct {
	Catalog       Catalog
	Entries       []ScanEntry
	ConsumptionID int64
}

// ConsumeCatalog hands the source's newest catalog to a consumer if the purpose allows it, and
// records the consumption or the refusal, decided and recorded in one statement (R25):
// integrity gets only a SNAPSHOT_PROVEN catalog that no list_changed invalidated and whose
// re-check is not overdue; display gets SNAPSHOT_PROVEN or SNAPSHOT_UNPROVEN;
// RECONCILIATION_REQUIRED goes to nobody. A refusal is
// a *CatalogRefusal (errors.Is ErrCatalogRefused); an unknown source is ErrNotFound.
func (s *Store) ConsumeCatalog(ctx context.Context, req CatalogRequest) (ConsumedCatalog, error) {
	if !req.Purpose.Valid() || req.Consumer == "" {
		return ConsumedCatalog{}, fmt.Errorf("ledger: consume catalog: purpose %q, consumer %q: %w", req.Purpose, req.Consumer, ErrInvalid)
	}
	var consumption int64
	var catalogID *int64
	var refusal *string
	err := s.pool.QueryRow(ctx, `
		WITH so AS (SELECT id FROM sources WHERE name = $1),
		c AS (SELECT c.id, c.proof_level, c.invalidated_at, c.next_check_at, c.staleness_bound
		      FROM catalogs c JOIN so ON c.source_id = so.id
		      ORDER BY c.measured_at DESC, c.id DESC LIMIT 1),
		d AS (SELECT so.id AS source_id, c.id AS catalog_id, c.proof_level,
		             CASE WHEN c.id IS NULL THEN 'NO_CATALOG'
		                  WHEN c.proof_level = 'RECONCILIATION_REQUIRED' THEN 'RECONCILIATION_REQUIRED'
		                  WHEN $2 = 'integrity' AND c.proof_level <> 'SNAPSHOT_PROVEN' THEN 'NOT_PROVEN'
		                  WHEN $2 = 'integrity' AND c.invalidated_at IS NOT NULL THEN 'INVALIDATED'
		                  WHEN $2 = 'integrity' AND now() > c.next_check_at + c.staleness_bound THEN 'EXPIRED'
		             END AS refusal
		      FROM so LEFT JOIN c ON true)
		INSERT INTO catalog_consumptions (source_id, catalog_id, consumer, purpose, proof_level, outcome, refusal)
		SELECT source_id, catalog_id, $3, $2, proof_level,
		       CASE WHEN refusal IS NULL THEN 'ACCEPTED' ELSE 'REFUSED' END, refusal
		FROM d
		RETURNING id, catalog_id, refusal`, req.Source, string(req.Purpose), req.Consumer).Scan(&consumption, &catalogID, &refusal)
	if err == pgx.ErrNoRows {
		return ConsumedCatalog{}, fmt.Errorf("ledger: catalog of source %q: %w", req.Source, ErrNotFound)
	}
	if err != nil {
		return ConsumedCatalog{}, fmt.Errorf("ledger: consume catalog of %q: %w", req.Source, err)
	}
	var cat *Catalog
	if catalogID != nil {
		c, err := s.CatalogByID(ctx, *catalogID)
		if err != nil {
			return ConsumedCatalog{}, err
		}
		cat = &c
	}
	if refusal != nil {
		return ConsumedCatalog{}, &CatalogRefusal{Source: req.Source, Purpose: req.Purpose, Reason: *refusal, Catalog: cat, ConsumptionID: consumption}
	}
	entries, err := s.CatalogEntries(ctx, cat.ID)
	if err != nil {
		return ConsumedCatalog{}, err
	}
	return ConsumedCatalog{Catalog: *cat, Entries: entries, ConsumptionID: consumption}, nil
}

// CatalogGate holds the release-gate counts of catalog consumption (R25); the first two must
// be 0.
type CatalogGate struct {
	// UnprovenConsumedByIntegrity counts catalogs short of SNAPSHOT_PROVEN handed to
	// integrity tasks.
	UnprovenConsumedByIntegrity int64
	// UnreconciledAccepted counts RECONCILIATION_REQUIRED catalogs handed to anybody.
	UnreconciledAccepted int64
	// IntegrityAccepted, IntegrityRefused, DisplayAccepted and DisplayRefused count the rest.
	IntegrityAccepted int64
	IntegrityRefused  int64
	DisplayAccepted   int64
	DisplayRefused    int64
}

// CatalogGateCounts counts catalog consumptions and refusals for the release gate (R25).
func (s *Store) CatalogGateCounts(ctx context.Context) (CatalogGate, error) {
	var g CatalogGate
	err := s.pool.QueryRow(ctx, `SELECT
			count(*) FILTER (WHERE purpose = 'integrity' AND outcome = 'ACCEPTED' AND proof_level IS DISTINCT FROM 'SNAPSHOT_PROVEN'),
			count(*) FILTER (WHERE outcome = 'ACCEPTED' AND proof_level IS DISTINCT FROM 'SNAPSHOT_PROVEN' AND proof_level IS DISTINCT FROM 'SNAPSHOT_UNPROVEN'),
			count(*) FILTER (WHERE purpose = 'integrity' AND outcome = 'ACCEPTED'),
			count(*) FILTER (WHERE purpose = 'integrity' AND outcome = 'REFUSED'),
			count(*) FILTER (WHERE purpose = 'display' AND outcome = 'ACCEPTED'),
			count(*) FILTER (WHERE purpose = 'display' AND outcome = 'REFUSED')
		FROM catalog_consumptions`).Scan(&g.UnprovenConsumedByIntegrity, &g.UnreconciledAccepted,
		&g.IntegrityAccepted, &g.IntegrityRefused, &g.DisplayAccepted, &g.DisplayRefused)
	if err != nil {
		return CatalogGate{}, fmt.Errorf("ledger: catalog gate counts: %w", err)
	}
	return g, nil
}
