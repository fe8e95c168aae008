package gate_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
)

// The storm row names the reads it counted by reason and outcome, only those the storm added.
func TestReasonsText(t *testing.T) {
	for _, tc := range []struct {
		name          string
		after, before map[string]int64
		want          string
	}{
		{"nothing", map[string]int64{}, map[string]int64{}, "none"},
		{"unchanged", map[string]int64{"initial/ACCEPTED": 50}, map[string]int64{"initial/ACCEPTED": 50}, "none"},
		{"added, in order", map[string]int64{"initial/ACCEPTED": 50, "notification/REVALIDATED": 7, "notification/ACCEPTED": 500},
			map[string]int64{"initial/ACCEPTED": 50}, "notification/ACCEPTED 500, notification/REVALIDATED 7"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gate.ReasonsText(tc.after, tc.before); got != tc.want {
				t.Errorf("ReasonsText = %q, want %q", got, tc.want)
			}
		})
	}
}

// The shuffles run before every section that leaves sources and subscriptions behind, so
// they measure the ledger on an idle deployment.
func TestShufflesRunFirst(t *testing.T) {
	got := gate.Sections()
	want := []string{"shuffles", "discovery", "gateway", "revocation", "storm", "converge"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("section order (-want +got):\n%s", diff)
	}
}
