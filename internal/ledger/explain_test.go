package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/harness/shuffle"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// explainStep is the part of a timeline event TestExplain compares.
type explainStep struct {
	Kind    ledger.EventKind
	Ordinal int64
	Outcome string
}

func steps(events []ledger.TimelineEvent) []explainStep {
	out := make([]explainStep, 0, len(events))
	for _, e := range events {
		out = append(out, explainStep{e.Kind, e.Ordinal, e.Outcome})
	}
	return out
}

// explainAnswer offers body as the answer to ordinal ord (request req) from server demo 1.2.3.
func (f *fixture) explainAnswer(ord int64, req, body string) (ledger.AcceptResult, string) {
	f.t.Helper()
	digest, err := f.st.PutBlob(f.ctx, []byte(body), "text/plain")
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{
		SubscriptionID: f.sub.ID, Generation: f.sub.Generation, SessionGeneration: f.sess.Generation,
		URI: testURI, Ordinal: ord, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(body)), ServerName: "demo", ServerVersion: "1.2.3"},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return r, digest
}

// A history built with the real ledger calls — two reads answered out of order (the later one
// accepted, the earlier one refused STALE), an outbox row one consumer passed, a guard verdict
// and an index's lineage, a notification out of order, the close fence and a late read refused
// STALE_AFTER_CLOSE — reads back as one timeline in the order it happened, and --ordinal
// narrows it to one read and what followed from it (issue 17 part 4).
func TestExplain(t *testing.T) {
	f := newFixture(t)
	ctx := f.ctx
	if d1, d2 := f.dispatch("r1"), f.dispatch("r2"); d1.Ordinal != 1 || d2.Ordinal != 2 {
		t.Fatalf("dispatches: %+v %+v", d1, d2)
	}
	r2, digest2 := f.explainAnswer(2, "r2", "second")
	if r2.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("answer 2: %+v", r2)
	}
	if r1, _ := f.explainAnswer(1, "r1", "first"); r1.Outcome != mcpsync.OutcomeStale {
		t.Fatalf("answer 1: %+v, want STALE", r1)
	}
	// One consumer passes the version's outbox row, another does not.
	if _, err := f.st.EnsureConsumer(ctx, "cache", false); err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.EnsureConsumer(ctx, "search", false); err != nil {
		t.Fatal(err)
	}
	// The row's own cursor (OutboxBatch would wait for every older transaction of the shared
	// cluster to end).
	var cur ledger.OutboxCursor
	if err := f.st.Pool().QueryRow(ctx, `SELECT txid::text::bigint, id FROM invalidation_outbox WHERE subscription_id = $1`,
		f.sub.ID).Scan(&cur.TxID, &cur.ID); err != nil {
		t.Fatal(err)
	}
	if ok, err := f.st.CommitConsumer(ctx, "cache", cur, 1); err != nil || !ok {
		t.Fatalf("commit: %v %v", ok, err)
	}
	// The output guard's verdict and an index taking the version.
	if _, err := f.st.Read(ctx, ledger.ReadRequest{Principal: "default", SourceID: f.src.ID, URI: testURI, PolicyID: "test-policy", ForIndex: "idx"},
		func(context.Context, ledger.Version, []byte) (ledger.GuardVerdict, []byte, error) {
			return ledger.GuardVerdict{Policy: "pass", Outcome: ledger.VerdictPass}, nil, nil
		}); err != nil {
		t.Fatal(err)
	}
	// Notifications 5 then 3 of the session: the second is out of order and audited.
	for _, seq := range []int64{5, 3} {
		if _, _, err := f.st.RecordNotification(ctx, ledger.Notification{SourceID: f.src.ID, SessionGeneration: f.sess.Generation, Seq: seq, URI: testURI, ServerURI: testURI}); err != nil {
			t.Fatal(err)
		}
	}
	// A read dispatched before the close fence, answered after it.
	if d3 := f.dispatch("r3"); d3.Ordinal != 3 {
		t.Fatalf("dispatch 3: %+v", d3)
	}
	if c, err := f.st.BeginUnsubscribe(ctx, f.sub.ID, f.sub.Generation, "test close"); err != nil || c.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("close: %+v %v", c, err)
	}
	if r3, _ := f.explainAnswer(3, "r3", "third"); r3.Outcome != mcpsync.OutcomeStaleAfterClose {
		t.Fatalf("answer 3: %+v, want STALE_AFTER_CLOSE", r3)
	}

	tl, err := f.st.Explain(ctx, ledger.ExplainRequest{Principal: "default", Source: "demo", URI: testURI})
	if err != nil {
		t.Fatal(err)
	}
	want := []explainStep{
		{ledger.EventSession, 0, "SESSION_OPENED"},
		{ledger.EventTransition, 0, "SUBSCRIPTION_OPENED"},
		{ledger.EventTransition, 0, "SUBSCRIBING"},
		{ledger.EventTransition, 0, "ACTIVATED"},
		{ledger.EventDispatch, 1, "STALE"},
		{ledger.EventDispatch, 2, "ACCEPTED"},
		{ledger.EventAnswer, 2, "ACCEPTED"},
		{ledger.EventOutbox, 2, ""},
		{ledger.EventAnswer, 1, "STALE"},
		{ledger.EventGuardVerdict, 2, "PASS"},
		{ledger.EventLineage, 2, ""},
		{ledger.EventNotification, 0, "NOTIFICATION_OUT_OF_ORDER"},
		{ledger.EventDispatch, 3, "STALE_AFTER_CLOSE"},
		{ledger.EventCloseFence, 0, "CLOSE_FENCE"},
		{ledger.EventAnswer, 3, "STALE_AFTER_CLOSE"},
	}
	if diff := cmp.Diff(want, steps(tl.Events)); diff != "" {
		t.Fatalf("timeline (-want +got):\n%s", diff)
	}
	ev := func(kind ledger.EventKind, ord int64) ledger.TimelineEvent {
		for _, e := range tl.Events {
			if e.Kind == kind && e.Ordinal == ord {
				return e
			}
		}
		t.Fatalf("no %s event of ordinal %d", kind, ord)
		return ledger.TimelineEvent{}
	}
	type answerView struct {
		Digest, ServerName, ServerVersion string
		Before, After                     int64
		FencedBy                          int64
		FromSession                       bool
	}
	view := func(e ledger.TimelineEvent) answerView {
		v := answerView{Digest: e.Digest, ServerName: e.ServerName, ServerVersion: e.ServerVersion, FencedBy: e.FencedBy, FromSession: e.ServerFromSession, Before: -1, After: -1}
		if e.WatermarkBefore != nil {
			v.Before = *e.WatermarkBefore
		}
		if e.WatermarkAfter != nil {
			v.After = *e.WatermarkAfter
		}
		return v
	}
	if diff := cmp.Diff(answerView{Digest: digest2, ServerName: "demo", ServerVersion: "1.2.3", Before: 0, After: 2}, view(ev(ledger.EventAnswer, 2))); diff != "" {
		t.Errorf("accepted answer (-want +got):\n%s", diff)
	}
	stale := view(ev(ledger.EventAnswer, 1))
	if stale.Before != 2 || stale.After != -1 || stale.FencedBy != 2 || !stale.FromSession {
		t.Errorf("stale answer: %+v; want watermark 2 found, fenced by ordinal 2, server from the session", stale)
	}
	if ob := ev(ledger.EventOutbox, 2); ob.Digest != digest2 || ob.OutboxKind != "version" ||
		!cmp.Equal(ob.ConsumersPassed, []string{"cache"}) || !cmp.Equal(ob.ConsumersPending, []string{"search"}) {
		t.Errorf("outbox event: %+v; want the version row passed by cache, not by search", ob)
	}
	if l := ev(ledger.EventLineage, 2); l.Index != "idx" || l.Digest != digest2 {
		t.Errorf("lineage event: %+v", l)
	}
	if cf := ev(ledger.EventCloseFence, 0); cf.CloseOrdinal == nil || *cf.CloseOrdinal != 3 {
		t.Errorf("close fence: %+v; want close ordinal 3", cf)
	}
	if d := ev(ledger.EventDispatch, 2); d.RequestID != "r2" || d.ReadReason != string(mcpsync.ReasonNotification) || d.SessionGeneration != f.sess.Generation {
		t.Errorf("dispatch 2: %+v", d)
	}
	if tl.Current == nil || tl.Current.ReadOrdinal != 2 || tl.Current.Digest != digest2 || tl.Watermark != 2 ||
		tl.State != mcpsync.StateUnsubscribing || tl.CloseOrdinal == nil || *tl.CloseOrdinal != 3 ||
		tl.LastNotificationSeq != 5 || tl.LastNotificationGen != f.sess.Generation || !tl.Published {
		t.Errorf("timeline header: %+v", tl)
	}

	// --ordinal 2: that read, its answer, outbox row, verdict, lineage, and the read its
	// watermark refused.
	tl2, err := f.st.Explain(ctx, ledger.ExplainRequest{Principal: "default", Source: "demo", URI: testURI, Ordinal: 2})
	if err != nil {
		t.Fatal(err)
	}
	want2 := []explainStep{
		{ledger.EventDispatch, 2, "ACCEPTED"},
		{ledger.EventAnswer, 2, "ACCEPTED"},
		{ledger.EventOutbox, 2, ""},
		{ledger.EventAnswer, 1, "STALE"},
		{ledger.EventGuardVerdict, 2, "PASS"},
		{ledger.EventLineage, 2, ""},
	}
	if diff := cmp.Diff(want2, steps(tl2.Events)); diff != "" {
		t.Errorf("timeline of ordinal 2 (-want +got):\n%s", diff)
	}

	for _, req := range []ledger.ExplainRequest{
		{Principal: "default", Source: "demo", URI: testURI, Ordinal: 9},
		{Principal: "default", Source: "demo", URI: "demo://notes/none"},
		{Principal: "alice", Source: "demo", URI: testURI},
		{Principal: "default", Source: "nosuch", URI: testURI},
	} {
		if _, err := f.st.Explain(ctx, req); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("explain %+v: %v, want ErrNotFound", req, err)
		}
	}
}

// A read that confirmed the accepted digest (REVALIDATED: the watermark moves, no version, no
// outbox row), a new session that fences the subscription, a dispatch refused on the old
// session, and a revocation that invalidates the index that took the version all appear in
// the timeline, each as recorded.
func TestExplainRevalidatedSessionChangeRevocation(t *testing.T) {
	f := newFixture(t)
	ctx := f.ctx
	f.dispatch("r1")
	if r, _ := f.explainAnswer(1, "r1", "same"); r.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("answer 1: %+v", r)
	}
	f.dispatch("r2")
	if r, _ := f.explainAnswer(2, "r2", "same"); r.Outcome != mcpsync.OutcomeRevalidated {
		t.Fatalf("answer 2: %+v, want REVALIDATED", r)
	}
	if _, err := f.st.Read(ctx, ledger.ReadRequest{Principal: "default", SourceID: f.src.ID, URI: testURI, PolicyID: "test-policy", ForIndex: "idx"},
		func(context.Context, ledger.Version, []byte) (ledger.GuardVerdict, []byte, error) {
			return ledger.GuardVerdict{Policy: "pass", Outcome: ledger.VerdictPass}, nil, nil
		}); err != nil {
		t.Fatal(err)
	}
	old := f.sess
	f.openSession()
	if d, err := f.st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: f.sub.ID, Generation: f.sub.Generation,
		SessionGeneration: old.Generation, URI: testURI, RequestID: "r-old", Reason: mcpsync.ReasonBackstop}); err != nil || d.Outcome != mcpsync.OutcomeOldSession {
		t.Fatalf("allocate on the old session: %+v %v", d, err)
	}
	rv, err := f.st.Revoke(ctx, ledger.RevokeRequest{Principal: "default", SourceID: f.src.ID, Reason: "left the team"})
	if err != nil {
		t.Fatal(err)
	}

	tl, err := f.st.Explain(ctx, ledger.ExplainRequest{Principal: "default", Source: "demo", URI: testURI})
	if err != nil {
		t.Fatal(err)
	}
	want := []explainStep{
		{ledger.EventSession, 0, "SESSION_OPENED"},
		{ledger.EventTransition, 0, "SUBSCRIPTION_OPENED"},
		{ledger.EventTransition, 0, "SUBSCRIBING"},
		{ledger.EventTransition, 0, "ACTIVATED"},
		{ledger.EventDispatch, 1, "ACCEPTED"},
		{ledger.EventAnswer, 1, "ACCEPTED"},
		{ledger.EventOutbox, 1, ""},
		{ledger.EventDispatch, 2, "REVALIDATED"},
		{ledger.EventAnswer, 2, "REVALIDATED"},
		{ledger.EventGuardVerdict, 1, "PASS"},
		{ledger.EventLineage, 1, ""},
		{ledger.EventSession, 0, "SESSION_OPENED"},
		{ledger.EventTransition, 0, "SESSION_CHANGED"},
		{ledger.EventDispatchRefused, 0, "OLD_SESSION"},
		{ledger.EventRevocation, 0, "REVOKED"},
		{ledger.EventIndexInvalidate, 1, ""},
	}
	if diff := cmp.Diff(want, steps(tl.Events)); diff != "" {
		t.Fatalf("timeline (-want +got):\n%s", diff)
	}
	for _, e := range tl.Events {
		switch {
		case e.Kind == ledger.EventAnswer && e.Ordinal == 2:
			if e.WatermarkBefore == nil || *e.WatermarkBefore != 1 || e.WatermarkAfter == nil || *e.WatermarkAfter != 2 || e.VersionID != 0 {
				t.Errorf("revalidated answer: %+v; want watermark 1 -> 2 and no version", e)
			}
		case e.Kind == ledger.EventTransition && e.Outcome == "SESSION_CHANGED":
			if e.State != string(mcpsync.StateReconciliationRequired) || e.Reason != fmt.Sprintf("session changed to generation %d", f.sess.Generation) {
				t.Errorf("session change: %+v", e)
			}
		case e.Kind == ledger.EventDispatchRefused:
			if e.ReadReason != string(mcpsync.ReasonBackstop) || e.RequestID != "r-old" || e.SessionGeneration != old.Generation {
				t.Errorf("refused dispatch: %+v", e)
			}
		case e.Kind == ledger.EventRevocation, e.Kind == ledger.EventIndexInvalidate:
			if e.RevocationID != rv.ID {
				t.Errorf("%s: revocation %d, want %d", e.Kind, e.RevocationID, rv.ID)
			}
			if e.Kind == ledger.EventIndexInvalidate && (e.Index != "idx" || e.OutboxID == 0 || e.OutboxKind != ledger.OutboxIndexInvalidation) {
				t.Errorf("index invalidation: %+v", e)
			}
		}
	}
	if tl.Watermark != 2 || tl.Current == nil || tl.Current.ReadOrdinal != 1 {
		t.Errorf("header: watermark %d, current %+v; want watermark 2 over version of ordinal 1", tl.Watermark, tl.Current)
	}
}

// Over the histories the shuffle harness leaves (racing notifications, reads, answers and
// closes against the real ledger, R26), every timeline is consistent with the ledger's fence:
// in the order shown, the answers that passed the fence form one chain of watermarks
// (each before = the previous after, before < after), every STALE answer's ordinal is not
// above the watermark it found, the chain ends at the subscription's watermark, the current
// version is the last ACCEPTED answer, and every issued ordinal has exactly one dispatch.
func TestExplainOverShuffledHistories(t *testing.T) {
	ctx := t.Context()
	cfg, err := shuffle.PoolConfig(pgtest.NewDB(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	rep, err := shuffle.Run(ctx, pool, shuffle.Options{Interleavings: 60, Seed: 17, Concurrency: 4, SkipLinearizability: true})
	if err != nil || !rep.OK() {
		t.Fatalf("shuffle: %v, %d violations", err, rep.Violations())
	}
	st := ledger.New(pool)
	subs, err := st.ListSubscriptions(ctx, ledger.SubscriptionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var withStale int
	for _, sub := range subs {
		tl, err := st.Explain(ctx, ledger.ExplainRequest{Principal: sub.Principal, Source: sub.SourceName, URI: sub.URI})
		if err != nil {
			t.Fatal(err)
		}
		var watermark, accepted int64
		dispatched := map[int64]int{}
		stale := false
		for _, e := range tl.Events {
			switch {
			case e.Kind == ledger.EventDispatch:
				dispatched[e.Ordinal]++
			case e.Kind == ledger.EventAnswer && e.WatermarkAfter != nil:
				if *e.WatermarkBefore != watermark || *e.WatermarkAfter <= watermark {
					t.Errorf("subscription %d: %s of ordinal %d shows watermark %d -> %d after a chain at %d", sub.ID, e.Outcome, e.Ordinal, *e.WatermarkBefore, *e.WatermarkAfter, watermark)
				}
				watermark = *e.WatermarkAfter
				if e.Outcome == string(mcpsync.OutcomeAccepted) {
					accepted = e.Ordinal
				}
			case e.Kind == ledger.EventAnswer && e.Outcome == string(mcpsync.OutcomeStale):
				stale = true
				// Refused by the ordinal fence, or because the subscription was no longer ACTIVE.
				if e.WatermarkBefore == nil {
					t.Fatalf("subscription %d: STALE ordinal %d without the watermark it found", sub.ID, e.Ordinal)
				}
				byFence := e.Ordinal <= *e.WatermarkBefore && e.FencedBy == *e.WatermarkBefore
				notActive := e.Ordinal > *e.WatermarkBefore && e.FencedBy == 0 && e.State != "" && e.State != string(mcpsync.StateActive)
				if !byFence && !notActive {
					t.Errorf("subscription %d: STALE ordinal %d against watermark %d in state %q, fenced by %d", sub.ID, e.Ordinal, *e.WatermarkBefore, e.State, e.FencedBy)
				}
			}
		}
		if watermark != tl.Watermark {
			t.Errorf("subscription %d: the answers' chain ends at %d, the watermark is %d", sub.ID, watermark, tl.Watermark)
		}
		if tl.Current != nil && tl.Current.Kind == "content" && tl.Current.ReadOrdinal != accepted {
			t.Errorf("subscription %d: current version at ordinal %d, last ACCEPTED answer %d", sub.ID, tl.Current.ReadOrdinal, accepted)
		}
		for ord := int64(1); ord <= tl.LastIssuedOrdinal; ord++ {
			if dispatched[ord] != 1 {
				t.Errorf("subscription %d: ordinal %d has %d dispatch events", sub.ID, ord, dispatched[ord])
			}
		}
		if stale {
			withStale++
		}
	}
	t.Logf("%d subscriptions explained, %d with a STALE answer", len(subs), withStale)
	if withStale == 0 {
		t.Errorf("no shuffled history had a STALE answer: the check measured nothing")
	}
}
