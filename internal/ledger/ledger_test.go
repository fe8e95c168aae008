package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// fixture is one source with a live session and one ACTIVE subscription.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	st    *ledger.Store
	src   ledger.Source
	sess  ledger.Session
	sub   ledger.Subscription
	queue string
}

const testURI = "demo://notes/1"

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	f := &fixture{t: t, ctx: ctx, st: st, queue: "host-a"}
	var err error
	f.src, _, err = st.AddSource(ctx, ledger.SourceSpec{Name: "demo", Transport: ledger.TransportStdio, Command: []string{"demo-server"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(ctx, f.queue, time.Minute); err != nil {
		t.Fatal(err)
	}
	f.openSession()
	f.sub, err = st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-1"})
	if err != nil {
		t.Fatal(err)
	}
	f.activate()
	return f
}

func (f *fixture) openSession() {
	f.t.Helper()
	sess, _, err := f.st.OpenSession(f.ctx, f.src.ID, f.queue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		f.t.Fatal(err)
	}
	f.sess = sess
}

func (f *fixture) activate() {
	f.t.Helper()
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){f.st.BeginSubscribe, f.st.Activate} {
		r, err := step(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation)
		if err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			f.t.Fatalf("activate: %+v %v", r, err)
		}
	}
	f.refresh()
}

func (f *fixture) refresh() ledger.Subscription {
	f.t.Helper()
	sub, err := f.st.SubscriptionByID(f.ctx, f.sub.ID)
	if err != nil {
		f.t.Fatal(err)
	}
	f.sub = sub
	return sub
}

// dispatch allocates the next ordinal with a fresh request ID.
func (f *fixture) dispatch(req string) ledger.Dispatch {
	f.t.Helper()
	d, err := f.st.AllocateReadOrdinal(f.ctx, ledger.AllocateRequest{
		SubscriptionID: f.sub.ID, Generation: f.sub.Generation, SessionGeneration: f.sess.Generation,
		URI: testURI, RequestID: req, Reason: mcpsync.ReasonNotification,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

func (f *fixture) accept(ord int64, req, body string) ledger.AcceptResult {
	f.t.Helper()
	digest, err := f.st.PutBlob(f.ctx, []byte(body), "text/plain")
	if err != nil {
		f.t.Fatal(err)
	}
	r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{
		SubscriptionID: f.sub.ID, Generation: f.sub.Generation, SessionGeneration: f.sess.Generation,
		URI: testURI, Ordinal: ord, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(body))},
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func (f *fixture) count(table string) int {
	f.t.Helper()
	var n int
	if err := f.st.Pool().QueryRow(f.ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE subscription_id = $1`, table), f.sub.ID).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// advanceTo issues ordinals until the next one allocated is n.
func (f *fixture) advanceTo(n int64) {
	for f.refresh().LastIssuedOrdinal < n-1 {
		f.dispatch(fmt.Sprintf("filler-%d", f.sub.LastIssuedOrdinal+1))
	}
}

// R17: read B (ordinal 6) returning first leaves a late read A (ordinal 5) only a stale
// receipt; A returning first lets 5 then 6 both be accepted.
func TestAcceptOrdinalsFiveAndSix(t *testing.T) {
	tests := []struct {
		name        string
		order       []int64
		want        []mcpsync.Outcome
		wantVersion []int64
		wantDigest  string
	}{
		{"six first, five late", []int64{6, 5}, []mcpsync.Outcome{mcpsync.OutcomeAccepted, mcpsync.OutcomeStale}, []int64{6}, "body-6"},
		{"five first, then six", []int64{5, 6}, []mcpsync.Outcome{mcpsync.OutcomeAccepted, mcpsync.OutcomeAccepted}, []int64{5, 6}, "body-6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			f.advanceTo(5)
			reqs := map[int64]string{}
			for _, n := range []int64{5, 6} {
				req := fmt.Sprintf("read-%d", n)
				if d := f.dispatch(req); d.Outcome != mcpsync.OutcomeAllocated || d.Ordinal != n {
					t.Fatalf("dispatch %d: %+v", n, d)
				}
				reqs[n] = req
			}
			var got []mcpsync.Outcome
			for _, n := range tt.order {
				got = append(got, f.accept(n, reqs[n], fmt.Sprintf("body-%d", n)).Outcome)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcomes (-want +got):\n%s", diff)
			}
			vs, err := f.st.Versions(f.ctx, f.sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			var ords []int64
			for _, v := range vs {
				ords = append(ords, v.ReadOrdinal)
			}
			if diff := cmp.Diff(tt.wantVersion, ords); diff != "" {
				t.Errorf("accepted version ordinals (-want +got):\n%s", diff)
			}
			sub := f.refresh()
			if sub.LastAcceptedOrdinal != 6 || sub.LastAcceptedDigest != ledger.Digest([]byte(tt.wantDigest)) {
				t.Errorf("watermark %d digest %s, want 6 and digest of %q", sub.LastAcceptedOrdinal, sub.LastAcceptedDigest, tt.wantDigest)
			}
			if n := f.count("invalidation_outbox"); n != len(tt.wantVersion) {
				t.Errorf("outbox rows = %d, want %d (one per accepted version)", n, len(tt.wantVersion))
			}
		})
	}
}

// R18, R19: after the close fence, content and not-found of a read sent before the close only
// leave a STALE_AFTER_CLOSE receipt; no read is allocated after it.
func TestAcceptAfterCloseFence(t *testing.T) {
	f := newFixture(t)
	before := f.dispatch("before-close")
	accepted := f.accept(f.dispatch("accepted").Ordinal, "accepted", "v1")
	if accepted.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("accept before close: %+v", accepted)
	}
	cr, err := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, "test")
	if err != nil || cr.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("begin unsubscribe: %+v %v", cr, err)
	}
	if cr.CloseOrdinal != 2 {
		t.Errorf("closeOrdinal = %d, want lastIssuedOrdinal 2", cr.CloseOrdinal)
	}
	versions, outbox := f.count("resource_versions"), f.count("invalidation_outbox")

	late := f.accept(before.Ordinal, "before-close", "late content")
	if late.Outcome != mcpsync.OutcomeStaleAfterClose {
		t.Errorf("late content outcome = %s, want STALE_AFTER_CLOSE", late.Outcome)
	}
	nf, err := f.st.RecordNotFound(f.ctx, ledger.NotFoundRequest{SubscriptionID: f.sub.ID, Generation: f.sub.Generation,
		SessionGeneration: f.sess.Generation, URI: testURI, Ordinal: before.Ordinal, RequestID: "before-close"})
	if err != nil || nf != mcpsync.OutcomeStaleAfterClose {
		t.Errorf("late not-found outcome = %s, %v; want STALE_AFTER_CLOSE", nf, err)
	}
	if d := f.dispatch("after-close"); d.Outcome != mcpsync.OutcomeNotActive {
		t.Errorf("allocation after close = %+v, want NOT_ACTIVE", d)
	}
	if got := f.count("resource_versions"); got != versions {
		t.Errorf("versions after close: %d, want %d", got, versions)
	}
	if got := f.count("invalidation_outbox"); got != outbox {
		t.Errorf("outbox rows after close: %d, want %d", got, outbox)
	}
	if sub := f.refresh(); sub.State != mcpsync.StateUnsubscribing || sub.LastAcceptedOrdinal != 2 {
		t.Errorf("after late answers: state %s watermark %d", sub.State, sub.LastAcceptedOrdinal)
	}
	var staleReceipts int
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'STALE_AFTER_CLOSE'`, f.sub.ID).Scan(&staleReceipts); err != nil {
		t.Fatal(err)
	}
	if staleReceipts != 2 {
		t.Errorf("STALE_AFTER_CLOSE receipts = %d, want 2 (content and not-found)", staleReceipts)
	}
	// Neither way out of closing leads back to ACTIVE (R20).
	if r, _ := f.st.MarkUnsubscribeUnknown(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch, "ack lost"); r.State != mcpsync.StateUnsubscribeUnknown {
		t.Errorf("mark unknown: %+v", r)
	}
	if r, _ := f.st.Activate(f.ctx, f.sub.ID, f.sub.Generation, f.sess.Generation); r.Outcome != mcpsync.OutcomeRefused {
		t.Errorf("activate from UNSUBSCRIBE_UNKNOWN: %+v, want REFUSED", r)
	}
	if r, _ := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch); r.State != mcpsync.StateClosed {
		t.Errorf("complete: %+v", r)
	}
}

// Replaying an accept returns its first outcome and writes nothing twice; a different
// response to an answered dispatch is a DUPLICATE; a request never dispatched is refused.
func TestAcceptIdempotencyAndRefusals(t *testing.T) {
	f := newFixture(t)
	d := f.dispatch("r1")
	first := f.accept(d.Ordinal, "r1", "v1")
	again := f.accept(d.Ordinal, "r1", "v1")
	if first.Outcome != mcpsync.OutcomeAccepted || again != first {
		t.Errorf("replay: first %+v, again %+v", first, again)
	}
	if dup := f.accept(d.Ordinal, "r1", "other body"); dup.Outcome != mcpsync.OutcomeDuplicate {
		t.Errorf("second response: %s, want DUPLICATE", dup.Outcome)
	}
	if nd := f.accept(d.Ordinal, "forged", "v1"); nd.Outcome != mcpsync.OutcomeNotDispatched {
		t.Errorf("forged request: %s, want NOT_DISPATCHED", nd.Outcome)
	}
	if nd := f.accept(99, "r99", "v1"); nd.Outcome != mcpsync.OutcomeNotDispatched {
		t.Errorf("unissued ordinal: %s, want NOT_DISPATCHED", nd.Outcome)
	}
	// Same digest again at a higher ordinal: revalidation, no new version or invalidation.
	d2 := f.dispatch("r2")
	if r := f.accept(d2.Ordinal, "r2", "v1"); r.Outcome != mcpsync.OutcomeRevalidated {
		t.Errorf("same content: %s, want REVALIDATED", r.Outcome)
	}
	if v, o := f.count("resource_versions"), f.count("invalidation_outbox"); v != 1 || o != 1 {
		t.Errorf("versions %d outbox %d, want 1 and 1", v, o)
	}
	// Replaying an allocation returns the same ordinal.
	if again := f.dispatch("r2"); again.Ordinal != d2.Ordinal {
		t.Errorf("allocation replay: ordinal %d, want %d", again.Ordinal, d2.Ordinal)
	}
	var receipts int
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(*) FROM receipts WHERE subscription_id = $1 AND read_ordinal IS NOT NULL`, f.sub.ID).Scan(&receipts); err != nil {
		t.Fatal(err)
	}
	if receipts != 7 { // two allocations, accepted, duplicate, two not-dispatched, revalidated
		t.Errorf("read receipts = %d, want 7", receipts)
	}
}

// R12: a new session generation fences every read of the old one, and the subscription has
// to be re-established before reads are issued again.
func TestNewSessionFencesOldReads(t *testing.T) {
	f := newFixture(t)
	old := f.dispatch("old-session")
	oldSess := f.sess
	f.openSession()
	if sub := f.refresh(); sub.State != mcpsync.StateReconciliationRequired {
		t.Fatalf("after new session: %s, want RECONCILIATION_REQUIRED", sub.State)
	}
	f.sess = oldSess
	if r := f.accept(old.Ordinal, "old-session", "old"); r.Outcome != mcpsync.OutcomeStale && r.Outcome != mcpsync.OutcomeOldSession {
		t.Errorf("old-session read: %s", r.Outcome)
	}
	if d := f.dispatch("old-again"); d.Outcome != mcpsync.OutcomeOldSession {
		t.Errorf("allocation on old session: %s, want OLD_SESSION", d.Outcome)
	}
	f.sess.Generation++
	f.activate()
	d := f.dispatch("new-session")
	if r := f.accept(d.Ordinal, "new-session", "new"); r.Outcome != mcpsync.OutcomeAccepted {
		t.Errorf("new-session read: %s, want ACCEPTED", r.Outcome)
	}
	// A notification stamped with the old generation is audited, never routed.
	targets, audit, err := f.st.RecordNotification(f.ctx, ledger.Notification{SourceID: f.src.ID, SessionGeneration: oldSess.Generation, Seq: 1, URI: testURI})
	if err != nil || len(targets) != 0 || audit != mcpsync.ReceiptNotificationOld {
		t.Errorf("old-session notification: targets %v audit %q err %v", targets, audit, err)
	}
	targets, _, err = f.st.RecordNotification(f.ctx, ledger.Notification{SourceID: f.src.ID, SessionGeneration: f.sess.Generation, Seq: 1, URI: testURI})
	if err != nil || len(targets) != 1 || targets[0].WorkflowID != "wf-1" {
		t.Errorf("current notification: %v %v", targets, err)
	}
}

// Reopening a CLOSED subscription starts the next generation and keeps the watermark, so no
// read of the earlier generation can be accepted (R12, R30).
func TestReopenKeepsWatermark(t *testing.T) {
	f := newFixture(t)
	d := f.dispatch("g1-late")
	f.accept(f.dispatch("g1").Ordinal, "g1", "v1")
	cr, _ := f.st.BeginUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, "test")
	f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch)
	oldGen := f.sub.Generation
	sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-1"})
	if err != nil {
		t.Fatal(err)
	}
	if sub.Generation != oldGen+1 || sub.State != mcpsync.StateDiscovered || sub.LastAcceptedOrdinal != 2 {
		t.Fatalf("reopened: generation %d state %s watermark %d", sub.Generation, sub.State, sub.LastAcceptedOrdinal)
	}
	f.sub = sub
	f.activate()
	r, err := f.st.AcceptResourceVersion(f.ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: oldGen,
		SessionGeneration: f.sess.Generation, URI: testURI, Ordinal: d.Ordinal, RequestID: "g1-late",
		Version: ledger.VersionInfo{Digest: ledger.Digest([]byte("x"))}})
	if err != nil || r.Outcome != mcpsync.OutcomeOldGeneration {
		t.Errorf("late read of the old generation: %+v %v, want OLD_GENERATION", r, err)
	}
}

func TestSourcesAndLeases(t *testing.T) {
	ctx := context.Background()
	st := ledger.New(pgtest.NewPool(t))
	spec := ledger.SourceSpec{Name: "s1", Transport: ledger.TransportHTTP, URL: "http://127.0.0.1:1/mcp"}
	if _, created, err := st.AddSource(ctx, spec); err != nil || !created {
		t.Fatalf("add: %v %v", created, err)
	}
	if _, created, err := st.AddSource(ctx, spec); err != nil || created {
		t.Errorf("add same again: created=%v err=%v, want no-op", created, err)
	}
	spec.URL = "http://127.0.0.1:2/mcp"
	if _, _, err := st.AddSource(ctx, spec); !errors.Is(err, ledger.ErrSourceExists) {
		t.Errorf("add different definition: %v, want ErrSourceExists", err)
	}
	for _, bad := range []ledger.SourceSpec{
		{Name: "", Transport: ledger.TransportStdio, Command: []string{"x"}},
		{Name: "a b", Transport: ledger.TransportStdio, Command: []string{"x"}},
		{Name: "x", Transport: ledger.TransportStdio},
		{Name: "x", Transport: ledger.TransportHTTP, URL: "ftp://x"},
		{Name: "x", Transport: "carrier-pigeon"},
	} {
		if _, _, err := st.AddSource(ctx, bad); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("AddSource(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
	a, err := st.ClaimSources(ctx, "host-a", time.Minute)
	if err != nil || len(a) != 1 {
		t.Fatalf("host-a claims: %v %v", a, err)
	}
	if b, _ := st.ClaimSources(ctx, "host-b", time.Minute); len(b) != 0 {
		t.Errorf("host-b claimed a held source: %v", b)
	}
	if _, _, err := st.OpenSession(ctx, a[0].ID, "host-b", ledger.CapabilityReceipt{}); !errors.Is(err, ledger.ErrLeaseLost) {
		t.Errorf("open session without lease: %v, want ErrLeaseLost", err)
	}
	if err := st.ReleaseSource(ctx, a[0].ID, "host-a"); err != nil {
		t.Fatal(err)
	}
	if b, _ := st.ClaimSources(ctx, "host-b", time.Minute); len(b) != 1 {
		t.Errorf("host-b after release: %v", b)
	}
}
