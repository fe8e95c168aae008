package ledger_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Reestablished names, of the subscriptions asked about, those past re-establishing on the
// new session: not those still fenced on the old one, nor those SUBSCRIBING on the new one
// (issue 16 item 4: the host paces SessionChanged by it).
func TestReestablished(t *testing.T) {
	f := newFixture(t)
	other, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: "demo://notes/2", ServerURI: "demo://notes/2", WorkflowID: "wf-2"})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){f.st.BeginSubscribe, f.st.Activate} {
		if r, err := step(f.ctx, other.ID, other.Generation, f.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("activate the other: %+v %v", r, err)
		}
	}
	ids := []int64{f.sub.ID, other.ID}
	ask := func(gen int64) []int64 {
		t.Helper()
		got, err := f.st.Reestablished(f.ctx, gen, ids)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	old := f.sess.Generation
	steps := []struct {
		name string
		do   func()
		gen  int64
		want []int64
	}{
		{name: "both ACTIVE on the first session", gen: old, want: []int64{f.sub.ID, other.ID}},
		{name: "a new session fences both", do: f.openSession, gen: old + 1, want: nil},
		{name: "one SUBSCRIBING on the new session", do: func() {
			if r, err := f.st.BeginSubscribe(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
				t.Fatalf("begin subscribe: %+v %v", r, err)
			}
		}, gen: old + 1, want: nil},
		{name: "it is ACTIVE on the new session", do: func() {
			if r, err := f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
				t.Fatalf("activate: %+v %v", r, err)
			}
		}, gen: old + 1, want: []int64{f.sub.ID}},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		if diff := cmp.Diff(s.want, ask(s.gen)); diff != "" {
			t.Errorf("%s: re-established on generation %d (-want +got):\n%s", s.name, s.gen, diff)
		}
	}
	if got, err := f.st.Reestablished(f.ctx, old+1, nil); err != nil || got != nil {
		t.Errorf("no ids: %v %v, want nothing", got, err)
	}
}
