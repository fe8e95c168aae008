package ledger_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// recActivate moves a DISCOVERED subscription to ACTIVE on the fixture's session.
func (f *catFixture) recActivate(sub ledger.Subscription) {
	f.t.Helper()
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){f.st.BeginSubscribe, f.st.Activate} {
		if r, err := step(f.ctx, sub.ID, sub.Generation, f.gen); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			f.t.Fatalf("activate generation %d: %+v %v", sub.Generation, r, err)
		}
	}
}

// recAllocate issues the next read ordinal of sub under request ID req.
func (f *catFixture) recAllocate(sub ledger.Subscription, req string) int64 {
	f.t.Helper()
	d, err := f.st.AllocateReadOrdinal(f.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: f.gen, URI: catURI, RequestID: req, Reason: mcpsync.ReasonNotification})
	if err != nil || d.Outcome != mcpsync.OutcomeAllocated {
		f.t.Fatalf("allocate %s: %+v %v", req, d, err)
	}
	return d.Ordinal
}

// recRead dispatches a read of sub and answers it with body.
func (f *catFixture) recRead(sub ledger.Subscription, req, body string) (int64, ledger.AcceptResult) {
	f.t.Helper()
	ord := f.recAllocate(sub, req)
	digest, err := f.st.PutBlob(f.ctx, []byte(body), "text/plain")
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: f.gen, URI: catURI, Ordinal: ord, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(body))}})
	if err != nil {
		f.t.Fatal(err)
	}
	return ord, r
}

// recNotFound dispatches a read of sub that answers not-found: TOMBSTONE_PENDING.
func (f *catFixture) recNotFound(sub ledger.Subscription, req string) {
	f.t.Helper()
	ord := f.recAllocate(sub, req)
	out, err := f.st.RecordNotFound(f.ctx, ledger.NotFoundRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: f.gen, URI: catURI, Ordinal: ord, RequestID: req})
	if err != nil || out != mcpsync.OutcomeTombstonePending {
		f.t.Fatalf("not found %s: %s %v", req, out, err)
	}
}

func (f *catFixture) recSub(id int64) ledger.Subscription {
	f.t.Helper()
	sub, err := f.st.SubscriptionByID(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sub
}

func (f *catFixture) recEnsure() ledger.Subscription {
	f.t.Helper()
	sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "p", SourceID: f.src.ID, URI: catURI, ServerURI: catURI, WorkflowID: "wf-cat"})
	if err != nil {
		f.t.Fatal(err)
	}
	return sub
}

// R21, R15: after a confirmed tombstone, and in every new subscription generation, the next
// good read is a new version with its invalidation, even when its bytes are those accepted
// before; without a confirmed tombstone, in the same generation, identical bytes only
// revalidate.
func TestRecreatedResourceWithSameBytesIsANewVersion(t *testing.T) {
	const body = "same bytes"
	tests := []struct {
		name string
		// gone takes the ACTIVE subscription, whose latest version is body, away and brings
		// it back ACTIVE; it returns the subscription as it is now.
		gone        func(f *catFixture, sub ledger.Subscription) ledger.Subscription
		want        mcpsync.Outcome
		wantVersion bool // a new content version and its invalidation
	}{
		{
			name: "deleted, tombstone confirmed, subscribed again", want: mcpsync.OutcomeAccepted, wantVersion: true,
			gone: func(f *catFixture, sub ledger.Subscription) ledger.Subscription {
				f.recNotFound(sub, "gone")
				c := f.catalog(ledger.ProofSnapshotUnproven)
				tr, err := f.st.ConfirmTombstone(f.ctx, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID})
				if err != nil || tr.Outcome != mcpsync.OutcomeTransitioned {
					f.t.Fatalf("confirm tombstone: %+v %v", tr, err)
				}
				if got := f.recSub(sub.ID).LastAcceptedDigest; got != "" {
					f.t.Errorf("digest after the confirmed tombstone = %q, want none: the latest version is the tombstone", got)
				}
				if r, err := f.st.CompleteUnsubscribe(f.ctx, sub.ID, sub.Generation, tr.CloseEpoch); err != nil || r.State != mcpsync.StateClosed {
					f.t.Fatalf("complete unsubscribe: %+v %v", r, err)
				}
				again := f.recEnsure()
				if again.Generation != sub.Generation+1 || again.State != mcpsync.StateDiscovered {
					f.t.Fatalf("subscribe after the tombstone: generation %d state %s (%s), want generation %d DISCOVERED",
						again.Generation, again.State, again.StateReason, sub.Generation+1)
				}
				f.recActivate(again)
				return again
			},
		},
		{
			name: "unsubscribed, subscribed again", want: mcpsync.OutcomeAccepted, wantVersion: true,
			gone: func(f *catFixture, sub ledger.Subscription) ledger.Subscription {
				cr, err := f.st.BeginUnsubscribe(f.ctx, sub.ID, sub.Generation, "test")
				if err != nil || cr.Outcome != mcpsync.OutcomeTransitioned {
					f.t.Fatalf("begin unsubscribe: %+v %v", cr, err)
				}
				if r, err := f.st.CompleteUnsubscribe(f.ctx, sub.ID, sub.Generation, cr.CloseEpoch); err != nil || r.State != mcpsync.StateClosed {
					f.t.Fatalf("complete unsubscribe: %+v %v", r, err)
				}
				again := f.recEnsure()
				if again.Generation != sub.Generation+1 || again.LastAcceptedDigest != "" {
					f.t.Errorf("reopened: generation %d digest %q, want generation %d and no digest",
						again.Generation, again.LastAcceptedDigest, sub.Generation+1)
				}
				f.recActivate(again)
				return again
			},
		},
		{
			name: "not found, still listed, restored", want: mcpsync.OutcomeRevalidated,
			gone: func(f *catFixture, sub ledger.Subscription) ledger.Subscription {
				f.recNotFound(sub, "gone")
				if r, err := f.st.RestoreFromTombstone(f.ctx, sub.ID, sub.Generation, f.gen); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
					f.t.Fatalf("restore: %+v %v", r, err)
				}
				return f.recSub(sub.ID)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, true)
			sub := f.recEnsure()
			f.recActivate(sub)
			if _, r := f.recRead(sub, "first", body); r.Outcome != mcpsync.OutcomeAccepted {
				t.Fatalf("first read: %+v", r)
			}
			sub = tt.gone(f, f.recSub(sub.ID))
			count := func(q string) int { return f.countRows(q, sub.ID) }
			const versionsQ = `SELECT count(*) FROM resource_versions WHERE subscription_id = $1 AND kind = 'content'`
			const outboxQ = `SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1 AND kind = 'version'`
			versions, outbox := count(versionsQ), count(outboxQ)

			ord, r := f.recRead(sub, "again", body)

			type result struct {
				Outcome      mcpsync.Outcome
				NewVersions  int
				NewOutbox    int
				LatestKind   string
				LatestDigest string
			}
			want := result{Outcome: tt.want, LatestKind: "content", LatestDigest: ledger.Digest([]byte(body))}
			if tt.wantVersion {
				want.NewVersions, want.NewOutbox = 1, 1
			}
			got := result{Outcome: r.Outcome, NewVersions: count(versionsQ) - versions, NewOutbox: count(outboxQ) - outbox}
			v, err := f.st.LatestVersion(f.ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			got.LatestKind, got.LatestDigest = v.Kind, v.Digest
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the read after the resource came back (-want +got):\n%s", diff)
			}
			if tt.wantVersion && (v.ReadOrdinal != ord || v.ID != r.VersionID) {
				t.Errorf("latest version %d at ordinal %d, want version %d at the new read's ordinal %d", v.ID, v.ReadOrdinal, r.VersionID, ord)
			}
			if after := f.recSub(sub.ID); after.LastAcceptedDigest != ledger.Digest([]byte(body)) || after.LastAcceptedOrdinal != ord {
				t.Errorf("subscription digest %q at %d, want the body's at %d", after.LastAcceptedDigest, after.LastAcceptedOrdinal, ord)
			}
			if rep, err := invariants.Check(f.ctx, f.st.Pool()); err != nil || rep.Violations() != 0 {
				t.Errorf("R24 invariants: %v %v", rep, err)
			}
		})
	}
}

// A subscribe after the deletion was confirmed and the subscription CLOSED opens the next
// generation at once, whoever asks: the row is never left refusing its own reopening.
func TestSubscribeAfterTombstoneReopens(t *testing.T) {
	f := newCatFixture(t, true)
	sub := f.recEnsure()
	f.recActivate(sub)
	f.recRead(sub, "first", "v1")
	f.recNotFound(sub, "gone")
	c := f.catalog(ledger.ProofSnapshotUnproven)
	tr, err := f.st.ConfirmTombstone(f.ctx, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID})
	if err != nil || tr.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("confirm tombstone: %+v %v", tr, err)
	}
	// While the close is under way the subscription is returned as it is, not reopened.
	if during := f.recEnsure(); during.Generation != sub.Generation || during.State != mcpsync.StateUnsubscribing {
		t.Errorf("subscribe while closing: generation %d state %s, want generation %d UNSUBSCRIBING", during.Generation, during.State, sub.Generation)
	}
	if _, err := f.st.CompleteUnsubscribe(f.ctx, sub.ID, sub.Generation, tr.CloseEpoch); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // the second call is the workflow's replay: the same generation
		got := f.recEnsure()
		if diff := cmp.Diff(fmt.Sprint(sub.Generation+1, mcpsync.StateDiscovered), fmt.Sprint(got.Generation, got.State)); diff != "" {
			t.Errorf("subscribe %d after the tombstone (-want +got):\n%s", i+1, diff)
		}
	}
	if n := f.countRows(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'SUBSCRIPTION_OPENED'`, sub.ID); n != 2 {
		t.Errorf("%d SUBSCRIPTION_OPENED receipts, want 2 (the first opening and the reopening)", n)
	}
}
