package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

const catURI = "demo://cat/1"

// catFixture is a source with a live session on which rounds and catalogs are recorded.
type catFixture struct {
	t    *testing.T
	ctx  context.Context
	st   *ledger.Store
	src  ledger.Source
	gen  int64
	runs int
}

func newCatFixture(t *testing.T, snapshot bool) *catFixture {
	t.Helper()
	f := &catFixture{t: t, ctx: context.Background(), st: ledger.New(pgtest.NewPool(t))}
	f.src = f.addSource("cat")
	f.openSession(f.src.ID, snapshot)
	return f
}

func (f *catFixture) addSource(name string) ledger.Source {
	f.t.Helper()
	src, _, err := f.st.AddSource(f.ctx, ledger.SourceSpec{Name: name, Transport: ledger.TransportStdio, Command: []string{"srv"}})
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.st.ClaimSources(f.ctx, "cat-host", time.Minute); err != nil {
		f.t.Fatal(err)
	}
	if _, _, err := f.st.GrantAccess(f.ctx, "p", src.ID, "test"); err != nil {
		f.t.Fatal(err)
	}
	return src
}

func (f *catFixture) openSession(sourceID int64, snapshot bool) int64 {
	f.t.Helper()
	sess, _, err := f.st.OpenSession(f.ctx, sourceID, "cat-host", ledger.CapabilityReceipt{
		ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true, ListChanged: true, SnapshotIDs: snapshot,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	if sourceID == f.src.ID {
		f.gen = sess.Generation
	}
	return sess.Generation
}

// spec describes one round.
type spec struct {
	source      int64    // 0: the fixture's source
	set         string   // the set digest's distinguishing part
	uris        []string // entries; nil: one entry, "demo://other"
	failed      string   // failure kind
	listChanged int64
	snapshot    string // ID carried by every page
	duplicates  int
	upper       bool // the server spells every URI with an upper-case scheme
}

// newRun returns a fresh scan run name.
func (f *catFixture) newRun() string {
	f.runs++
	return fmt.Sprintf("scan/cat/%d/run", f.runs)
}

// round records round n of run as sp says and returns it.
func (f *catFixture) round(run string, n int, sp spec) ledger.Scan {
	f.t.Helper()
	source := sp.source
	if source == 0 {
		source = f.src.ID
	}
	var gen int64
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT current_generation FROM sources WHERE id = $1`, source).Scan(&gen); err != nil {
		f.t.Fatal(err)
	}
	id, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{
		Key: fmt.Sprintf("%s/round-%d", run, n), Run: run, ScanWorkflowID: run, Round: n, SourceID: source, SessionGeneration: gen,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	uris := sp.uris
	if uris == nil {
		uris = []string{"demo://other"}
	}
	var entries []ledger.ScanEntry
	for _, u := range uris {
		server := u
		if sp.upper {
			scheme, rest, _ := strings.Cut(u, ":")
			server = strings.ToUpper(scheme) + ":" + rest
		}
		entries = append(entries, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: server, Name: "n"})
	}
	end := ledger.ScanEnd{ScanID: id, FailureKind: sp.failed, Failure: sp.failed, SetDigest: "sha256:" + sp.set,
		Progress: ledger.ScanProgress{ResourcePages: 2, TemplatePages: 1, Resources: len(uris)}, Duplicates: sp.duplicates,
		ListChangedAfter: sp.listChanged, ResourceCursorDigests: []string{"c1"}}
	if sp.failed != "" {
		end.SetDigest, entries = "", nil
	}
	if sp.snapshot != "" {
		end.SnapshotIDs, end.SnapshotPages, end.SnapshotID = []string{sp.snapshot}, 3, sp.snapshot
	}
	if _, err := f.st.EndScan(f.ctx, end, entries); err != nil {
		f.t.Fatal(err)
	}
	sc, err := f.st.ScanByID(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sc
}

// pair records rounds 1 and 2 of a new run and returns them.
func (f *catFixture) pair(a, b spec) (string, ledger.Scan, ledger.Scan) {
	run := f.newRun()
	return run, f.round(run, 1, a), f.round(run, 2, b)
}

func (f *catFixture) publish(run string, level ledger.ProofLevel, basis ...int64) (ledger.Catalog, error) {
	return f.st.PublishCatalog(f.ctx, ledger.PublishRequest{
		Key: run, ScanWorkflowID: run, SourceID: f.src.ID, SessionGeneration: f.gen, Level: level,
		Reason: "test", RoundsUsed: 2, BasisScanIDs: basis, Recheck: time.Minute,
	})
}

// publishSet stores set as two complete rounds (set digest digest) of a new scan run, publishes
// them as a SNAPSHOT_UNPROVEN catalog and returns it with its entries as CatalogEntries reads
// them back.
func (f *catFixture) publishSet(set []ledger.ScanEntry, digest string) (ledger.Catalog, []ledger.ScanEntry) {
	f.t.Helper()
	run := f.newRun()
	var ids []int64
	for n := 1; n <= 2; n++ {
		id, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: fmt.Sprintf("%s/%d", run, n), Run: run, ScanWorkflowID: run, Round: n, SourceID: f.src.ID, SessionGeneration: f.gen})
		if err != nil {
			f.t.Fatal(err)
		}
		if _, err := f.st.EndScan(f.ctx, ledger.ScanEnd{ScanID: id, SetDigest: digest}, set); err != nil {
			f.t.Fatalf("end scan of set %s: %v", digest, err)
		}
		ids = append(ids, id)
	}
	c, err := f.publish(run, ledger.ProofSnapshotUnproven, ids...)
	if err != nil {
		f.t.Fatal(err)
	}
	got, err := f.st.CatalogEntries(f.ctx, c.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	return c, got
}

// BeginScan only opens rounds on the source's current, live session.
func TestBeginScanFence(t *testing.T) {
	f := newCatFixture(t, true)
	old := f.gen
	f.openSession(f.src.ID, false)
	_, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: "k1", Run: "r", ScanWorkflowID: "r", Round: 1, SourceID: f.src.ID, SessionGeneration: old})
	if !errors.Is(err, ledger.ErrStaleScan) {
		t.Errorf("round on the old generation: %v, want ErrStaleScan", err)
	}
	id, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: "k2", Run: "r", ScanWorkflowID: "r", Round: 1, SourceID: f.src.ID, SessionGeneration: f.gen})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: "k2", Run: "r", ScanWorkflowID: "r", Round: 1, SourceID: f.src.ID, SessionGeneration: f.gen}); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("reused key: %v, want ErrInvalid", err)
	}
	sc, err := f.st.ScanByID(f.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if sc.SnapshotNegotiated {
		t.Errorf("round on a session without the snapshot extension recorded it as negotiated")
	}
	if ok, err := f.st.AbandonScan(f.ctx, "k2", "lost"); err != nil || !ok {
		t.Fatalf("abandon: %v %v", ok, err)
	}
	if _, err := f.st.EndScan(f.ctx, ledger.ScanEnd{ScanID: id, SetDigest: "sha256:x"}, nil); !errors.Is(err, ledger.ErrStaleScan) {
		t.Errorf("ending an abandoned round: %v, want ErrStaleScan", err)
	}
}

// PublishCatalog re-checks in its WHERE clause that the rounds prove the level (R5-R7, R24).
func TestPublishCatalogFences(t *testing.T) {
	tests := []struct {
		name     string
		snapshot bool // the session negotiated the extension
		level    ledger.ProofLevel
		build    func(f *catFixture) (run string, basis []int64)
		refusal  string // "" : published
	}{
		{
			name: "equal rounds publish UNPROVEN", level: ledger.ProofSnapshotUnproven,
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S"}, spec{set: "S"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "different sets", level: ledger.ProofSnapshotUnproven, refusal: "set digests differ",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S"}, spec{set: "T"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "list_changed during round A", level: ledger.ProofSnapshotUnproven, refusal: "list_changed",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S", listChanged: 1}, spec{set: "S"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "a failed round", level: ledger.ProofSnapshotUnproven, refusal: "did not complete",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S"}, spec{failed: "CURSOR_CYCLE"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "a single round twice (R24)", level: ledger.ProofSnapshotUnproven, refusal: "single round",
			build: func(f *catFixture) (string, []int64) {
				run, a, _ := f.pair(spec{set: "S"}, spec{set: "S"})
				return run, []int64{a.ID, a.ID}
			},
		},
		{
			name: "a single round alone (R24)", level: ledger.ProofSnapshotUnproven, refusal: "two rounds",
			build: func(f *catFixture) (string, []int64) {
				run, a, _ := f.pair(spec{set: "S"}, spec{set: "S"})
				return run, []int64{a.ID}
			},
		},
		{
			name: "rounds not consecutive", level: ledger.ProofSnapshotUnproven, refusal: "not consecutive",
			build: func(f *catFixture) (string, []int64) {
				run := f.newRun()
				a := f.round(run, 1, spec{set: "S"})
				f.round(run, 2, spec{set: "T"})
				c := f.round(run, 3, spec{set: "S"})
				return run, []int64{a.ID, c.ID}
			},
		},
		{
			name: "rounds of two scans", level: ledger.ProofSnapshotUnproven, refusal: "not consecutive",
			build: func(f *catFixture) (string, []int64) {
				_, a, _ := f.pair(spec{set: "S"}, spec{set: "S"})
				run, _, b := f.pair(spec{set: "S"}, spec{set: "S"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "rounds on two sessions", level: ledger.ProofSnapshotUnproven, refusal: "different session generations",
			build: func(f *catFixture) (string, []int64) {
				run := f.newRun()
				a := f.round(run, 1, spec{set: "S"})
				f.openSession(f.src.ID, false)
				b := f.round(run, 2, spec{set: "S"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "an entry listed twice", level: ledger.ProofSnapshotUnproven, refusal: "listed an entry twice",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S", duplicates: 1}, spec{set: "S", duplicates: 1})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "negotiated ID on every page of both rounds publishes PROVEN", snapshot: true, level: ledger.ProofSnapshotProven,
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S", snapshot: "X"}, spec{set: "S", snapshot: "X"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "IDs without the negotiated extension", level: ledger.ProofSnapshotProven, refusal: "not negotiated",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S", snapshot: "X"}, spec{set: "S", snapshot: "X"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "IDs differing between rounds", snapshot: true, level: ledger.ProofSnapshotProven, refusal: "vary or are missing",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S", snapshot: "X"}, spec{set: "S", snapshot: "Y"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "IDs varying within a round", snapshot: true, level: ledger.ProofSnapshotProven, refusal: "vary or are missing",
			build: func(f *catFixture) (string, []int64) {
				run, a, b := f.pair(spec{set: "S"}, spec{set: "S", snapshot: "X"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "an ID that named another set on the session is forged", snapshot: true, level: ledger.ProofSnapshotProven, refusal: "forged",
			build: func(f *catFixture) (string, []int64) {
				f.pair(spec{set: "OLD", snapshot: "X"}, spec{set: "T"})
				run, a, b := f.pair(spec{set: "S", snapshot: "X"}, spec{set: "S", snapshot: "X"})
				return run, []int64{a.ID, b.ID}
			},
		},
		{
			name: "RECONCILIATION_REQUIRED is always publishable", level: ledger.ProofReconciliationRequired,
			build: func(f *catFixture) (string, []int64) {
				run, _, _ := f.pair(spec{failed: "CURSOR_CYCLE"}, spec{failed: "CURSOR_CYCLE"})
				return run, nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, tt.snapshot)
			run, basis := tt.build(f)
			c, err := f.publish(run, tt.level, basis...)
			if tt.refusal != "" {
				var pr *ledger.ProofRefusal
				if !errors.As(err, &pr) || !errors.Is(err, ledger.ErrProofRefused) || !strings.Contains(pr.Reason, tt.refusal) {
					t.Fatalf("publish %s: %v, want a refusal mentioning %q", tt.level, err, tt.refusal)
				}
				if cats, err := f.st.Catalogs(f.ctx, f.src.ID); err != nil || len(cats) != 0 {
					t.Errorf("after a refusal: catalogs %v, %v", cats, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("publish %s: %v", tt.level, err)
			}
			if c.Level != tt.level {
				t.Errorf("published %s, want %s", c.Level, tt.level)
			}
			again, err := f.publish(run, tt.level, basis...)
			if err != nil || again.ID != c.ID {
				t.Errorf("replayed publish: catalog %d, %v; want %d", again.ID, err, c.ID)
			}
		})
	}
}

// An UNPROVEN catalog carries measuredAt (round B's end), nextCheckAt (measuredAt + recheck)
// and a staleness bound (scan window + recheck), and B's entries (R7), which round A stored:
// a set already stored for the source is not written again.
func TestPublishedCatalogFields(t *testing.T) {
	f := newCatFixture(t, false)
	run, a, b := f.pair(spec{set: "S", uris: []string{"demo://a", "demo://b"}}, spec{set: "S", uris: []string{"demo://a", "demo://b"}})
	c, err := f.publish(run, ledger.ProofSnapshotUnproven, a.ID, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	type fields struct {
		Basis          []int64
		Entries        int64
		ScansStartedAt time.Time
		MeasuredAt     time.Time
		NextCheckAt    time.Time
		StalenessBound time.Duration
		Session        int64
	}
	want := fields{[]int64{a.ID, b.ID}, a.ID, a.StartedAt, *b.EndedAt, b.EndedAt.Add(time.Minute), b.EndedAt.Sub(a.StartedAt) + time.Minute, f.gen}
	got := fields{c.BasisScanIDs, *c.EntriesScanID, *c.ScansStartedAt, c.MeasuredAt, c.NextCheckAt, c.StalenessBound, c.SessionGeneration}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("catalog (-want +got):\n%s", diff)
	}
	entries, err := f.st.CatalogEntries(f.ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	want2 := []ledger.ScanEntry{
		{Kind: ledger.EntryResource, URI: "demo://a", ServerURI: "demo://a", Name: "n"},
		{Kind: ledger.EntryResource, URI: "demo://b", ServerURI: "demo://b", Name: "n"},
	}
	if diff := cmp.Diff(want2, entries); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	changed := f.round(f.newRun(), 1, spec{set: "T", uris: []string{"demo://a"}})
	again := f.round(f.newRun(), 1, spec{set: "S", uris: []string{"demo://a", "demo://b"}})
	stored := []int64{*a.EntriesScanID, *b.EntriesScanID, *changed.EntriesScanID, *again.EntriesScanID}
	if diff := cmp.Diff([]int64{a.ID, a.ID, changed.ID, a.ID}, stored); diff != "" {
		t.Errorf("rounds storing each set (-want +got):\n%s", diff)
	}
	if n := f.countRows(`SELECT count(*) FROM catalog_entries`); n != 3 {
		t.Errorf("%d entry rows for two sets of 2 and 1 entries", n)
	}
}

// ConsumeCatalog hands out the newest catalog only to purposes it may serve and records every
// consumption and refusal (R7, R25).
func TestConsumeCatalog(t *testing.T) {
	tests := []struct {
		name        string
		level       ledger.ProofLevel
		invalidated bool
		overdue     bool // the promised re-check is overdue by more than the staleness bound
		purpose     ledger.CatalogPurpose
		refusal     string
	}{
		{"proven for integrity", ledger.ProofSnapshotProven, false, false, ledger.PurposeIntegrity, ""},
		{"proven for display", ledger.ProofSnapshotProven, false, false, ledger.PurposeDisplay, ""},
		{"unproven for integrity", ledger.ProofSnapshotUnproven, false, false, ledger.PurposeIntegrity, ledger.RefusalNotProven},
		{"unproven for display", ledger.ProofSnapshotUnproven, false, false, ledger.PurposeDisplay, ""},
		{"unreconciled for integrity", ledger.ProofReconciliationRequired, false, false, ledger.PurposeIntegrity, ledger.RefusalReconciliationRequired},
		{"unreconciled for display", ledger.ProofReconciliationRequired, false, false, ledger.PurposeDisplay, ledger.RefusalReconciliationRequired},
		{"invalidated proven for integrity", ledger.ProofSnapshotProven, true, false, ledger.PurposeIntegrity, ledger.RefusalInvalidated},
		{"invalidated proven for display", ledger.ProofSnapshotProven, true, false, ledger.PurposeDisplay, ""},
		{"overdue proven for integrity", ledger.ProofSnapshotProven, false, true, ledger.PurposeIntegrity, ledger.RefusalExpired},
		{"overdue proven for display", ledger.ProofSnapshotProven, false, true, ledger.PurposeDisplay, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, true)
			sp := spec{set: "S", uris: []string{"demo://a"}, snapshot: "X"}
			run, a, b := f.pair(sp, sp)
			basis := []int64{a.ID, b.ID}
			if tt.level == ledger.ProofReconciliationRequired {
				basis = nil
			}
			c, err := f.publish(run, tt.level, basis...)
			if err != nil {
				t.Fatal(err)
			}
			if tt.invalidated {
				if n, err := f.st.InvalidateCatalogs(f.ctx, f.src.ID, "list_changed"); err != nil || n != 1 {
					t.Fatalf("invalidate: %d %v", n, err)
				}
			}
			if tt.overdue {
				// As if no re-check had run for an hour after the promised time.
				if _, err := f.st.Pool().Exec(f.ctx, `UPDATE catalogs SET next_check_at = now() - interval '1 hour' - staleness_bound WHERE id = $1`, c.ID); err != nil {
					t.Fatal(err)
				}
			}
			got, err := f.st.ConsumeCatalog(f.ctx, ledger.CatalogRequest{Source: "cat", Purpose: tt.purpose, Consumer: "test"})
			gate, gerr := f.st.CatalogGateCounts(f.ctx)
			if gerr != nil {
				t.Fatal(gerr)
			}
			if tt.refusal == "" {
				if err != nil {
					t.Fatalf("consume: %v", err)
				}
				if got.Catalog.ID != c.ID || len(got.Entries) != 1 || got.ConsumptionID == 0 {
					t.Errorf("consumed catalog %d with %d entries (consumption %d), want catalog %d with 1", got.Catalog.ID, len(got.Entries), got.ConsumptionID, c.ID)
				}
			} else {
				var r *ledger.CatalogRefusal
				if !errors.As(err, &r) || !errors.Is(err, ledger.ErrCatalogRefused) || r.Reason != tt.refusal || r.Catalog == nil || r.Catalog.ID != c.ID || r.ConsumptionID == 0 {
					t.Fatalf("consume: %v, want refusal %s of catalog %d", err, tt.refusal, c.ID)
				}
				if errors.Is(err, ledger.ErrNotFound) {
					t.Errorf("a refusal of an existing catalog matches ErrNotFound")
				}
			}
			accepted, refused := int64(0), int64(1)
			if tt.refusal == "" {
				accepted, refused = 1, 0
			}
			want := ledger.CatalogGate{}
			if tt.purpose == ledger.PurposeIntegrity {
				want.IntegrityAccepted, want.IntegrityRefused = accepted, refused
			} else {
				want.DisplayAccepted, want.DisplayRefused = accepted, refused
			}
			if diff := cmp.Diff(want, gate); diff != "" {
				t.Errorf("gate counts (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("no catalog yet", func(t *testing.T) {
		f := newCatFixture(t, false)
		_, err := f.st.ConsumeCatalog(f.ctx, ledger.CatalogRequest{Source: "cat", Purpose: ledger.PurposeDisplay, Consumer: "test"})
		var r *ledger.CatalogRefusal
		if !errors.As(err, &r) || r.Reason != ledger.RefusalNoCatalog || !errors.Is(err, ledger.ErrNotFound) || !errors.Is(err, ledger.ErrCatalogRefused) {
			t.Errorf("consume without catalog: %v", err)
		}
	})
	t.Run("unknown source", func(t *testing.T) {
		f := newCatFixture(t, false)
		_, err := f.st.ConsumeCatalog(f.ctx, ledger.CatalogRequest{Source: "nope", Purpose: ledger.PurposeDisplay, Consumer: "test"})
		if !errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrCatalogRefused) {
			t.Errorf("consume of an unknown source: %v", err)
		}
	})
	t.Run("the newest catalog supersedes", func(t *testing.T) {
		f := newCatFixture(t, true)
		sp := spec{set: "S", snapshot: "X"}
		run, a, b := f.pair(sp, sp)
		if _, err := f.publish(run, ledger.ProofSnapshotProven, a.ID, b.ID); err != nil {
			t.Fatal(err)
		}
		run2, _, _ := f.pair(spec{failed: "PAGE_CAP"}, spec{failed: "PAGE_CAP"})
		if _, err := f.publish(run2, ledger.ProofReconciliationRequired); err != nil {
			t.Fatal(err)
		}
		_, err := f.st.ConsumeCatalog(f.ctx, ledger.CatalogRequest{Source: "cat", Purpose: ledger.PurposeIntegrity, Consumer: "test"})
		var r *ledger.CatalogRefusal
		if !errors.As(err, &r) || r.Reason != ledger.RefusalReconciliationRequired {
			t.Errorf("integrity after a RECONCILIATION_REQUIRED catalog superseded a proven one: %v", err)
		}
	})
}

// The release-gate rule of R25 holds in the schema itself: no code can record an integrity
// task accepting an unproven catalog, or anybody accepting one that needs reconciliation.
func TestConsumptionConstraintHoldsTheGate(t *testing.T) {
	f := newCatFixture(t, false)
	run, a, b := f.pair(spec{set: "S"}, spec{set: "S"})
	c, err := f.publish(run, ledger.ProofSnapshotUnproven, a.ID, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		purpose string
		level   string
	}{
		{"unproven accepted for integrity", "integrity", "SNAPSHOT_UNPROVEN"},
		{"unreconciled accepted for display", "display", "RECONCILIATION_REQUIRED"},
		{"unreconciled accepted for integrity", "integrity", "RECONCILIATION_REQUIRED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.st.Pool().Exec(f.ctx, `INSERT INTO catalog_consumptions (source_id, catalog_id, consumer, purpose, proof_level, outcome)
				VALUES ($1, $2, 'rogue', $3, $4, 'ACCEPTED')`, f.src.ID, c.ID, tt.purpose, tt.level)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
				t.Errorf("insert: %v, want a check violation", err)
			}
		})
	}
	gate, err := f.st.CatalogGateCounts(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if gate.UnprovenConsumedByIntegrity != 0 || gate.UnreconciledAccepted != 0 {
		t.Errorf("gate: %+v", gate)
	}
}

// pendingTombstone makes an ACTIVE subscription to catURI on the fixture's source and passes
// a not-found read of it through the ordinal fence, leaving it TOMBSTONE_PENDING.
func (f *catFixture) pendingTombstone() ledger.Subscription {
	f.t.Helper()
	sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "p", SourceID: f.src.ID, URI: catURI, ServerURI: catURI, WorkflowID: "wf-cat"})
	if err != nil {
		f.t.Fatal(err)
	}
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){f.st.BeginSubscribe, f.st.Activate} {
		if r, err := step(f.ctx, sub.ID, sub.Generation, f.gen); err != nil || !r.Outcome.OK() {
			f.t.Fatalf("activate: %+v %v", r, err)
		}
	}
	d, err := f.st.AllocateReadOrdinal(f.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: f.gen, URI: catURI, RequestID: "read-1", Reason: mcpsync.ReasonNotification})
	if err != nil || d.Outcome != mcpsync.OutcomeAllocated {
		f.t.Fatalf("allocate: %+v %v", d, err)
	}
	out, err := f.st.RecordNotFound(f.ctx, ledger.NotFoundRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: f.gen, URI: catURI, Ordinal: d.Ordinal, RequestID: "read-1"})
	if err != nil || out != mcpsync.OutcomeTombstonePending {
		f.t.Fatalf("not found: %s %v", out, err)
	}
	sub, err = f.st.SubscriptionByID(f.ctx, sub.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	return sub
}

// catalog publishes a catalog of level from two fresh rounds listing uris.
func (f *catFixture) catalog(level ledger.ProofLevel, uris ...string) ledger.Catalog {
	f.t.Helper()
	if uris == nil {
		uris = []string{"demo://other"}
	}
	sp := spec{set: strings.Join(uris, ","), uris: uris, snapshot: "X"}
	run, a, b := f.pair(sp, sp)
	basis := []int64{a.ID, b.ID}
	if level == ledger.ProofReconciliationRequired {
		basis = nil
	}
	c, err := f.publish(run, level, basis...)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

func (f *catFixture) countRows(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.st.Pool().QueryRow(f.ctx, query, args...).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// ConfirmTombstone moves TOMBSTONE_PENDING to UNSUBSCRIBING behind the close fence and writes
// the tombstone and its invalidation only with a catalog that proves the absence: same source
// and session, PROVEN or UNPROVEN, not invalidated, scanned after the not-found read was
// dispatched, without the URI (R21). Every other request is refused and changes nothing.
func TestConfirmTombstone(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(f *catFixture) (sub ledger.Subscription, req ledger.ConfirmTombstoneRequest)
		refusal mcpsync.TombstoneRefusal // "": confirmed
	}{
		{
			name: "unproven catalog without the URI",
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				c := f.catalog(ledger.ProofSnapshotUnproven)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "proven catalog without the URI",
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				c := f.catalog(ledger.ProofSnapshotProven)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "the catalog lists the URI", refusal: mcpsync.TombstoneResourcePresent,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				c := f.catalog(ledger.ProofSnapshotProven, catURI)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "the catalog lists the URI in another spelling", refusal: mcpsync.TombstoneResourcePresent,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				sp := spec{set: "U", uris: []string{catURI}, upper: true}
				run, a, b := f.pair(sp, sp)
				c, err := f.publish(run, ledger.ProofSnapshotUnproven, a.ID, b.ID)
				if err != nil {
					f.t.Fatal(err)
				}
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "the catalog was scanned before the read", refusal: mcpsync.TombstoneScanTooEarly,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				c := f.catalog(ledger.ProofSnapshotProven)
				sub := f.pendingTombstone()
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "the catalog needs reconciliation", refusal: mcpsync.TombstoneNotReconciled,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				c := f.catalog(ledger.ProofReconciliationRequired)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "the catalog was invalidated", refusal: mcpsync.TombstoneInvalidated,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				c := f.catalog(ledger.ProofSnapshotUnproven)
				if _, err := f.st.InvalidateCatalogs(f.ctx, f.src.ID, "list_changed"); err != nil {
					f.t.Fatal(err)
				}
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "a catalog of another source", refusal: mcpsync.TombstoneOtherSource,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				other := f.addSource("other")
				f.openSession(other.ID, false)
				run, a, b := f.pair(spec{source: other.ID, set: "S"}, spec{source: other.ID, set: "S"})
				c, err := f.st.PublishCatalog(f.ctx, ledger.PublishRequest{Key: run, ScanWorkflowID: run, SourceID: other.ID,
					Level: ledger.ProofSnapshotUnproven, RoundsUsed: 2, BasisScanIDs: []int64{a.ID, b.ID}, Recheck: time.Minute})
				if err != nil {
					f.t.Fatal(err)
				}
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "no such catalog", refusal: mcpsync.TombstoneNoCatalog,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: 999999}
			},
		},
		{
			name: "another subscription generation", refusal: mcpsync.TombstoneOldGeneration,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				c := f.catalog(ledger.ProofSnapshotUnproven)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation + 1, CatalogID: c.ID}
			},
		},
		{
			name: "the session changed since the not-found read", refusal: mcpsync.TombstoneNotPending,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				f.openSession(f.src.ID, true) // fences the subscription: RECONCILIATION_REQUIRED
				c := f.catalog(ledger.ProofSnapshotProven)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
		{
			name: "closed by an unsubscribe first", refusal: mcpsync.TombstoneNotPending,
			setup: func(f *catFixture) (ledger.Subscription, ledger.ConfirmTombstoneRequest) {
				sub := f.pendingTombstone()
				if _, err := f.st.BeginUnsubscribe(f.ctx, sub.ID, sub.Generation, "unsubscribed"); err != nil {
					f.t.Fatal(err)
				}
				c := f.catalog(ledger.ProofSnapshotUnproven)
				return sub, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, true)
			sub, req := tt.setup(f)
			before, err := f.st.SubscriptionByID(f.ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			res, err := f.st.ConfirmTombstone(f.ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			after, err := f.st.SubscriptionByID(f.ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			tombstones := f.countRows(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1 AND kind = 'tombstone'`, sub.ID)
			outbox := f.countRows(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1 AND kind = 'tombstone'`, sub.ID)
			if tt.refusal != "" {
				if res.Outcome != mcpsync.OutcomeRefused || res.Refusal != tt.refusal {
					t.Errorf("result %+v, want refusal %s", res, tt.refusal)
				}
				if diff := cmp.Diff(before, after); diff != "" {
					t.Errorf("a refused confirmation changed the subscription (-before +after):\n%s", diff)
				}
				if tombstones != 0 || outbox != 0 {
					t.Errorf("a refused confirmation wrote %d tombstones, %d invalidations", tombstones, outbox)
				}
				if n := f.countRows(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'TOMBSTONE_REFUSED'`, sub.ID); n != 1 {
					t.Errorf("%d TOMBSTONE_REFUSED receipts, want 1", n)
				}
				return
			}
			type state struct {
				Outcome      mcpsync.Outcome
				State        mcpsync.State
				CloseOrdinal int64
				CloseEpoch   int64
				ReadOrdinal  int64
				Tombstones   int
				Outbox       int
			}
			want := state{mcpsync.OutcomeTransitioned, mcpsync.StateUnsubscribing, before.LastIssuedOrdinal, before.CloseEpoch + 1, before.LastAcceptedOrdinal, 1, 1}
			got := state{res.Outcome, after.State, *after.CloseOrdinal, after.CloseEpoch, res.ReadOrdinal, tombstones, outbox}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("confirmation (-want +got):\n%s", diff)
			}
			v, err := f.st.LatestVersion(f.ctx, sub.ID)
			if err != nil || v.Kind != "tombstone" || v.ID != res.VersionID || v.ReadOrdinal != before.LastAcceptedOrdinal || v.RequestID != "read-1" {
				t.Errorf("latest version %+v (%v), want the tombstone %d at the not-found read's ordinal", v, err, res.VersionID)
			}
			again, err := f.st.ConfirmTombstone(f.ctx, req)
			if err != nil || again.Outcome != mcpsync.OutcomeAlreadyDone || again.VersionID != res.VersionID {
				t.Errorf("replay: %+v %v, want ALREADY_DONE with version %d", again, err, res.VersionID)
			}
			if n := f.countRows(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1`, sub.ID); n != 1 {
				t.Errorf("after the replay: %d versions, want 1", n)
			}
			if n := f.countRows(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'CLOSE_FENCE' AND read_ordinal = $2`, sub.ID, before.LastIssuedOrdinal); n != 1 {
				t.Errorf("%d CLOSE_FENCE receipts at ordinal %d, want 1", n, before.LastIssuedOrdinal)
			}
			if rep, err := invariants.Check(f.ctx, f.st.Pool()); err != nil || rep.Violations() != 0 {
				t.Errorf("R24 invariants: %v %v", rep, err)
			}
			// Behind the close fence, no read can be allocated any more (R18).
			d, err := f.st.AllocateReadOrdinal(f.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
				SessionGeneration: f.gen, URI: catURI, RequestID: "read-2", Reason: mcpsync.ReasonNotification})
			if err != nil || d.Outcome == mcpsync.OutcomeAllocated {
				t.Errorf("allocation after the tombstone: %+v %v", d, err)
			}
		})
	}
}

// Entries are stored in batches of one kind and read back one per entry, in order.
func TestCatalogEntriesRoundTrip(t *testing.T) {
	f := newCatFixture(t, false)
	// The first batch holds one URI that normalization changed; the others store none.
	want := []ledger.ScanEntry{{Kind: ledger.EntryResource, URI: "demo://r/upper", ServerURI: "DEMO://r/upper", Name: "u"}}
	for i := range 2500 {
		u := fmt.Sprintf("demo://r/%05d", i)
		want = append(want, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u, Name: fmt.Sprint(i), MIMEType: "text/plain"})
	}
	for _, tmpl := range []string{"demo://t/{a}", "demo://t/{b}"} {
		want = append(want, ledger.ScanEntry{Kind: ledger.EntryTemplate, URI: tmpl, ServerURI: tmpl, Name: "t"})
	}
	c, got := f.publishSet(want, "sha256:big")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("entries (-stored +read):\n%s", diff)
	}
	if n := f.countRows(`SELECT count(DISTINCT scan_id) FROM catalog_entry_batches b JOIN catalogs c ON c.entries_scan_id = b.scan_id WHERE c.id = $1`, c.ID); n != 1 {
		t.Errorf("the catalog's chunks are named by %d rounds, want 1 (the second round, same set, stores none)", n)
	}
	if n := f.countRows(`SELECT count(DISTINCT scan_id) FROM catalog_entry_batches`); n != 1 {
		t.Errorf("%d rounds name chunks, want 1 (the second round, same set, stores none)", n)
	}
	// Chunks of one kind each, none above the most entries a chunk holds, cut from the set in
	// order (CatalogEntries above), every chunk stored once.
	if n := f.countRows(`SELECT count(*) FROM catalog_entry_arrays WHERE cardinality(server_uris) > $1`, ledger.ChunkMax); n != 0 {
		t.Errorf("%d chunks hold more than %d entries", n, ledger.ChunkMax)
	}
	if n := f.countRows(`SELECT count(*) FROM catalog_entry_arrays WHERE kind = 'template'`); n != 1 {
		t.Errorf("%d chunks of templates, want 1", n)
	}
	if n, m := f.countRows(`SELECT count(*) FROM catalog_entry_chunks`), f.countRows(`SELECT count(*) FROM catalog_entry_batches`); n != m || n < 3 {
		t.Errorf("%d chunks stored, %d named: want the same, at least 3 (2,501 resources in chunks of at most %d, and the templates)", n, m, ledger.ChunkMax)
	}
	if n := f.countRows(`SELECT count(*) FROM catalog_entry_arrays WHERE uris IS NOT NULL`); n != 1 {
		t.Errorf("%d chunks store normalized URIs, want only the first", n)
	}
}

// A set in which one chunk's content comes back (a server listing one resource thousands of
// times) stores that chunk once and reads back every entry.
func TestCatalogEntriesRepeatedChunk(t *testing.T) {
	f := newCatFixture(t, false)
	e := ledger.ScanEntry{Kind: ledger.EntryResource, URI: "demo://again", ServerURI: "demo://again", Name: "n"}
	set := slices.Repeat([]ledger.ScanEntry{e}, 3*ledger.ChunkMax)
	c, got := f.publishSet(set, "sha256:again")
	if diff := cmp.Diff(set, got); diff != "" {
		t.Errorf("entries (-stored +read):\n%s", diff)
	}
	if n := f.countRows(`SELECT count(*) FROM catalog_entry_batches b JOIN catalogs c ON c.entries_scan_id = b.scan_id WHERE c.id = $1`, c.ID); n < 3 {
		t.Errorf("the set is listed in %d chunks, want at least 3 (at most %d entries each)", n, ledger.ChunkMax)
	}
	if n := f.countRows(`SELECT count(*) FROM catalog_entry_chunks`); n != 1 {
		t.Errorf("%d chunks stored, want 1 (every chunk of the set holds the same entries)", n)
	}
}

// Issue 16 item 5: a set that differs from the source's last one in a few entries shares every
// other chunk with it, so storing it writes at most two chunks; each round reads back exactly
// its own set.
func TestCatalogEntriesShareChunks(t *testing.T) {
	base := make([]ledger.ScanEntry, 0, 5000)
	for i := range 5000 {
		u := fmt.Sprintf("demo://items/%05d", i*2)
		base = append(base, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u, Name: "n", MIMEType: "text/plain"})
	}
	entry := func(u, name string) ledger.ScanEntry {
		return ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u, Name: name, MIMEType: "text/plain"}
	}
	edit := func(f func([]ledger.ScanEntry) []ledger.ScanEntry) []ledger.ScanEntry {
		return f(slices.Clone(base))
	}
	tests := []struct {
		name string
		set  []ledger.ScanEntry
	}{
		{"one added in the middle", edit(func(s []ledger.ScanEntry) []ledger.ScanEntry {
			return slices.Insert(s, 2500, entry("demo://items/05001", "n"))
		})},
		{"one removed", edit(func(s []ledger.ScanEntry) []ledger.ScanEntry { return slices.Delete(s, 1234, 1235) })},
		{"one renamed", edit(func(s []ledger.ScanEntry) []ledger.ScanEntry { s[4000].Name = "renamed"; return s })},
		{"one added first", edit(func(s []ledger.ScanEntry) []ledger.ScanEntry {
			return slices.Insert(s, 0, entry("demo://items/0", "n"))
		})},
		{"one added last", edit(func(s []ledger.ScanEntry) []ledger.ScanEntry { return append(s, entry("demo://items/99999", "n")) })},
		{"a template added", edit(func(s []ledger.ScanEntry) []ledger.ScanEntry {
			return append(s, ledger.ScanEntry{Kind: ledger.EntryTemplate, URI: "demo://t/{x}", ServerURI: "demo://t/{x}", Name: "t"})
		})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, false)
			store := func(set []ledger.ScanEntry, digest string) int64 {
				c, got := f.publishSet(set, digest)
				if diff := cmp.Diff(set, got); diff != "" {
					t.Errorf("entries of set %s (-stored +read):\n%s", digest, diff)
				}
				return c.ID
			}
			first := store(base, "sha256:base")
			before := f.countRows(`SELECT count(*) FROM catalog_entry_chunks`)
			store(tt.set, "sha256:edited")
			if added := f.countRows(`SELECT count(*) FROM catalog_entry_chunks`) - before; added < 1 || added > 2 {
				t.Errorf("the edited set added %d chunks to the %d of the first, want 1 or 2", added, before)
			}
			// The first catalog still reads back as it was.
			got, err := f.st.CatalogEntries(f.ctx, first)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(base, got); diff != "" {
				t.Errorf("first set after the second was stored (-stored +read):\n%s", diff)
			}
		})
	}
}
