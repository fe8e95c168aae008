package ledger_test

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// ListSubscriptions with URIs reads only the subscriptions to those URIs (what a bulk
// subscribe still waits for), combined with the other fields; nil URIs matches every URI, an
// empty slice none.
func TestListSubscriptionsByURIs(t *testing.T) {
	f := newFixture(t)
	for i := range 4 {
		u := fmt.Sprintf("demo://list/%d", i)
		if _, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: u, ServerURI: u, WorkflowID: "wf-list-" + u}); err != nil {
			t.Fatal(err)
		}
	}
	other := newFixtureOn(t, f.st, "other")
	if _, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: other.src.ID, URI: "demo://list/1", ServerURI: "demo://list/1", WorkflowID: "wf-other-list"}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		filter ledger.SubscriptionFilter
		want   []string
	}{
		{"nil URIs: every subscription of the source", ledger.SubscriptionFilter{Source: "demo"},
			[]string{"demo://list/0", "demo://list/1", "demo://list/2", "demo://list/3", testURI}},
		{"two URIs", ledger.SubscriptionFilter{Source: "demo", URIs: []string{"demo://list/3", "demo://list/1"}},
			[]string{"demo://list/1", "demo://list/3"}},
		{"a URI of no subscription", ledger.SubscriptionFilter{Source: "demo", URIs: []string{"demo://list/9", "demo://list/2"}},
			[]string{"demo://list/2"}},
		{"empty URIs: none", ledger.SubscriptionFilter{Source: "demo", URIs: []string{}}, nil},
		{"with the source", ledger.SubscriptionFilter{Source: "other", URIs: []string{"demo://list/1", "demo://list/2"}},
			[]string{"demo://list/1"}},
		{"with the principal", ledger.SubscriptionFilter{Principal: "nobody", URIs: []string{"demo://list/1"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			subs, err := f.st.ListSubscriptions(f.ctx, tt.filter)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range subs {
				got = append(got, s.URI)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("URIs listed (-want +got):\n%s", diff)
			}
		})
	}
}
