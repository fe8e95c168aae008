package ledger_test

import (
	"testing"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A grant committed between EnsureSubscription's upsert (which found no grant, so left the
// CLOSED row alone) and its look-up must not make EnsureSubscription hand back the CLOSED row
// as if it were open: the subscription is reopened in a new generation.
func TestEnsureSubscriptionRacingGrantReopens(t *testing.T) {
	f := newFixture(t)
	const who = "carol"
	if _, _, err := f.st.GrantAccess(f.ctx, who, f.src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	spec := ledger.EnsureSpec{Principal: who, SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-carol"}
	sub, err := f.st.EnsureSubscription(f.ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.Revoke(f.ctx, ledger.RevokeRequest{Principal: who, SourceID: f.src.ID, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	cr, err := f.st.BeginUnsubscribe(f.ctx, sub.ID, sub.Generation, "revoked")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := f.st.CompleteUnsubscribe(f.ctx, sub.ID, sub.Generation, cr.CloseEpoch); err != nil || r.State != mcpsync.StateClosed {
		t.Fatalf("setup: close: %+v %v", r, err)
	}

	granted := false
	defer ledger.SetEnsureLookupHook(func() {
		if granted {
			return
		}
		granted = true
		if _, _, err := f.st.GrantAccess(f.ctx, who, f.src.ID, "test"); err != nil {
			t.Error(err)
		}
	})()
	got, err := f.st.EnsureSubscription(f.ctx, spec)
	if err != nil {
		t.Fatalf("ensure after the racing grant: %v", err)
	}
	if !granted {
		t.Fatal("the hook did not run: the race was not exercised")
	}
	if got.State == mcpsync.StateClosed || got.Generation != sub.Generation+1 {
		t.Errorf("ensure racing a grant returned state %s generation %d, want a reopened subscription in generation %d", got.State, got.Generation, sub.Generation+1)
	}
}
