// Package proof decides, from the rounds a discovery scan has run so far, whether it can
// publish a catalog and at which proof level (SPEC R5-R8, R24). It is pure: no I/O, no clock,
// no Temporal, so DiscoveryScanWorkflow stays deterministic and the rules are table-tested.
//
// The rules:
//   - A single round never publishes a complete catalog (R24): every published level but
//     RECONCILIATION_REQUIRED rests on two consecutive rounds A and B of one scan.
//   - A and B agree when both completed on the same session generation, listed the same set
//     (equal set digests, no entry listed twice) and observed no list_changed (R6).
//   - Agreeing rounds publish SNAPSHOT_PROVEN when the session negotiated the snapshot-ID
//     extension and every page of both rounds carried one and the same ID (R5), unless some
//     complete round of the scan showed that ID with another set (a forged ID). A
//     non-negotiated ID is ignored; IDs that vary disprove. Otherwise they publish
//     SNAPSHOT_UNPROVEN (R7).
//   - Anything else runs another round, up to MaxRounds; then RECONCILIATION_REQUIRED.
package proof

import (
	"fmt"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// DefaultMaxRounds bounds the rounds of a scan when Policy.MaxRounds is 0.
const DefaultMaxRounds = 6

// Policy bounds a scan.
type Policy struct {
	// MaxRounds is the most rounds a scan runs (at least 2; 0 means DefaultMaxRounds).
	MaxRounds int
}

func (p Policy) maxRounds() int {
	switch {
	case p.MaxRounds == 0:
		return DefaultMaxRounds
	case p.MaxRounds < 2:
		return 2
	}
	return p.MaxRounds
}

// Decision is what a scan does next.
type Decision struct {
	// Publish: the scan is over and publishes Level; otherwise it runs another round.
	Publish bool
	Level   string
	// Basis holds the indexes (into the rounds) of rounds A and B for PROVEN and UNPROVEN.
	Basis []int
	// Reason explains the decision (why not proven, why another round).
	Reason string
	// Retry: the last round failed or disagreed with the one before, so the next round
	// should wait a little; false before round B of a fresh pair.
	Retry bool
}

// Proves reports whether a single round carries a snapshot proof candidate: the session
// negotiated the extension and every page carried one and the same ID (R5).
func Proves(r contract.RoundResult) bool {
	return r.Complete && r.SnapshotNegotiated && r.SnapshotID != "" && r.Pages() > 0 && r.SnapshotPages == r.Pages()
}

// Forged returns a snapshot ID that two complete rounds of the scan, on one session, carried
// on every page while listing different sets: the server's IDs prove nothing.
func Forged(rounds []contract.RoundResult) (string, bool) {
	seen := map[string]string{} // generation/ID -> set digest
	for _, r := range rounds {
		if !Proves(r) {
			continue
		}
		k := fmt.Sprintf("%d/%s", r.SessionGeneration, r.SnapshotID)
		if d, ok := seen[k]; ok && d != r.SetDigest {
			return r.SnapshotID, true
		}
		seen[k] = r.SetDigest
	}
	return "", false
}

// Agree reports whether rounds a and b (a run just before b) are an agreeing pair (R6), and
// if not, why.
func Agree(a, b contract.RoundResult) (bool, string) {
	switch {
	case !a.Complete:
		return false, fmt.Sprintf("round %d failed: %s", a.Round, a.FailureKind)
	case !b.Complete:
		return false, fmt.Sprintf("round %d failed: %s", b.Round, b.FailureKind)
	case b.Round != a.Round+1:
		return false, fmt.Sprintf("rounds %d and %d are not consecutive", a.Round, b.Round)
	case a.SessionGeneration != b.SessionGeneration:
		return false, fmt.Sprintf("rounds %d and %d ran on session generations %d and %d", a.Round, b.Round, a.SessionGeneration, b.SessionGeneration)
	case a.ListChangedObserved > 0 || b.ListChangedObserved > 0:
		return false, fmt.Sprintf("list_changed observed during rounds %d/%d (%d/%d)", a.Round, b.Round, a.ListChangedObserved, b.ListChangedObserved)
	case a.Duplicates > 0 || b.Duplicates > 0:
		return false, fmt.Sprintf("an entry was listed twice in round %d or %d", a.Round, b.Round)
	case a.SetDigest != b.SetDigest:
		return false, fmt.Sprintf("rounds %d and %d listed different sets (%d and %d resources)", a.Round, b.Round, a.Resources, b.Resources)
	}
	return true, ""
}

// whyUnproven says why an agreeing pair is not a snapshot proof.
func whyUnproven(a, b contract.RoundResult, rounds []contract.RoundResult) string {
	switch {
	case !a.SnapshotNegotiated || !b.SnapshotNegotiated:
		if a.SnapshotPages > 0 || b.SnapshotPages > 0 {
			return "snapshot IDs were sent but the extension was not negotiated: ignored"
		}
		return "no snapshot extension negotiated"
	case !Proves(a) || !Proves(b):
		return "snapshot IDs missing or varying between pages"
	case a.SnapshotID != b.SnapshotID:
		return "snapshot IDs differ between rounds"
	}
	if id, ok := Forged(rounds); ok {
		return "snapshot ID " + id + " named two different sets: forged, ignored"
	}
	return ""
}

// Decide returns what the scan does after rounds (in the order they ran).
func Decide(rounds []contract.RoundResult, p Policy) Decision {
	n := len(rounds)
	if n == 0 {
		return Decision{Reason: "round A"}
	}
	reason := ""
	if n >= 2 {
		a, b := rounds[n-2], rounds[n-1]
		ok, why := Agree(a, b)
		if ok {
			basis := []int{n - 2, n - 1}
			w := whyUnproven(a, b, rounds)
			if w == "" {
				return Decision{Publish: true, Level: contract.ProofSnapshotProven, Basis: basis,
					Reason: fmt.Sprintf("rounds %d and %d carried snapshot ID %s on every page and listed the same set", a.Round, b.Round, b.SnapshotID)}
			}
			return Decision{Publish: true, Level: contract.ProofSnapshotUnproven, Basis: basis,
				Reason: fmt.Sprintf("rounds %d and %d agree without list_changed; %s", a.Round, b.Round, w)}
		}
		reason = why
	} else if !rounds[0].Complete {
		reason = fmt.Sprintf("round %d failed: %s", rounds[0].Round, rounds[0].FailureKind)
	}
	if n >= p.maxRounds() {
		if reason == "" {
			reason = "no agreeing rounds"
		}
		return Decision{Publish: true, Level: contract.ProofReconciliationRequired,
			Reason: fmt.Sprintf("no two consecutive rounds agreed in %d rounds; last: %s", n, reason)}
	}
	last := rounds[n-1]
	retry := !last.Complete || n >= 2
	if reason == "" {
		reason = fmt.Sprintf("round %d done; round B next", last.Round)
	}
	return Decision{Reason: reason, Retry: retry}
}

// Downgrade returns the level to try when the ledger refused to publish level from the same
// rounds: PROVEN falls back to UNPROVEN, UNPROVEN to RECONCILIATION_REQUIRED.
func Downgrade(level string) string {
	if level == contract.ProofSnapshotProven {
		return contract.ProofSnapshotUnproven
	}
	return contract.ProofReconciliationRequired
}
