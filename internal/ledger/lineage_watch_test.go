package ledger_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A read reports a subscription the server left out of its subscriptions/listen
// acknowledgement (ActivateWatch(..., true)) as polling with the poll period's bound, even
// though the session's capability receipt has resources.subscribe; one in the
// acknowledgement as notify (issue 13 item 3, R11). The gateway's _meta refresh is this.
func TestReadReportsNotAcknowledgedAsPolling(t *testing.T) {
	w := newGrantWorld(t) // backstop and poll periods default to 30 s: bound 36 s either way
	w.grant("alice")
	type fresh struct {
		Refresh         string
		Bound           int
		NotAcknowledged bool
	}
	for _, tt := range []struct {
		uri             string
		notAcknowledged bool
		want            fresh
	}{
		{"demo://watched", false, fresh{Refresh: "notify", Bound: 36}},
		{"demo://computed", true, fresh{Refresh: "poll", Bound: 36, NotAcknowledged: true}},
	} {
		sub, err := w.st.EnsureSubscription(w.ctx, ledger.EnsureSpec{Principal: "alice", SourceID: w.src.ID, URI: tt.uri,
			ServerURI: tt.uri, WorkflowID: "wf/alice/" + tt.uri})
		if err != nil {
			t.Fatal(err)
		}
		if r, err := w.st.BeginSubscribe(w.ctx, sub.ID, sub.Generation, w.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("begin subscribe %s: %+v %v", tt.uri, r, err)
		}
		if r, err := w.st.ActivateWatch(w.ctx, sub.ID, sub.Generation, w.sess.Generation, tt.notAcknowledged); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("activate %s: %+v %v", tt.uri, r, err)
		}
		w.publish(sub, "body of "+tt.uri, "text/plain")
		res, err := w.read("alice", tt.uri, "", (&passAll{}).eval)
		if err != nil {
			t.Fatalf("read %s: %v", tt.uri, err)
		}
		got := fresh{Refresh: res.Refresh, Bound: res.StalenessBoundSeconds, NotAcknowledged: res.NotAcknowledged}
		if d := cmp.Diff(tt.want, got); d != "" {
			t.Errorf("read %s freshness (-want +got):\n%s", tt.uri, d)
		}
	}
}
