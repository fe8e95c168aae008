package gate

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	sections = append(sections, section{"discovery", discovery})
}

// discoveryScenario is one fault of the discovery chaos run.
type discoveryScenario struct {
	name  string
	caps  chaosmcp.Capabilities
	setup func(srv *chaosmcp.Server)
}

var (
	plainCaps = chaosmcp.Capabilities{Subscribe: true, ListChanged: true}
	snapCaps  = chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: true}
)

// mutateOnce changes the set between pages 1 and 2 of the first round only, with the
// list_changed notification dropped (the R23 "multi-page change with the notification lost").
func mutateOnce(srv *chaosmcp.Server) {
	var done atomic.Bool
	srv.SuppressListChanged(true)
	srv.OnBetweenPages(func(k chaosmcp.ListKind, page int) {
		if k == chaosmcp.ListResources && page == 1 && done.CompareAndSwap(false, true) {
			srv.Set("demo://changed/between-pages", "new", "text/plain")
		}
	})
}

var discoveryScenarios = []discoveryScenario{
	{"honest negotiated snapshot IDs", snapCaps, func(srv *chaosmcp.Server) { srv.SetSnapshotMode(chaosmcp.SnapshotHonest) }},
	{"no snapshot extension", plainCaps, func(*chaosmcp.Server) {}},
	{"snapshot IDs not negotiated", plainCaps, func(srv *chaosmcp.Server) { srv.SetSnapshotMode(chaosmcp.SnapshotHonest) }},
	{"forged snapshot ID over a change between pages", snapCaps, func(srv *chaosmcp.Server) {
		srv.SetSnapshotMode(chaosmcp.SnapshotForged)
		mutateOnce(srv)
	}},
	{"snapshot ID varying by page", snapCaps, func(srv *chaosmcp.Server) { srv.SetSnapshotMode(chaosmcp.SnapshotPerPage) }},
	{"multi-page change with list_changed lost", plainCaps, mutateOnce},
	{"circular cursor", plainCaps, func(srv *chaosmcp.Server) { srv.SetCircularCursor(3, 1) }},
}

// discovery runs scans of sources under every discovery fault, asks each catalog for an
// integrity task and for display, and counts from the ledger what was handed out (R25): no
// unreconciled catalog is ever accepted and no SNAPSHOT_UNPROVEN catalog reaches an integrity
// task.
func discovery(ctx context.Context, g *run) ([]Row, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	levels := map[ledger.ProofLevel]int{}
	var att consumeAttempts
	for i, sc := range discoveryScenarios {
		srv := chaosmcp.New(chaosmcp.Options{Name: "discovery", Version: "1", PageSize: 3, Capabilities: &sc.caps})
		for r := 0; r < 20; r++ {
			srv.Set(fmt.Sprintf("demo://r/%04d", r), "x", "text/plain")
		}
		sc.setup(srv)
		h, err := srv.StartHTTP("127.0.0.1:0")
		if err != nil {
			srv.Close()
			return nil, err
		}
		context.AfterFunc(ctx, func() { h.Close(); srv.Close() })
		name := fmt.Sprintf("discovery-%d", i)
		if _, err := g.stack.MustCLI(ctx, "source", "add", name, "--url", h.URL); err != nil {
			return nil, err
		}
		// scan --wait exits 1 for RECONCILIATION_REQUIRED: that is a result here, not an error.
		if out, errOut, code := g.stack.CLI(ctx, "scan", name, "--wait", "--timeout", "3m"); code != 0 && code != 1 {
			return nil, fmt.Errorf("scan %s: exit %d: %s%s", name, code, out, errOut)
		}
		for _, purpose := range []ledger.CatalogPurpose{ledger.PurposeIntegrity, ledger.PurposeDisplay} {
			c, err := g.stack.Store.ConsumeCatalog(ctx, ledger.CatalogRequest{Source: name, Purpose: purpose, Consumer: "gate"})
			switch {
			case err == nil:
				att.handedOut(purpose, c.Catalog.Level)
				if purpose == ledger.PurposeDisplay {
					levels[c.Catalog.Level]++
				}
			case errors.Is(err, ledger.ErrCatalogRefused):
				att.refused++
				var ref *ledger.CatalogRefusal
				if purpose == ledger.PurposeDisplay && errors.As(err, &ref) && ref.Catalog != nil {
					levels[ref.Catalog.Level]++
				}
			case isCheckViolation(err):
				// The fence let the request through and only the table's CHECK stopped the
				// record: a broken fence, counted, not an error of the gate.
				att.schemaStopped(purpose)
			default:
				return nil, fmt.Errorf("catalog of %s for %s: %w", name, purpose, err)
			}
		}
		g.progress("discovery: %s scanned", sc.name)
	}
	counts, err := g.stack.Store.CatalogGateCounts(ctx)
	if err != nil {
		return nil, err
	}
	detail := fmt.Sprintf("%d consumption attempts by the gate: %d handed out, %d refused, %d stopped only by a CHECK constraint; %d fault scenarios; catalogs proven %d, unproven %d, reconciliation required %d; ledger-wide: integrity accepted %d, refused %d; display accepted %d, refused %d; tombstone confirmations from catalogs %d, refused %d; ledger-recorded violations %d",
		att.attempts(), att.handed, att.refused, att.stopped, len(discoveryScenarios), levels[ledger.ProofSnapshotProven], levels[ledger.ProofSnapshotUnproven], levels[ledger.ProofReconciliationRequired],
		counts.IntegrityAccepted, counts.IntegrityRefused, counts.DisplayAccepted, counts.DisplayRefused,
		counts.TombstoneAccepted, counts.TombstoneRefused, counts.UnreconciledAccepted+counts.UnprovenConsumedByIntegrity)
	// The rows count what the gate's own attempts were handed (a broken fence shows as a
	// non-zero count here), plus anything the ledger recorded as handed out against the rule.
	return []Row{
		zero("R25", "unreconciled catalogs accepted", att.unreconciled+int(counts.UnreconciledAccepted), detail),
		zero("R25", "SNAPSHOT_UNPROVEN consumed by integrity tasks", att.unprovenIntegrity+int(counts.UnprovenConsumedByIntegrity), ""),
	}, nil
}

// consumeAttempts tallies the gate's own ConsumeCatalog attempts by outcome (R25), judged from
// the catalog each attempt was handed rather than from what the ledger chose to record.
type consumeAttempts struct {
	handed, refused, stopped        int
	unreconciled, unprovenIntegrity int
}

// handedOut records an attempt that was handed a catalog of level for purpose, counting it
// as a violation when the level does not allow the purpose.
func (a *consumeAttempts) handedOut(purpose ledger.CatalogPurpose, level ledger.ProofLevel) {
	a.handed++
	if level != ledger.ProofSnapshotProven && level != ledger.ProofSnapshotUnproven {
		a.unreconciled++
	}
	if purpose == ledger.PurposeIntegrity && level != ledger.ProofSnapshotProven {
		a.unprovenIntegrity++
	}
}

// schemaStopped records an attempt the ledger's fence passed but the table's CHECK constraint
// rejected: a violation of the purpose's rule.
func (a *consumeAttempts) schemaStopped(purpose ledger.CatalogPurpose) {
	a.stopped++
	if purpose == ledger.PurposeIntegrity {
		a.unprovenIntegrity++
	} else {
		a.unreconciled++
	}
}

func (a *consumeAttempts) attempts() int { return a.handed + a.refused + a.stopped }

// isCheckViolation reports whether err is Postgres's check_violation (SQLSTATE 23514).
func isCheckViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23514"
}
