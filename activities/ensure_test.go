package activities_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R23: EnsureSubscription opens nothing for a principal without a standing grant; its refusal
// (a non-retryable NoStandingGrant error) carries the subscription's row only when that row is
// open and belongs to the asking workflow, which then closes it. A closed row, another
// workflow's row or no row gives the bare refusal.
func TestEnsureSubscriptionWithoutGrant(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	a := &activities.Ledger{Store: st}
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "kb", Transport: ledger.TransportStdio, Command: []string{"kb"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.GrantAccess(ctx, "alice", src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	in := func(uri, wf string) contract.EnsureInput {
		return contract.EnsureInput{Principal: "alice", SourceID: src.ID, URI: uri, ServerURI: uri, WorkflowID: wf}
	}
	open, err := a.EnsureSubscription(ctx, in("demo://open", "wf-open"))
	if err != nil {
		t.Fatal(err)
	}
	closing, err := a.EnsureSubscription(ctx, in("demo://closed", "wf-closed"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := st.BeginUnsubscribe(ctx, closing.ID, closing.Generation, "unsubscribed")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.CompleteUnsubscribe(ctx, closing.ID, closing.Generation, cr.CloseEpoch); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Revoke(ctx, ledger.RevokeRequest{Principal: "alice", SourceID: src.ID, Reason: "test"}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		in   contract.EnsureInput
		want *contract.SubscriptionRef // the row carried, nil: none
	}{
		{"open row of this workflow", in("demo://open", "wf-open"), &open},
		{"open row of another workflow", in("demo://open", "wf-other"), nil},
		{"closed row", in("demo://closed", "wf-closed"), nil},
		{"no row", in("demo://none", "wf-none"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := a.EnsureSubscription(ctx, tt.in)
			var appErr *temporal.ApplicationError
			if !errors.As(err, &appErr) || appErr.Type() != contract.ErrTypeNoGrant || !appErr.NonRetryable() {
				t.Fatalf("EnsureSubscription = %+v, %v; want a non-retryable %s error", got, err, contract.ErrTypeNoGrant)
			}
			if !errors.Is(err, ledger.ErrNoGrant) {
				t.Errorf("error %v does not wrap ErrNoGrant", err)
			}
			if tt.want == nil {
				if appErr.HasDetails() {
					t.Errorf("refusal carries details, want none")
				}
				return
			}
			var ref contract.SubscriptionRef
			if err := appErr.Details(&ref); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(*tt.want, ref); diff != "" {
				t.Errorf("row carried (-want +got):\n%s", diff)
			}
			if ref.State != mcpsync.StateDiscovered {
				t.Errorf("row in %s, want DISCOVERED as opened", ref.State)
			}
		})
	}
}
