package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

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
	// PurposeTombstone: a deletion confirmed from a catalog (ConfirmTombstone): the URI's
	// absence from both rounds, after a not-found read, is a per-URI fact, not a complete
	// enumeration, so SNAPSHOT_PROVEN and SNAPSHOT_UNPROVEN serve (R7, R21). Recorded only by
	// ConfirmTombstone, never handed out by ConsumeCatalog.
	PurposeTombstone CatalogPurpose = "tombstone"
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
	// TombstoneAccepted and TombstoneRefused count the catalogs ConfirmTombstone used to
	// confirm a deletion and the confirmations it refused (R21, R25).
	TombstoneAccepted int64
	TombstoneRefused  int64
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
			count(*) FILTER (WHERE purpose = 'display' AND outcome = 'REFUSED'),
			count(*) FILTER (WHERE purpose = 'tombstone' AND outcome = 'ACCEPTED'),
			count(*) FILTER (WHERE purpose = 'tombstone' AND outcome = 'REFUSED')
		FROM catalog_consumptions`).Scan(&g.UnprovenConsumedByIntegrity, &g.UnreconciledAccepted,
		&g.IntegrityAccepted, &g.IntegrityRefused, &g.DisplayAccepted, &g.DisplayRefused,
		&g.TombstoneAccepted, &g.TombstoneRefused)
	if err != nil {
		return CatalogGate{}, fmt.Errorf("ledger: catalog gate counts: %w", err)
	}
	return g, nil
}
