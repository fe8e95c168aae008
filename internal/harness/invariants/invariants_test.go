package invariants_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// fixture is one ACTIVE subscription with ordinals 1 and 2 accepted through the ledger's own
// fences, on its own source, session and principal.
type fixture struct {
	st           *ledger.Store
	srcID, subID int64
	gen, sgen    int64
}

func newFixture(t *testing.T, ctx context.Context, st *ledger.Store, name string) fixture {
	t.Helper()
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: name, Transport: ledger.TransportStdio, Command: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET host_queue = 'q', lease_until = now() + interval '1 day' WHERE id = $1`, src.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.GrantAccess(ctx, "p-"+name, src.ID, "test"); err != nil {
		t.Fatal(err)
	}
	sess, _, err := st.OpenSession(ctx, src.ID, "q", ledger.CapabilityReceipt{Resources: true, Subscribe: true})
	if err != nil {
		t.Fatal(err)
	}
	sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "p-" + name, SourceID: src.ID, URI: "demo://a", ServerURI: "demo://a", WorkflowID: "w-" + name})
	if err != nil {
		t.Fatal(err)
	}
	f := fixture{st: st, srcID: src.ID, subID: sub.ID, gen: sub.Generation, sgen: sess.Generation}
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
		if r, err := step(ctx, sub.ID, sub.Generation, sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("setup transition: %+v, %v", r, err)
		}
	}
	for i, body := range []string{"v1", "v2"} {
		req := fmt.Sprint("r", i+1)
		d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: f.gen,
			SessionGeneration: f.sgen, URI: "demo://a", RequestID: req, Reason: mcpsync.ReasonNotification})
		if err != nil {
			t.Fatal(err)
		}
		r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: f.gen,
			SessionGeneration: f.sgen, URI: "demo://a", Ordinal: d.Ordinal, RequestID: req,
			Version: ledger.VersionInfo{Digest: ledger.Digest([]byte(body))}})
		if err != nil || r.Outcome != mcpsync.OutcomeAccepted {
			t.Fatalf("setup accept: %+v, %v", r, err)
		}
	}
	return f
}

// forgeAccept writes the ACCEPTED receipt a writer without the fences would leave for ordinal
// ord at session sgen.
func (f fixture) forgeAccept(t *testing.T, ctx context.Context, ord, sgen int64) {
	t.Helper()
	if _, err := f.st.Pool().Exec(ctx, `INSERT INTO receipts (idem_key, kind, subscription_id, generation, session_generation, read_ordinal)
		VALUES ('forged/' || $1::bigint || '/' || $2::bigint, 'ACCEPTED', $1, $3, $4, $2)`, f.subID, ord, f.gen, sgen); err != nil {
		t.Fatal(err)
	}
}

// The old-session check fires whether the session was replaced by a newer one or simply
// ended (CloseSession names no new session), and the non-ACTIVE check fires in every state
// other than ACTIVE, not only after the close fence.
func TestCheckSessionEndAndNonActive(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewPool(t)
	st := ledger.New(pool)
	tests := []struct {
		name  string
		setup func(t *testing.T, f fixture)
		want  invariants.Report
	}{
		{"clean", func(*testing.T, fixture) {}, invariants.Report{}},
		{"accept on a session that ended", func(t *testing.T, f fixture) {
			if out, err := st.CloseSession(ctx, f.srcID, f.sgen, "test"); err != nil || out != mcpsync.OutcomeTransitioned {
				t.Fatalf("close session: %s, %v", out, err)
			}
			f.forgeAccept(t, ctx, 3, f.sgen)
		}, invariants.Report{OldSessionAcceptances: 1, NonActiveAcceptances: 1}},
		{"accept on a session a newer one replaced", func(t *testing.T, f fixture) {
			if _, _, err := st.OpenSession(ctx, f.srcID, "q", ledger.CapabilityReceipt{Resources: true, Subscribe: true}); err != nil {
				t.Fatal(err)
			}
			f.forgeAccept(t, ctx, 3, f.sgen)
		}, invariants.Report{OldSessionAcceptances: 1, NonActiveAcceptances: 1}},
		{"accept while RECONCILIATION_REQUIRED", func(t *testing.T, f fixture) {
			if r, err := st.MarkReconciliationRequired(ctx, f.subID, f.gen, "test"); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
				t.Fatalf("mark: %+v, %v", r, err)
			}
			f.forgeAccept(t, ctx, 3, f.sgen)
		}, invariants.Report{NonActiveAcceptances: 1}},
		{"accept after the close fence", func(t *testing.T, f fixture) {
			if _, err := st.BeginUnsubscribe(ctx, f.subID, f.gen, "test"); err != nil {
				t.Fatal(err)
			}
			f.forgeAccept(t, ctx, 3, f.sgen)
		}, invariants.Report{AcceptedAfterClose: 1}},
	}
	var before invariants.Report
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.setup(t, newFixture(t, ctx, st, fmt.Sprint("s", i)))
			rep, err := invariants.Check(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			got := invariants.Report{
				VersionRegressions: rep.VersionRegressions - before.VersionRegressions, AcceptedAfterClose: rep.AcceptedAfterClose - before.AcceptedAfterClose,
				OutboxAfterClose: rep.OutboxAfterClose - before.OutboxAfterClose, NonActiveAcceptances: rep.NonActiveAcceptances - before.NonActiveAcceptances,
				OldSessionAcceptances: rep.OldSessionAcceptances - before.OldSessionAcceptances, OldGenerationAcceptances: rep.OldGenerationAcceptances - before.OldGenerationAcceptances,
				OrphanOutbox: rep.OrphanOutbox - before.OrphanOutbox,
			}
			before = rep
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("violations found (-want +got):\n%s\n%s", diff, rep)
			}
		})
	}
}
