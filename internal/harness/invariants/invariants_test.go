package invariants_test

import (
	"context"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// A history made only through the ledger's fences is clean; the same history with rows a
// broken writer would leave (an accept past the close fence, a regression, an orphan
// invalidation, an old-session accept) is caught, each by its own counter.
func TestCheckCleanAndBroken(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	st := ledger.New(pool)
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: "s", Transport: ledger.TransportStdio, Command: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, "q", time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"p", "p2"} {
		if _, _, err := st.GrantAccess(ctx, p, src.ID, "test"); err != nil {
			t.Fatal(err)
		}
	}
	sess, _, err := st.OpenSession(ctx, src.ID, "q", ledger.CapabilityReceipt{Resources: true, Subscribe: true})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "p", SourceID: src.ID, URI: "demo://a", ServerURI: "demo://a", WorkflowID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	st.BeginSubscribe(ctx, sub.ID, sub.Generation, sess.Generation)
	st.Activate(ctx, sub.ID, sub.Generation, sess.Generation)
	accept := func(req, body string) ledger.AcceptResult {
		d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sess.Generation, URI: "demo://a", RequestID: req, Reason: mcpsync.ReasonNotification})
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: sess.Generation, URI: "demo://a", Ordinal: d.Ordinal, RequestID: req,
			Version: ledger.VersionInfo{Digest: ledger.Digest([]byte(body))}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	accept("r1", "v1")
	accept("r2", "v2")
	if _, err := st.BeginUnsubscribe(ctx, sub.ID, sub.Generation, "test"); err != nil {
		t.Fatal(err)
	}
	rep, err := invariants.Check(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Violations() != 0 || rep.Versions != 2 {
		t.Fatalf("clean ledger: %s", rep)
	}

	// What a writer that skipped the fences would leave behind.
	for _, q := range []string{
		`INSERT INTO receipts (kind, subscription_id, generation, session_generation, read_ordinal) VALUES ('ACCEPTED', $1, 1, 1, 1)`, // after close, and a regression
		`INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, read_ordinal, digest) VALUES ('version', 'forged', $1, 9, 'sha256:x')`,
	} {
		if _, err := pool.Exec(ctx, q, sub.ID); err != nil {
			t.Fatal(err)
		}
	}
	rep, err = invariants.Check(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if rep.AcceptedAfterClose != 1 || rep.VersionRegressions != 1 || rep.OrphanOutbox != 1 {
		t.Errorf("broken ledger not caught: %s", rep)
	}
	// A session change followed by an acceptance on the old session.
	if _, _, err := st.OpenSession(ctx, src.ID, "q", ledger.CapabilityReceipt{Resources: true}); err != nil {
		t.Fatal(err)
	}
	sub2, _ := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "p2", SourceID: src.ID, URI: "demo://a", ServerURI: "demo://a", WorkflowID: "w2"})
	if _, err := pool.Exec(ctx, `INSERT INTO receipts (kind, subscription_id, generation, session_generation, detail) VALUES ('SESSION_CHANGED', $1, 1, 1, '{"new_session_generation": 3}');
		`, sub2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO receipts (kind, subscription_id, generation, session_generation, read_ordinal) VALUES ('ACCEPTED', $1, 1, 2, 1)`, sub2.ID); err != nil {
		t.Fatal(err)
	}
	if rep, _ = invariants.Check(ctx, pool); rep.OldSessionAcceptances != 1 {
		t.Errorf("old-session acceptance not caught: %s", rep)
	}
}
