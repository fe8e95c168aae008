package proof_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows/proof"
)

type mod func(*contract.RoundResult)

// round is a complete round n on session 1 that listed set "S" in 3 + 1 pages.
func round(n int, mods ...mod) contract.RoundResult {
	r := contract.RoundResult{Round: n, SessionGeneration: 1, Complete: true, ResourcePages: 3,
		TemplatePages: 1, Resources: 5, SetDigest: "sha256:S"}
	for _, m := range mods {
		m(&r)
	}
	return r
}

func set(d string) mod        { return func(r *contract.RoundResult) { r.SetDigest = "sha256:" + d } }
func gen(g int64) mod         { return func(r *contract.RoundResult) { r.SessionGeneration = g } }
func listChanged(n int64) mod { return func(r *contract.RoundResult) { r.ListChangedObserved = n } }
func duplicates(n int) mod    { return func(r *contract.RoundResult) { r.Duplicates = n } }
func failed(kind string) mod {
	return func(r *contract.RoundResult) { r.Complete, r.FailureKind, r.SetDigest = false, kind, "" }
}

// snapshot: every page carried id; negotiated says whether the session negotiated it.
func snapshot(id string, negotiated bool) mod {
	return func(r *contract.RoundResult) {
		r.SnapshotNegotiated, r.SnapshotIDs, r.SnapshotPages, r.SnapshotID = negotiated, []string{id}, r.Pages(), id
	}
}

// varying: every page carried an ID, but not the same one.
func varying() mod {
	return func(r *contract.RoundResult) {
		r.SnapshotNegotiated, r.SnapshotIDs, r.SnapshotPages, r.SnapshotID = true, []string{"p1", "p2"}, r.Pages(), ""
	}
}

// partial: a negotiated ID on some pages only.
func partial(id string) mod {
	return func(r *contract.RoundResult) {
		r.SnapshotNegotiated, r.SnapshotIDs, r.SnapshotPages, r.SnapshotID = true, []string{id}, r.Pages()-1, ""
	}
}

func TestDecide(t *testing.T) {
	tests := []struct {
		name    string
		rounds  []contract.RoundResult
		policy  proof.Policy
		publish bool
		level   string
		basis   []int
		retry   bool
		reason  string // a substring of the reason
	}{
		{name: "no round yet", reason: "round A"},
		{name: "round A alone never publishes (R24)", rounds: []contract.RoundResult{round(1)}, reason: "round B next"},
		{name: "a proven round A alone never publishes (R24)", rounds: []contract.RoundResult{round(1, snapshot("X", true))}, reason: "round B next"},
		{name: "failed round A", rounds: []contract.RoundResult{round(1, failed(contract.RoundCursorCycle))}, retry: true, reason: contract.RoundCursorCycle},
		{
			name: "A and B agree without extension", rounds: []contract.RoundResult{round(1), round(2)},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{0, 1}, reason: "no snapshot extension negotiated",
		},
		{
			name: "negotiated ID on every page of both rounds", rounds: []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("X", true))},
			publish: true, level: contract.ProofSnapshotProven, basis: []int{0, 1}, reason: "snapshot ID X",
		},
		{
			name: "IDs sent but not negotiated are ignored", rounds: []contract.RoundResult{round(1, snapshot("X", false)), round(2, snapshot("X", false))},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{0, 1}, reason: "not negotiated",
		},
		{
			name: "IDs varying between pages disprove", rounds: []contract.RoundResult{round(1, varying()), round(2, varying())},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{0, 1}, reason: "varying between pages",
		},
		{
			name: "an ID missing on a page disproves", rounds: []contract.RoundResult{round(1, partial("X")), round(2, snapshot("X", true))},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{0, 1}, reason: "missing or varying",
		},
		{
			name: "IDs differing between rounds disprove", rounds: []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("Y", true))},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{0, 1}, reason: "differ between rounds",
		},
		{
			name: "a forged ID (same ID, other set) disproves the later pair",
			rounds: []contract.RoundResult{
				round(1, snapshot("X", true), set("S1")), round(2, snapshot("X", true), set("S2")), round(3, snapshot("X", true), set("S2")),
			},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{1, 2}, reason: "forged",
		},
		{
			name: "a forged ID is detected only within one session",
			rounds: []contract.RoundResult{
				round(1, snapshot("X", true), set("S1")), round(2, gen(2), snapshot("X", true), set("S2")), round(3, gen(2), snapshot("X", true), set("S2")),
			},
			publish: true, level: contract.ProofSnapshotProven, basis: []int{1, 2}, reason: "snapshot ID X",
		},
		{
			name: "mutation between pages: A and B differ, retried", rounds: []contract.RoundResult{round(1, set("S1")), round(2, set("S2"))},
			retry: true, reason: "different sets",
		},
		{
			name: "mutation between pages: B and C agree", rounds: []contract.RoundResult{round(1, set("S1")), round(2, set("S2")), round(3, set("S2"))},
			publish: true, level: contract.ProofSnapshotUnproven, basis: []int{1, 2},
		},
		{
			name: "list_changed during A", rounds: []contract.RoundResult{round(1, listChanged(1)), round(2)},
			retry: true, reason: "list_changed observed",
		},
		{
			name: "list_changed during B even with a proof", rounds: []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("X", true), listChanged(2))},
			retry: true, reason: "list_changed observed",
		},
		{
			name: "rounds on different sessions", rounds: []contract.RoundResult{round(1), round(2, gen(2))},
			retry: true, reason: "session generations 1 and 2",
		},
		{
			name: "an entry listed twice", rounds: []contract.RoundResult{round(1, duplicates(1)), round(2, duplicates(1))},
			retry: true, reason: "listed twice",
		},
		{
			name:   "a failed round between two equal rounds breaks the pair",
			rounds: []contract.RoundResult{round(1), round(2, failed(contract.RoundCursorError)), round(3)},
			retry:  true, reason: "round 2 failed",
		},
		{
			name:    "bound reached with cycles",
			rounds:  []contract.RoundResult{round(1, failed(contract.RoundCursorCycle)), round(2, failed(contract.RoundCursorCycle))},
			policy:  proof.Policy{MaxRounds: 2},
			publish: true, level: contract.ProofReconciliationRequired, reason: contract.RoundCursorCycle,
		},
		{
			name:    "bound reached with a set that never settles",
			rounds:  []contract.RoundResult{round(1, set("1")), round(2, set("2")), round(3, set("3")), round(4, set("4")), round(5, set("5")), round(6, set("6"))},
			publish: true, level: contract.ProofReconciliationRequired, reason: "in 6 rounds",
		},
		{
			name:   "the default bound is not reached at 5",
			rounds: []contract.RoundResult{round(1, set("1")), round(2, set("2")), round(3, set("3")), round(4, set("4")), round(5, set("5"))},
			retry:  true, reason: "different sets",
		},
		{
			name:    "a bound below 2 still allows A and B",
			rounds:  []contract.RoundResult{round(1)},
			policy:  proof.Policy{MaxRounds: 1},
			reason:  "round B next",
			publish: false,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := proof.Decide(tt.rounds, tt.policy)
			type view struct {
				Publish bool
				Level   string
				Basis   []int
				Retry   bool
			}
			want := view{tt.publish, tt.level, tt.basis, tt.retry}
			if diff := cmp.Diff(want, view{d.Publish, d.Level, d.Basis, d.Retry}); diff != "" {
				t.Errorf("decision (-want +got):\n%s\nreason: %s", diff, d.Reason)
			}
			if !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("reason %q does not mention %q", d.Reason, tt.reason)
			}
		})
	}
}

func TestForged(t *testing.T) {
	tests := []struct {
		name   string
		rounds []contract.RoundResult
		want   string
	}{
		{"same ID, same set", []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("X", true))}, ""},
		{"same ID, other set", []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("X", true), set("T"))}, "X"},
		{"other IDs, other sets", []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("Y", true), set("T"))}, ""},
		{"not negotiated IDs prove nothing either way", []contract.RoundResult{round(1, snapshot("X", false)), round(2, snapshot("X", false), set("T"))}, ""},
		{"failed rounds do not count", []contract.RoundResult{round(1, snapshot("X", true)), round(2, snapshot("X", true), failed(contract.RoundPageCap))}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := proof.Forged(tt.rounds)
			if got != tt.want {
				t.Errorf("Forged = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDowngrade(t *testing.T) {
	for from, want := range map[string]string{
		contract.ProofSnapshotProven:         contract.ProofSnapshotUnproven,
		contract.ProofSnapshotUnproven:       contract.ProofReconciliationRequired,
		contract.ProofReconciliationRequired: contract.ProofReconciliationRequired,
	} {
		if got := proof.Downgrade(from); got != want {
			t.Errorf("Downgrade(%s) = %s, want %s", from, got, want)
		}
	}
}
