package e2e_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/workflows"
)

func init() {
	// Rounds that fail or disagree are retried after 100 ms, doubling up to 2 s.
	workflows.DiscoveryRetryDelay = 100 * time.Millisecond
	workflows.DiscoveryRetryMax = 2 * time.Second
}

// chaosServer is a fault-injecting server with n resources demo://r/NNNN (page size given)
// and the capabilities given.
func chaosServer(t *testing.T, pageSize, n int, caps chaosmcp.Capabilities) *chaosmcp.Server {
	t.Helper()
	srv := chaosmcp.New(chaosmcp.Options{Name: "chaos", Version: "1", PageSize: pageSize, Capabilities: &caps})
	t.Cleanup(func() { srv.Close() })
	rs := make([]chaosmcp.Resource, n)
	for i := range rs {
		rs[i] = chaosmcp.Resource{URI: fmt.Sprintf("demo://r/%04d", (i+1)*10), Text: "x", MIMEType: "text/plain"}
	}
	srv.PutMany(rs...)
	return srv
}

// addChaos serves srv over HTTP on a free loopback port and adds it as source name: the
// session host connects and the source's SourceWorkflow runs its first scan.
func (s *stack) addChaos(name string, srv *chaosmcp.Server) ledger.Source {
	s.t.Helper()
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { h.Close() })
	s.mustCLI("source", "add", name, "--url", h.URL)
	src, err := s.st.SourceByName(s.ctx, name)
	if err != nil {
		s.t.Fatal(err)
	}
	return src
}

// waitCatalog waits for a catalog of the source that satisfies ok and returns it.
func (s *stack) waitCatalog(src ledger.Source, what string, ok func(ledger.Catalog) bool) ledger.Catalog {
	s.t.Helper()
	var found ledger.Catalog
	eventually(s.t, 60*time.Second, what, func() (bool, string) {
		cats, err := s.st.Catalogs(s.ctx, src.ID)
		if err != nil {
			return false, err.Error()
		}
		for _, c := range cats {
			if ok(c) {
				found = c
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d catalogs", len(cats))
	})
	return found
}

func anyCatalog(ledger.Catalog) bool { return true }

// roundsOf returns the rounds of the scan that published c.
func (s *stack) roundsOf(c ledger.Catalog) []ledger.Scan {
	s.t.Helper()
	rounds, err := s.st.ScansOfWorkflow(s.ctx, c.ScanWorkflowID)
	if err != nil {
		s.t.Fatal(err)
	}
	return rounds
}

func (s *stack) basisRounds(c ledger.Catalog) []int {
	s.t.Helper()
	var out []int
	for _, id := range c.BasisScanIDs {
		sc, err := s.st.ScanByID(s.ctx, id)
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, sc.Round)
	}
	return out
}

func (s *stack) entryURIs(c ledger.Catalog) []string {
	s.t.Helper()
	es, err := s.st.CatalogEntries(s.ctx, c.ID)
	if err != nil {
		s.t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.ServerURI)
	}
	return out
}

// onceAt returns a between-pages hook that runs fn the nth time page `page` of list kind is
// requested (n from 1), counting over every scan of the server.
func onceAt(kind chaosmcp.ListKind, page, nth int, fn func()) func(chaosmcp.ListKind, int) {
	var seen atomic.Int32
	return func(k chaosmcp.ListKind, p int) {
		if k == kind && p == page && int(seen.Add(1)) == nth {
			fn()
		}
	}
}

// A resource created between two pages of round A, behind the cursor, with its list_changed
// lost: round A misses it and is never part of the proof; A and B differ, so the scan runs
// round C and publishes from B and C, which list it (R6, R23 "multi-page change with the
// notification lost"). With a negotiated honest snapshot extension, round A's pages carry two
// IDs, which disproves A; B and C prove the new set.
func TestDiscoveryMutationBetweenPagesWithListChangedLost(t *testing.T) {
	tests := []struct {
		name      string
		caps      chaosmcp.Capabilities
		mode      chaosmcp.SnapshotMode
		wantLevel ledger.ProofLevel
		roundAIDs int
	}{
		{"no snapshot extension", chaosmcp.Capabilities{Subscribe: true, ListChanged: true}, chaosmcp.SnapshotOff, ledger.ProofSnapshotUnproven, 0},
		{"honest snapshot extension", chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: true}, chaosmcp.SnapshotHonest, ledger.ProofSnapshotProven, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStack(t)
			srv := chaosServer(t, 2, 7, tt.caps)
			srv.SetSnapshotMode(tt.mode)
			srv.SuppressListChanged(true)
			srv.OnBetweenPages(onceAt(chaosmcp.ListResources, 2, 1, func() { srv.Set("demo://r/0005", "new", "text/plain") }))
			src := s.addChaos("chaos", srv)
			c := s.waitCatalog(src, "first catalog", anyCatalog)
			rounds := s.roundsOf(c)
			if len(rounds) < 3 {
				t.Fatalf("%d rounds, want at least 3", len(rounds))
			}
			a := rounds[0]
			type view struct {
				Level      ledger.ProofLevel
				RoundsUsed int
				Basis      []int
				AComplete  bool
				AItems     int
				ADiffers   bool
				AIDs       int
			}
			want := view{tt.wantLevel, 3, []int{2, 3}, true, 7, true, tt.roundAIDs}
			got := view{c.Level, c.RoundsUsed, s.basisRounds(c), a.Outcome == ledger.ScanComplete, a.Progress.Resources, a.SetDigest != c.SetDigest, len(a.SnapshotIDs)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("catalog (-want +got):\n%s\nreason: %s", diff, c.Reason)
			}
			if diff := cmp.Diff(srv.URIs(), s.entryURIs(c)); diff != "" {
				t.Errorf("catalog entries (-server +catalog):\n%s", diff)
			}
			if st := srv.Stats(); st.ListChangedDropped == 0 || st.ListChangedSent != 0 {
				t.Errorf("list_changed sent %d, dropped %d: the notification was not lost", st.ListChangedSent, st.ListChangedDropped)
			}
		})
	}
}

// A circular cursor fails every round (R8): after the round bound the catalog needs
// reconciliation and nobody may have it, not even for display (R25).
func TestDiscoveryCircularCursor(t *testing.T) {
	s := newStack(t)
	srv := chaosServer(t, 1, 6, chaosmcp.DefaultCapabilities)
	srv.SetCircularCursor(3, 1)
	src := s.addChaos("chaos", srv)
	c := s.waitCatalog(src, "first catalog", anyCatalog)
	if c.Level != ledger.ProofReconciliationRequired || !strings.Contains(c.Reason, contract.RoundCursorCycle) {
		t.Fatalf("catalog %s: %s", c.Level, c.Reason)
	}
	for _, r := range s.roundsOf(c) {
		if r.Outcome != ledger.ScanFailed || r.FailureKind != contract.RoundCursorCycle || r.Progress.ResourcePages != 4 {
			t.Errorf("round %d: %s %s after %d pages, want FAILED CURSOR_CYCLE after 4", r.Round, r.Outcome, r.FailureKind, r.Progress.ResourcePages)
		}
	}
	for _, purpose := range []string{"display", "integrity"} {
		_, errOut, code := s.cli("catalog", "chaos", "--purpose", purpose)
		if code != cli.ExitRefused || !strings.Contains(errOut, "RECONCILIATION_REQUIRED") {
			t.Errorf("catalog --purpose %s: exit %d (%q), want %d", purpose, code, errOut, cli.ExitRefused)
		}
	}
	gate, err := s.st.CatalogGateCounts(s.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ledger.CatalogGate{IntegrityRefused: 1, DisplayRefused: 1}, gate); diff != "" {
		t.Errorf("gate (-want +got):\n%s", diff)
	}
}

// Snapshot IDs prove a catalog only when negotiated and equal on every page of both rounds
// (R5): honest IDs give SNAPSHOT_PROVEN, which an integrity task may take; IDs sent without
// the negotiated capability, IDs varying per page, and forged IDs (round B repeats round A's
// ID on every page while a template appears between its pages) never do. Integrity is refused from the CLI (exit 4) and the
// Go API (ErrCatalogRefused), and every refusal is counted, none accepted (R7, R25).
func TestDiscoverySnapshotIDs(t *testing.T) {
	snap := chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: true}
	tests := []struct {
		name      string
		caps      chaosmcp.Capabilities
		mode      chaosmcp.SnapshotMode
		mutate    bool // add a template while round B pages its templates
		wantLevel ledger.ProofLevel
		reason    string
	}{
		{name: "honest and negotiated", caps: snap, mode: chaosmcp.SnapshotHonest, wantLevel: ledger.ProofSnapshotProven, reason: "snapshot ID catalog-"},
		{name: "not negotiated", caps: chaosmcp.DefaultCapabilities, mode: chaosmcp.SnapshotHonest, wantLevel: ledger.ProofSnapshotUnproven, reason: "not negotiated"},
		{name: "varying per page", caps: snap, mode: chaosmcp.SnapshotPerPage, wantLevel: ledger.ProofSnapshotUnproven, reason: "varying between pages"},
		{name: "forged", caps: snap, mode: chaosmcp.SnapshotForged, mutate: true, wantLevel: ledger.ProofSnapshotUnproven, reason: "differ"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStack(t)
			srv := chaosServer(t, 2, 5, tt.caps)
			for _, tmpl := range []string{"demo://t/{a}", "demo://t/{b}", "demo://t/{c}"} {
				srv.SetTemplate(chaosmcp.Template{URITemplate: tmpl, Name: "t"})
			}
			srv.SetSnapshotMode(tt.mode)
			srv.SuppressListChanged(true)
			if tt.mutate {
				srv.OnBetweenPages(onceAt(chaosmcp.ListTemplates, 1, 2, func() { srv.SetTemplate(chaosmcp.Template{URITemplate: "demo://t/{z}", Name: "t"}) }))
			}
			src := s.addChaos("chaos", srv)
			c := s.waitCatalog(src, "first catalog", anyCatalog)
			if c.Level != tt.wantLevel || !strings.Contains(c.Reason, tt.reason) {
				t.Errorf("catalog %s (%s), want %s mentioning %q", c.Level, c.Reason, tt.wantLevel, tt.reason)
			}
			for _, r := range s.roundsOf(c) {
				if len(r.SnapshotIDs) == 0 || r.SnapshotNegotiated != tt.caps.Snapshot {
					t.Errorf("round %d recorded snapshot IDs %v, negotiated %t", r.Round, r.SnapshotIDs, r.SnapshotNegotiated)
				}
			}
			if tt.mutate {
				rounds := s.roundsOf(c)
				if a, b := rounds[0], rounds[1]; b.SnapshotID == "" || b.SnapshotID != a.SnapshotID || b.SetDigest == a.SetDigest {
					t.Errorf("round B did not forge round A's ID over another set: A %s/%s, B %s/%s", a.SnapshotID, a.SetDigest, b.SnapshotID, b.SetDigest)
				}
			}

			out, errOut, code := s.cli("catalog", "chaos", "--purpose", "integrity", "--json")
			_, apiErr := s.st.ConsumeCatalog(s.ctx, ledger.CatalogRequest{Source: "chaos", Purpose: ledger.PurposeIntegrity, Consumer: "revocation"})
			var j struct {
				Refused bool
				Refusal string
				Entries []json.RawMessage
			}
			if err := json.Unmarshal([]byte(out), &j); err != nil {
				t.Fatalf("catalog --json: %v\n%s", err, out)
			}
			if tt.wantLevel == ledger.ProofSnapshotProven {
				if code != 0 || j.Refused || len(j.Entries) != 8 || apiErr != nil { // 5 resources, 3 templates
					t.Errorf("integrity: exit %d refused %t entries %d (%s), Go API %v; want the proven catalog", code, j.Refused, len(j.Entries), errOut, apiErr)
				}
			} else {
				var r *ledger.CatalogRefusal
				if code != cli.ExitRefused || !j.Refused || j.Refusal != ledger.RefusalNotProven {
					t.Errorf("integrity from the CLI: exit %d, refused %t (%s), stderr %q; want exit %d", code, j.Refused, j.Refusal, errOut, cli.ExitRefused)
				}
				if !errors.Is(apiErr, ledger.ErrCatalogRefused) || !errors.As(apiErr, &r) || r.Reason != ledger.RefusalNotProven {
					t.Errorf("integrity from the Go API: %v, want a NOT_PROVEN refusal", apiErr)
				}
			}
			gate, err := s.st.CatalogGateCounts(s.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if gate.UnprovenConsumedByIntegrity != 0 || gate.UnreconciledAccepted != 0 || gate.IntegrityAccepted+gate.IntegrityRefused != 2 {
				t.Errorf("gate %+v", gate)
			}
		})
	}
}

// The server restarts while round A pages (28 pages still to go) and its cursors are bound to
// the session that issued them: round A fails, no cursor is ever presented to another session
// (the server saw no cursor error), and the catalog rests on two rounds of the new session
// (R2, R8, R23 "cursor from an old session").
func TestDiscoveryCursorFromOldSession(t *testing.T) {
	s := newStack(t)
	srv := chaosServer(t, 1, 30, chaosmcp.DefaultCapabilities)
	srv.BindCursorsToSession(true)
	srv.OnBetweenPages(onceAt(chaosmcp.ListResources, 2, 1, func() { go srv.Restart() }))
	src := s.addChaos("chaos", srv)
	c := s.waitCatalog(src, "a catalog of a later session", func(c ledger.Catalog) bool {
		return c.Level == ledger.ProofSnapshotUnproven && c.SessionGeneration > 1
	})
	rounds, err := s.st.Pool().Query(s.ctx, `SELECT round, session_generation, outcome, coalesce(failure_kind, ''), coalesce(failure, '') FROM discovery_scans
		WHERE source_id = $1 ORDER BY id`, src.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rounds.Close()
	first := true
	for rounds.Next() {
		var round int
		var gen int64
		var outcome, kind, failure string
		if err := rounds.Scan(&round, &gen, &outcome, &kind, &failure); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d on generation %d: %s %s %s", round, gen, outcome, kind, failure)
		if first && (gen != 1 || outcome != ledger.ScanFailed) {
			t.Errorf("the first round ran on generation %d and ended %s %s; want generation 1 FAILED", gen, outcome, kind)
		}
		if gen == 1 && outcome == ledger.ScanComplete {
			t.Errorf("round %d of the old session completed", round)
		}
		first = false
	}
	if err := rounds.Err(); err != nil {
		t.Fatal(err)
	}
	if st := srv.Stats(); st.CursorErrors != 0 {
		t.Errorf("the server rejected %d cursors: a cursor outlived its session", st.CursorErrors)
	}
	if diff := cmp.Diff(srv.URIs(), s.entryURIs(c)); diff != "" {
		t.Errorf("catalog entries (-server +catalog):\n%s", diff)
	}
}

// A catalog of 10,000 resources: `mcpsync scan --wait` shows each round's pages and items
// and the published catalog, and `mcpsync catalog --json` hands out all 10,000 entries.
func TestDiscoveryCatalogOf10000Resources(t *testing.T) {
	s := newStack(t)
	srv := chaosServer(t, 100, 10000, chaosmcp.DefaultCapabilities)
	src := s.addChaos("chaos", srv)
	s.waitCatalog(src, "first catalog", anyCatalog)
	out := s.mustCLI("scan", "chaos", "--wait")
	for _, want := range []string{
		"SNAPSHOT_UNPROVEN after 2 rounds: 10000 resources",
		"staleness bound",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scan --wait output lacks %q:\n%s", want, out)
		}
	}
	// Both rounds on one session; which generation that is depends on whether the host had to
	// reconnect before the scan (it may under load).
	rounds := regexp.MustCompile(`round ([12]) \(session (\d+)\) complete: 101 pages, 10000 resources, 0 templates`).FindAllStringSubmatch(out, -1)
	if len(rounds) != 2 || rounds[0][1] != "1" || rounds[1][1] != "2" || rounds[0][2] != rounds[1][2] {
		t.Errorf("scan --wait output lacks rounds 1 and 2 on one session, each of 101 pages and 10000 resources:\n%s", out)
	}
	js := s.mustCLI("catalog", "chaos", "--json")
	var j struct {
		Catalog struct {
			ID        int64
			Level     string
			Resources int
		}
		Entries []struct{ ServerURI string }
	}
	if err := json.Unmarshal([]byte(js), &j); err != nil {
		t.Fatal(err)
	}
	var uris []string
	for _, e := range j.Entries {
		uris = append(uris, e.ServerURI)
	}
	if diff := cmp.Diff(srv.URIs(), uris); diff != "" {
		t.Errorf("catalog entries (-server +catalog):\n%s", diff)
	}
	if j.Catalog.Level != string(ledger.ProofSnapshotUnproven) || j.Catalog.Resources != 10000 {
		t.Errorf("catalog %+v", j.Catalog)
	}
	var sj struct {
		ScanWorkflowID string
		Result         contract.DiscoveryScanResult
		Rounds         []struct{ Resources, ResourcePages int }
	}
	if err := json.Unmarshal([]byte(s.mustCLI("scan", "chaos", "--wait", "--json")), &sj); err != nil {
		t.Fatal(err)
	}
	if sj.Result.Resources != 10000 || len(sj.Rounds) != 2 || sj.Rounds[1].ResourcePages != 100 || sj.Result.CatalogID <= j.Catalog.ID {
		t.Errorf("scan --json: %+v", sj)
	}
}

// list_changed from the server reaches the source's workflow through the session host: the
// catalogs are invalidated (no integrity task may take them any more, R3) and a new scan
// publishes a catalog with the new resource.
func TestDiscoveryListChangedRescans(t *testing.T) {
	s := newStack(t)
	srv := chaosServer(t, 2, 3, chaosmcp.Capabilities{Subscribe: true, ListChanged: true, Snapshot: true})
	srv.SetSnapshotMode(chaosmcp.SnapshotHonest)
	src := s.addChaos("chaos", srv)
	first := s.waitCatalog(src, "first catalog", anyCatalog)
	if first.Level != ledger.ProofSnapshotProven {
		t.Fatalf("first catalog %s: %s", first.Level, first.Reason)
	}
	s.mustCLI("catalog", "chaos", "--purpose", "integrity")
	srv.Set("demo://r/0001", "new", "text/plain")
	next := s.waitCatalog(src, "a catalog with the new resource", func(c ledger.Catalog) bool { return c.ID > first.ID })
	old, err := s.st.CatalogByID(s.ctx, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if old.InvalidatedAt == nil || !strings.Contains(old.InvalidatedReason, "list_changed") {
		t.Errorf("first catalog not invalidated: %+v", old)
	}
	if diff := cmp.Diff(srv.URIs(), s.entryURIs(next)); diff != "" {
		t.Errorf("new catalog (-server +catalog):\n%s", diff)
	}
}

// `scan --wait` whose --timeout runs out while the scan pages says so on one line (exit 1):
// the scan was requested and goes on, and where its result will be; no context error alone.
func TestScanWaitTimeoutSaysTheScanGoesOn(t *testing.T) {
	s := newStack(t)
	srv := chaosServer(t, 2, 6, chaosmcp.Capabilities{ListChanged: true})
	src := s.addChaos("slow", srv)
	// Registered after the server's cleanups, so it runs before them: closing the HTTP
	// server waits for the held pages.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s.waitCatalog(src, "the first scan's catalog", anyCatalog)
	// From now on every page after the first waits until the test ends.
	srv.OnBetweenPages(func(chaosmcp.ListKind, int) { <-release })
	_, errOut, code := s.cli("scan", "slow", "--wait", "--timeout", "3s")
	const want = "; not done within --timeout 3s: the scan goes on, mcpsync catalog slow shows its result\n"
	if code != cli.ExitFailure || !strings.HasPrefix(errOut, "mcpsync scan: scan ") || !strings.HasSuffix(errOut, want) ||
		strings.Count(errOut, "\n") != 1 {
		t.Errorf("scan --wait --timeout 3s on a stalled scan: exit %d, stderr %q; want exit 1 and one line ending %q", code, errOut, want)
	}
}
