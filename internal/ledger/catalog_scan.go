package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

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
// taken from the session's own capability receipt. The source's count of recorded list_changed
// (InvalidateCatalogs) is copied into the row in the same statement: PublishCatalog compares it
// with the source's count when it publishes (R3, R6). It fails with ErrStaleScan unless
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
			session_generation, host_queue, snapshot_negotiated, list_changed_before,
			source_list_changed_seq)
		SELECT $1, $2, $3, $4, so.id, $6, $7, se.cap_snapshot_ids, $8, so.list_changed_seq
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

// ScanEntry is one entry of the set a round listed: Kind is EntryResource or EntryTemplate.
type ScanEntry = mcpsync.CatalogEntry

// EndScan records a round's end in one transaction: for a complete round (FailureKind empty)
// its digests, counts, snapshot IDs, list_changed window and entries; for a failed one its
// failure and what it saw until then. Only a RUNNING row ends; otherwise ErrStaleScan. The
// entries are written only if no earlier complete round of the source listed the same set
// (same set digest): then the round points at that round's entries, so re-checking an
// unchanged catalog writes no entries at all. Otherwise only the chunks of the set not stored
// yet are written (storeEntries), so a set that changed in a few entries writes a few chunks.
// An earlier round of that set whose entries are still being stored (EndScanDeferred) is
// waited for, so its entries are found. Every server-supplied string (names, MIME types,
// template URIs, failure text, snapshot IDs) is stored through SafeText.
func (s *Store) EndScan(ctx context.Context, end ScanEnd, entries []ScanEntry) (time.Time, error) {
	complete, err := end.check()
	if err != nil {
		return time.Time{}, err
	}
	var ended time.Time
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if complete {
			if err := awaitPendingEntries(ctx, tx, end); err != nil {
				return err
			}
		}
		var stored *int64
		var err error
		if ended, stored, err = endScanRow(ctx, tx, end, true); err != nil {
			return err
		}
		if !complete || stored == nil || *stored != end.ScanID || len(entries) == 0 {
			return nil // failed, or the set is already stored under an earlier round
		}
		return storeEntries(ctx, tx, end.ScanID, entries)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("ledger: end scan %d: %w", end.ScanID, err)
	}
	return ended, nil
}

// PendingEntries is a complete round's entries not yet stored (EndScanDeferred). Its
// transaction holds the round's row lock, which every reader of the round's entries waits for
// (a later round's EndScan, PublishCatalog); Store must be called once.
type PendingEntries struct {
	tx      pgx.Tx
	scanID  int64
	entries []ScanEntry // cut into chunks by Store, off the caller's path to the next round
}

// Store writes the entries and points the round at them (entries_scan_id), in the
// transaction that holds the lock, and commits; on any error it rolls back and the round
// stays COMPLETE without entries (entries_scan_id NULL): the next round of the same set then
// stores them itself (EndScan), and no catalog is published on this round's entries.
func (p *PendingEntries) Store(ctx context.Context) error {
	err := storeEntries(ctx, p.tx, p.scanID, p.entries)
	if err == nil {
		_, err = p.tx.Exec(ctx, `UPDATE discovery_scans SET entries_scan_id = id WHERE id = $1 AND entries_scan_id IS NULL`, p.scanID)
	}
	if err == nil {
		err = p.tx.Commit(ctx)
	}
	if err != nil {
		_ = p.tx.Rollback(context.WithoutCancel(ctx))
		return fmt.Errorf("ledger: store entries of scan %d: %w", p.scanID, err)
	}
	return nil
}

// EndScanDeferred records a round's end as EndScan does, but a complete round's entries, when
// they must be stored (no earlier complete round of the source listed the same set), are left
// to the returned PendingEntries, so that the caller can store them while the next round
// pages (issue 16 item 5). When it returns, the round's end is committed and, if
// PendingEntries is non-nil, its transaction already holds the round's row lock: a later
// round's EndScan and PublishCatalog wait for Store before they read the round's entries.
// With nothing to store it returns a nil PendingEntries.
func (s *Store) EndScanDeferred(ctx context.Context, end ScanEnd, entries []ScanEntry) (time.Time, *PendingEntries, error) {
	complete, err := end.check()
	if err != nil {
		return time.Time{}, nil, err
	}
	if !complete || len(entries) == 0 {
		ended, err := s.EndScan(ctx, end, entries)
		return ended, nil, err
	}
	var ended time.Time
	var stored *int64
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if err := awaitPendingEntries(ctx, tx, end); err != nil {
			return err
		}
		var err error
		ended, stored, err = endScanRow(ctx, tx, end, false)
		return err
	})
	if err != nil {
		return time.Time{}, nil, fmt.Errorf("ledger: end scan %d: %w", end.ScanID, err)
	}
	if stored != nil {
		return ended, nil, nil // an earlier round holds the set
	}
	p := &PendingEntries{scanID: end.ScanID, entries: entries}
	if p.tx, err = s.pool.BeginTx(ctx, readCommitted); err != nil {
		return ended, nil, fmt.Errorf("ledger: end scan %d: store entries: %w", end.ScanID, err)
	}
	// FOR NO KEY UPDATE: what the entries' UPDATE takes; it blocks FOR SHARE readers and lets
	// foreign keys (KEY SHARE) through.
	if _, err := p.tx.Exec(ctx, `SELECT 1 FROM discovery_scans WHERE id = $1 FOR NO KEY UPDATE`, end.ScanID); err != nil {
		_ = p.tx.Rollback(context.WithoutCancel(ctx))
		return ended, nil, fmt.Errorf("ledger: end scan %d: lock for entries: %w", end.ScanID, err)
	}
	return ended, p, nil
}

// check validates a round's end and escapes its server-supplied strings; it reports whether
// the round is complete.
func (end *ScanEnd) check() (bool, error) {
	complete := end.FailureKind == ""
	// Failure texts and snapshot IDs come from the server: store them escaped (SafeText).
	end.Failure, end.SnapshotID, end.SnapshotIDs = SafeText(end.Failure), SafeText(end.SnapshotID), SafeTexts(end.SnapshotIDs)
	if complete && end.SetDigest == "" {
		return false, fmt.Errorf("ledger: end scan %d: complete round without set digest: %w", end.ScanID, ErrInvalid)
	}
	return complete, nil
}

// awaitPendingEntries waits, inside tx, for every complete round of the same source and set
// whose entries are still being stored (entries_scan_id NULL, its PendingEntries holding the
// row lock), so that tx's next statement, with a new snapshot, finds them.
func awaitPendingEntries(ctx context.Context, tx pgx.Tx, end ScanEnd) error {
	_, err := tx.Exec(ctx, `SELECT 1 FROM discovery_scans x
		WHERE x.source_id = (SELECT source_id FROM discovery_scans WHERE id = $1)
		  AND x.id <> $1 AND x.outcome = 'COMPLETE' AND x.set_digest = $2 AND x.entries_scan_id IS NULL
		FOR SHARE`, end.ScanID, end.SetDigest)
	return err
}

// endScanRow ends a RUNNING round's row. A complete round points at the newest earlier
// complete round of the source with the same set and stored entries, or else, when selfHolds,
// at itself (its entries follow in the same transaction), or else at nothing (NULL: they
// follow in PendingEntries). It returns the end time and entries_scan_id.
func endScanRow(ctx context.Context, tx pgx.Tx, end ScanEnd, selfHolds bool) (time.Time, *int64, error) {
	complete := end.FailureKind == ""
	outcome, kind, failure, digest := ScanComplete, (*string)(nil), (*string)(nil), &end.SetDigest
	if !complete {
		outcome, kind, failure, digest = ScanFailed, &end.FailureKind, &end.Failure, nil
	}
	var snapshot *string
	if end.SnapshotID != "" {
		snapshot = &end.SnapshotID
	}
	var ended time.Time
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
				 ORDER BY x.id DESC LIMIT 1), CASE WHEN $17 THEN me.id END) END
		WHERE me.id = $1 AND me.outcome = 'RUNNING'
		RETURNING ended_at, entries_scan_id`, end.ScanID, outcome, kind, failure,
		end.Progress.ResourcePages, end.Progress.TemplatePages, end.Progress.Resources,
		end.Progress.Templates, end.Duplicates, nonNil(end.ResourceCursorDigests),
		nonNil(end.TemplateCursorDigests), digest, nonNil(end.SnapshotIDs), end.SnapshotPages,
		snapshot, end.ListChangedAfter, selfHolds).Scan(&ended, &stored)
	if err == pgx.ErrNoRows {
		return time.Time{}, nil, fmt.Errorf("scan %d: %w", end.ScanID, ErrStaleScan)
	}
	return ended, stored, err
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
		WHERE scan_key = $1 AND outcome = 'RUNNING'`, key, SafeText(reason))
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
