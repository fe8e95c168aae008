package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// batchSource is a source of the batch tests: a live session and, per URI of batchURIs, the
// subscriptions its test needs.
type batchSource struct {
	*fixture
	subs map[string]ledger.Subscription // by "<uri> <principal>"
}

const (
	batchShared  = "demo://batch/shared"  // two principals' ACTIVE subscriptions
	batchAhead   = "demo://batch/ahead"   // ACTIVE, sequence number 10 already recorded
	batchClosing = "demo://batch/closing" // UNSUBSCRIBING
	batchUnknown = "demo://batch/unknown" // no subscription
)

// newBatchSource adds source name to st with the subscriptions of the batch tests; their
// workflow IDs are "<source> <principal> <uri>".
func newBatchSource(t *testing.T, st *ledger.Store, name string) *batchSource {
	t.Helper()
	b := &batchSource{fixture: newFixtureOn(t, st, name), subs: map[string]ledger.Subscription{}}
	if _, _, err := st.GrantAccess(b.ctx, "p2", b.src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct{ uri, principal string }{{batchShared, "default"}, {batchShared, "p2"}, {batchAhead, "default"}, {batchClosing, "default"}} {
		sub, err := st.EnsureSubscription(b.ctx, ledger.EnsureSpec{Principal: s.principal, SourceID: b.src.ID, URI: s.uri, ServerURI: s.uri, WorkflowID: name + " " + s.principal + " " + s.uri})
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
			if r, err := step(b.ctx, sub.ID, sub.Generation, b.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
				t.Fatalf("activate %s: %+v %v", s.uri, r, err)
			}
		}
		b.subs[s.uri+" "+s.principal] = sub
	}
	if _, _, err := st.RecordNotification(b.ctx, b.note(batchAhead, 10)); err != nil {
		t.Fatal(err)
	}
	c := b.subs[batchClosing+" default"]
	if _, err := st.BeginUnsubscribe(b.ctx, c.ID, c.Generation, "test"); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *batchSource) note(uri string, seq int64) ledger.Notification {
	return ledger.Notification{SourceID: b.src.ID, SessionGeneration: b.sess.Generation, Seq: seq, URI: uri, ServerURI: uri}
}

// recorded is each subscription's recorded (session generation, sequence number), by
// "<uri> <principal>".
func (b *batchSource) recorded() map[string][2]int64 {
	b.t.Helper()
	m := map[string][2]int64{}
	for k, s := range b.subs {
		got, err := b.st.SubscriptionByID(b.ctx, s.ID)
		if err != nil {
			b.t.Fatal(err)
		}
		m[k] = [2]int64{got.LastNotificationGen, got.LastNotificationSeq}
	}
	return m
}

// workflows is targets by URI as their workflow IDs without the source's name, sorted.
func workflows(targets map[string][]ledger.NotificationTarget) map[string][]string {
	m := map[string][]string{}
	for u, ts := range targets {
		for _, t := range ts {
			_, id, _ := strings.Cut(t.WorkflowID, " ")
			m[u] = append(m[u], id)
		}
		slices.Sort(m[u])
	}
	return m
}

// RecordNotifications records a batch as RecordNotification records its notifications one
// after another: the same subscriptions to signal per URI and the same (generation, sequence
// number) on every row, for a batch with a URI named twice, one already ahead, a closing
// subscription and a URI nobody subscribed to (those three absent from the answer, nothing
// written for them). A retry returns the same and writes nothing new; an old session's
// batch records nothing.
func TestRecordNotificationsAsOneAfterAnother(t *testing.T) {
	st := ledger.New(pgtest.NewPool(t))
	seq, batch := newBatchSource(t, st, "one-by-one"), newBatchSource(t, st, "batch")
	plan := []struct {
		uri string
		seq int64
	}{{batchShared, 3}, {batchAhead, 4}, {batchShared, 5}, {batchClosing, 6}, {batchUnknown, 7}, {batchShared, 2}}

	// One after another: what each returns, gathered per URI.
	want := map[string][]ledger.NotificationTarget{}
	for _, p := range plan {
		targets, _, err := st.RecordNotification(seq.ctx, seq.note(p.uri, p.seq))
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			if !slices.ContainsFunc(want[p.uri], func(x ledger.NotificationTarget) bool { return x.WorkflowID == tg.WorkflowID }) {
				want[p.uri] = append(want[p.uri], tg)
			}
		}
	}
	var ns []ledger.Notification
	for _, p := range plan {
		ns = append(ns, batch.note(p.uri, p.seq))
	}
	receipts := batch.rows().Receipts
	for _, attempt := range []string{"first", "retry"} {
		got, err := st.RecordNotifications(batch.ctx, batch.src.ID, batch.sess.Generation, ns)
		if err != nil {
			t.Fatalf("%s: %v", attempt, err)
		}
		if diff := cmp.Diff(workflows(want), workflows(got)); diff != "" {
			t.Errorf("%s: subscriptions to signal, one by one (-) and in one batch (+):\n%s", attempt, diff)
		}
		if diff := cmp.Diff(seq.recorded(), batch.recorded()); diff != "" {
			t.Errorf("%s: recorded (generation, seq), one by one (-) and in one batch (+):\n%s", attempt, diff)
		}
		if n := batch.rows().Receipts; n != receipts {
			t.Errorf("%s: %d receipts written, want none (the caller audits what matched nothing)", attempt, n-receipts)
		}
	}
	if got := batch.recorded()[batchShared+" p2"]; got != [2]int64{batch.sess.Generation, 5} {
		t.Errorf("shared URI recorded %v, want the batch's highest sequence number 5", got)
	}

	// A batch of the session before: nothing recorded, nothing to signal.
	before := batch.recorded()
	old := batch.sess.Generation
	batch.openSession()
	var stale []ledger.Notification
	for _, p := range plan {
		n := batch.note(p.uri, p.seq+100)
		n.SessionGeneration = old
		stale = append(stale, n)
	}
	got, err := st.RecordNotifications(batch.ctx, batch.src.ID, old, stale)
	if err != nil || len(got) != 0 {
		t.Errorf("old session's batch: %v %v, want nothing to signal", workflows(got), err)
	}
	if diff := cmp.Diff(before, batch.recorded()); diff != "" {
		t.Errorf("old session's batch recorded (-before +after):\n%s", diff)
	}

	// A notification of another source or session in the batch is refused whole.
	mixed := append([]ledger.Notification{batch.note(batchShared, 200)}, seq.note(batchShared, 201))
	if _, err := st.RecordNotifications(batch.ctx, batch.src.ID, batch.sess.Generation, mixed); !errors.Is(err, ledger.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprint(seq.src.ID)) {
		t.Errorf("mixed batch: %v, want ErrInvalid naming source %d", err, seq.src.ID)
	}
}
