package ledger_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R3, R6, R25: a list_changed recorded for the source (InvalidateCatalogs) at any time after
// round A of a scan started invalidates the catalog that scan publishes, whenever it comes
// relative to the publication: between round B's end and the publication the publishing
// statement itself finds it and publishes the catalog invalidated, with its re-check due at
// once; after the publication InvalidateCatalogs finds the catalog. A list_changed recorded
// before round A started is seen by the rounds and invalidates nothing they publish.
func TestListChangedBeforePublishInvalidates(t *testing.T) {
	tests := []struct {
		name string
		// when the list_changed is recorded: "none", "before A", "between A and B",
		// "after B" (before publication) or "after publication".
		when            string
		wantInvalidated bool
	}{
		{"no list_changed", "none", false},
		{"recorded before round A started", "before A", false},
		{"recorded between rounds A and B", "between A and B", true},
		{"recorded after round B, before publication", "after B", true},
		{"recorded after publication", "after publication", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, true)
			listChanged := func(at string) {
				if tt.when != at {
					return
				}
				if _, err := f.st.InvalidateCatalogs(f.ctx, f.src.ID, "list_changed on session generation 1"); err != nil {
					t.Fatal(err)
				}
			}
			sp := spec{set: "S", uris: []string{"demo://a"}, snapshot: "X"}
			run := f.newRun()
			listChanged("before A")
			a := f.round(run, 1, sp)
			listChanged("between A and B")
			b := f.round(run, 2, sp)
			listChanged("after B")
			c, err := f.publish(run, ledger.ProofSnapshotProven, a.ID, b.ID)
			if err != nil {
				t.Fatal(err)
			}
			listChanged("after publication")
			if c, err = f.st.CatalogByID(f.ctx, c.ID); err != nil {
				t.Fatal(err)
			}
			if got := c.InvalidatedAt != nil; got != tt.wantInvalidated {
				t.Errorf("catalog invalidated %v (%q), want %v", got, c.InvalidatedReason, tt.wantInvalidated)
			}
			_, err = f.st.ConsumeCatalog(f.ctx, ledger.CatalogRequest{Source: "cat", Purpose: ledger.PurposeIntegrity, Consumer: "test"})
			var refusal *ledger.CatalogRefusal
			gotRefusal := ""
			if errors.As(err, &refusal) {
				gotRefusal = refusal.Reason
			} else if err != nil {
				t.Fatal(err)
			}
			wantRefusal := ""
			if tt.wantInvalidated {
				wantRefusal = ledger.RefusalInvalidated
			}
			if diff := cmp.Diff(wantRefusal, gotRefusal); diff != "" {
				t.Errorf("integrity consumption refusal (-want +got):\n%s", diff)
			}
			// A catalog that a list_changed overtook while it was being published asks for
			// its re-check at once: the rescan the list_changed calls for.
			if due := !c.NextCheckAt.After(c.PublishedAt); due != (tt.when == "between A and B" || tt.when == "after B") {
				t.Errorf("next check %s, published %s: re-check due at once %v", c.NextCheckAt, c.PublishedAt, due)
			}
		})
	}
}
