package ledger_test

import (
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R30: the invalidation row of every accepted version is marked shadow exactly when its
// subscription is not published under the roll-out in force at the acceptance: shadow mode,
// or live mode with the subscription's bucket (the first 28 bits of the MD5 of its workflow
// ID, modulo 100) at or above the refresh percentage. The expectation is computed here from
// that definition, independently of the SQL; mcpsync_published must agree with it too.
func TestAcceptedVersionShadowFollowsRollout(t *testing.T) {
	f := newFixture(t)
	subs := []ledger.Subscription{f.sub}
	for i := 2; i <= 40; i++ {
		uri := fmt.Sprintf("demo://notes/%d", i)
		sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID,
			URI: uri, ServerURI: uri, WorkflowID: fmt.Sprintf("wf-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []func(int64, int64, int64) (ledger.TransitionResult, error){
			func(id, g, s int64) (ledger.TransitionResult, error) { return f.st.BeginSubscribe(f.ctx, id, g, s) },
			func(id, g, s int64) (ledger.TransitionResult, error) { return f.st.Activate(f.ctx, id, g, s) },
		} {
			if r, err := step(sub.ID, sub.Generation, f.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
				t.Fatalf("activate %s: %+v %v", uri, r, err)
			}
		}
		subs = append(subs, sub)
	}
	bucket := func(workflowID string) int {
		sum := md5.Sum([]byte(workflowID))
		v, err := strconv.ParseUint(hex.EncodeToString(sum[:])[:7], 16, 32)
		if err != nil {
			t.Fatal(err)
		}
		return int(v % 100)
	}
	tests := []struct {
		mode    string
		percent int
	}{
		{ledger.RolloutLive, 100},
		{ledger.RolloutLive, 0},
		{ledger.RolloutLive, 37},
		{ledger.RolloutShadow, 100},
		{ledger.RolloutShadow, 37},
		{ledger.RolloutLive, 63},
	}
	published := 0
	for round, tt := range tests {
		t.Run(fmt.Sprintf("%s-%d", tt.mode, tt.percent), func(t *testing.T) {
			if _, err := f.st.SetRollout(f.ctx, tt.mode, tt.percent, "test"); err != nil {
				t.Fatal(err)
			}
			want, gotShadow, gotPublished := map[string]bool{}, map[string]bool{}, map[string]bool{}
			for _, sub := range subs {
				req := fmt.Sprintf("round-%d", round)
				d, err := f.st.AllocateReadOrdinal(f.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
					SessionGeneration: f.sess.Generation, URI: sub.URI, RequestID: req, Reason: mcpsync.ReasonNotification})
				if err != nil || d.Outcome != mcpsync.OutcomeAllocated {
					t.Fatalf("allocate %s: %+v %v", sub.URI, d, err)
				}
				body := []byte(fmt.Sprintf("%s round %d", sub.URI, round))
				digest, err := f.st.PutBlob(f.ctx, body, "text/plain")
				if err != nil {
					t.Fatal(err)
				}
				r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
					SessionGeneration: f.sess.Generation, URI: sub.URI, Ordinal: d.Ordinal, RequestID: req,
					Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(body))}})
				if err != nil || r.Outcome != mcpsync.OutcomeAccepted {
					t.Fatalf("accept %s: %+v %v", sub.URI, r, err)
				}
				var shadow, pub bool
				if err := f.st.Pool().QueryRow(f.ctx, `SELECT o.shadow, mcpsync_published(s.workflow_id)
					FROM invalidation_outbox o JOIN subscriptions s ON s.id = o.subscription_id
					WHERE o.subscription_id = $1 AND o.read_ordinal = $2 AND o.kind = 'version'`, sub.ID, d.Ordinal).Scan(&shadow, &pub); err != nil {
					t.Fatal(err)
				}
				p := tt.mode == ledger.RolloutLive && bucket(sub.WorkflowID) < tt.percent
				want[sub.WorkflowID], gotShadow[sub.WorkflowID], gotPublished[sub.WorkflowID] = !p, shadow, !pub
				published += map[bool]int{true: 1}[p]
			}
			if diff := cmp.Diff(want, gotShadow); diff != "" {
				t.Errorf("outbox shadow marks (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(want, gotPublished); diff != "" {
				t.Errorf("NOT mcpsync_published (-want +got):\n%s", diff)
			}
		})
	}
	// The table is only a test of the percentage if some buckets fall on each side of it.
	if published == 0 || published == len(subs)*len(tests) {
		t.Fatalf("%d of %d acceptances published: the table does not split the buckets", published, len(subs)*len(tests))
	}
}
