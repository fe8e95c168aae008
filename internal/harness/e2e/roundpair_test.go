package e2e_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// roundPairChange is the change ID of the round-pair patch (workflows/discoveryscan.go,
// versionRoundPair).
const roundPairChange = "round-pair"

// Issue 16 item 5: a discovery scan runs rounds A and B in ONE session-bound activity
// (DiscoveryRoundPair), round B beginning as soon as A's end is committed, and publishes from
// them as before (SNAPSHOT_UNPROVEN from rounds 1 and 2, B after A). Counted in the real
// history. With -record-histories the scan's history is written to
// workflows/testdata/histories as round-pair-v1-NN.
func TestHistoriesRoundPair(t *testing.T) {
	s := newStack(t)
	srv := chaosServer(t, 2, 3, chaosmcp.DefaultCapabilities)
	src := s.addChaos("chaos", srv)
	c := s.waitCatalog(src, "first catalog", anyCatalog)
	s.waitSourceIdle("chaos")
	type view struct {
		Level      ledger.ProofLevel
		Basis      []int
		BAfterA    bool
		Markers    []string
		Activities map[string]int
	}
	rounds := s.roundsOf(c)
	hist := s.history(c.ScanWorkflowID)
	acts := map[string]int{}
	for _, ev := range hist.GetEvents() {
		if a := ev.GetActivityTaskScheduledEventAttributes(); a != nil {
			acts[a.GetActivityType().GetName()]++
		}
	}
	got := view{c.Level, s.basisRounds(c), len(rounds) == 2 && rounds[1].StartedAt.After(*rounds[0].EndedAt),
		versionMarkers(t, hist, roundPairChange), acts}
	want := view{ledger.ProofSnapshotUnproven, []int{1, 2}, true, []string{roundPairChange + "=1"}, map[string]int{contract.ActDiscoveryRoundPair: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("scan (-want +got):\n%s", diff)
	}
	if n := s.replayHistories(map[string]string{contract.DiscoveryScanWorkflowName: "round-pair-v1"})[contract.DiscoveryScanWorkflowName]; n != 1 {
		t.Errorf("%d discovery scan executions, want 1", n)
	}
}
