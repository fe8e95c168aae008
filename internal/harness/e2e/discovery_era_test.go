package e2e_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// addEraSource serves srv (a both-era chaos server) over HTTP from one endpoint (stateful for
// legacy clients, stateless for 2026-07-28 ones) and adds it as source name pinned to
// protocol.
func (s *stack) addEraSource(name, protocol string, srv *chaosmcp.Server) ledger.Source {
	s.t.Helper()
	h, err := srv.StartHTTPBothEras("127.0.0.1:0")
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { h.Close() })
	s.mustCLI("source", "add", name, "--url", h.URL, "--protocol", protocol)
	src, err := s.st.SourceByName(s.ctx, name)
	if err != nil {
		s.t.Fatal(err)
	}
	return src
}

// checkEra fails the test unless the server saw the source's session in the era: a legacy
// session initialized at 2025-11-25, or a 2026-07-28 client that never initialized and holds
// a listen stream acknowledged with resourcesListChanged (the only way list_changed reaches
// it).
func checkEra(t *testing.T, srv *chaosmcp.Server, protocol string) {
	t.Helper()
	type era struct {
		LegacySessions []string
		ListChanged    bool
	}
	got := era{}
	for _, si := range srv.Sessions() {
		got.LegacySessions = append(got.LegacySessions, si.ProtocolVersion)
	}
	got.ListChanged = srv.Stats().LiveListChangedListens > 0
	want := era{LegacySessions: []string{chaosmcp.ProtocolVersion}}
	if protocol == ledger.ProtocolModern {
		want = era{ListChanged: true}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("the server's view of the session (-want +got):\n%s", diff)
	}
}

// TestDiscoveryBothEras (issue 13 items 7 and 8): the A/B rounds and proof levels work the
// same on a 2025-11-25 session and on a 2026-07-28 one. A resource created between two pages
// of round A, behind the cursor, with its list_changed delivered (on a 2026-07-28 session on
// the listen stream with filter resourcesListChanged): round A misses it and never takes part
// in the proof; the catalog is published from two later rounds that agree and list it. A
// later change outside any scan reaches the session as list_changed, invalidates the catalog
// (R3) and a new scan publishes the new set — the proof that the notification reached the
// session host in both eras.
func TestDiscoveryBothEras(t *testing.T) {
	for _, protocol := range []string{ledger.ProtocolLegacy, ledger.ProtocolModern} {
		t.Run(protocol, func(t *testing.T) {
			s := newStack(t)
			srv := chaosmcp.New(chaosmcp.Options{Name: "chaos", Version: "1", PageSize: 2,
				ProtocolVersions: chaosmcp.AllProtocolVersions,
				Capabilities:     &chaosmcp.Capabilities{Subscribe: true, ListChanged: true}})
			t.Cleanup(func() { srv.Close() })
			rs := make([]chaosmcp.Resource, 7)
			for i := range rs {
				rs[i] = chaosmcp.Resource{URI: fmt.Sprintf("demo://r/%04d", (i+1)*10), Text: "x", MIMEType: "text/plain"}
			}
			srv.PutMany(rs...)
			srv.OnBetweenPages(onceAt(chaosmcp.ListResources, 2, 1, func() { srv.Set("demo://r/0005", "new", "text/plain") }))
			src := s.addEraSource("chaos", protocol, srv)

			// The first scan's catalog: its round A missed the new resource. (A list_changed
			// may invalidate it and ask for another scan; it stays the first catalog.)
			s.waitCatalog(src, "first catalog", anyCatalog)
			cats, err := s.st.Catalogs(s.ctx, src.ID)
			if err != nil {
				t.Fatal(err)
			}
			first := cats[0]
			for _, x := range cats {
				if x.ID < first.ID {
					first = x
				}
			}
			checkEra(t, srv, protocol)
			a := s.roundsOf(first)[0]
			basis := s.basisRounds(first)
			type view struct {
				Level       ledger.ProofLevel
				ARound      int
				AComplete   bool
				AResources  int
				ADiffers    bool
				BasisAfterA bool
				LCSent      bool
				LCDropped   int
			}
			st := srv.Stats()
			want := view{ledger.ProofSnapshotUnproven, 1, true, 7, true, true, true, 0}
			got := view{first.Level, a.Round, a.Outcome == ledger.ScanComplete, a.Progress.Resources, a.SetDigest != first.SetDigest,
				len(basis) == 2 && basis[0] > 1, st.ListChangedSent > 0, st.ListChangedDropped}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("first catalog (-want +got):\n%s\nreason: %s\nbasis rounds %v", diff, first.Reason, basis)
			}
			if diff := cmp.Diff(srv.URIs(), s.entryURIs(first)); diff != "" {
				t.Errorf("first catalog entries (-server +catalog):\n%s", diff)
			}
			c := s.waitCatalog(src, "a valid catalog", func(c ledger.Catalog) bool { return c.InvalidatedAt == nil })

			// A change outside any scan: list_changed invalidates the catalog and a new scan
			// lists the change.
			sent := srv.Stats().ListChangedSent
			srv.Set("demo://r/0001", "new", "text/plain")
			next := s.waitCatalog(src, "a catalog with demo://r/0001", func(x ledger.Catalog) bool {
				return x.ID > c.ID && x.InvalidatedAt == nil && slicesContain(s.entryURIs(x), "demo://r/0001")
			})
			if diff := cmp.Diff(srv.URIs(), s.entryURIs(next)); diff != "" {
				t.Errorf("new catalog (-server +catalog):\n%s", diff)
			}
			old, err := s.st.CatalogByID(s.ctx, c.ID)
			if err != nil {
				t.Fatal(err)
			}
			if old.InvalidatedAt == nil || !strings.Contains(old.InvalidatedReason, "list_changed") {
				t.Errorf("catalog %d not invalidated by list_changed: %+v", c.ID, old)
			}
			if got := srv.Stats().ListChangedSent; got <= sent {
				t.Errorf("list_changed sent %d times in all, %d before the change: none for it", got, sent)
			}
			s.checkInvariants()
		})
	}
}

// TestDiscoveryRejectedCursorBothEras (issue 13 item 7): the server rejects the cursor of
// round A's third page once. On a 2025-11-25 session round A fails as CURSOR_ERROR (R8) and
// later rounds prove the set; on a 2026-07-28 session round A discards its pages, starts
// again and completes, and rounds A and B prove the set.
func TestDiscoveryRejectedCursorBothEras(t *testing.T) {
	for _, tt := range []struct {
		protocol  string
		wantA     string
		wantBasis []int
	}{
		{protocol: ledger.ProtocolLegacy, wantA: "CURSOR_ERROR", wantBasis: []int{2, 3}},
		{protocol: ledger.ProtocolModern, wantA: ledger.ScanComplete, wantBasis: []int{1, 2}},
	} {
		t.Run(tt.protocol, func(t *testing.T) {
			s := newStack(t)
			srv := chaosmcp.New(chaosmcp.Options{Name: "chaos", Version: "1", PageSize: 2,
				ProtocolVersions: chaosmcp.AllProtocolVersions,
				Capabilities:     &chaosmcp.Capabilities{Subscribe: true, ListChanged: true}})
			t.Cleanup(func() { srv.Close() })
			rs := make([]chaosmcp.Resource, 7)
			for i := range rs {
				rs[i] = chaosmcp.Resource{URI: fmt.Sprintf("demo://r/%04d", (i+1)*10), Text: "x", MIMEType: "text/plain"}
			}
			srv.PutMany(rs...)
			srv.ExpireCursorAtPageTimes(2, 1)
			src := s.addEraSource("chaos", tt.protocol, srv)
			c := s.waitCatalog(src, "first catalog", anyCatalog)
			checkEra(t, srv, tt.protocol)
			a := s.roundsOf(c)[0]
			aOutcome := a.Outcome
			if a.FailureKind != "" {
				aOutcome = a.FailureKind
			}
			type view struct {
				Level        ledger.ProofLevel
				A            string
				Basis        []int
				CursorErrors int
			}
			want := view{ledger.ProofSnapshotUnproven, tt.wantA, tt.wantBasis, 1}
			got := view{c.Level, aOutcome, s.basisRounds(c), srv.Stats().CursorErrors}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("catalog (-want +got):\n%s\nreason: %s\nround A failure: %s", diff, c.Reason, a.Failure)
			}
			if diff := cmp.Diff(srv.URIs(), s.entryURIs(c)); diff != "" {
				t.Errorf("catalog entries (-server +catalog):\n%s", diff)
			}
			s.checkInvariants()
		})
	}
}

func slicesContain(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
