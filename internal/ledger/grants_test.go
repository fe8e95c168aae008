package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// grantWorld is a source with a live session on which principals subscribe and versions are
// accepted, for the consumer side of the ledger: grants, reads, lineage, revocations.
type grantWorld struct {
	t    *testing.T
	ctx  context.Context
	st   *ledger.Store
	src  ledger.Source
	sess ledger.Session
	reqs int
}

func newGrantWorld(t *testing.T) *grantWorld {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &grantWorld{t: t, ctx: ctx, st: ledger.New(pgtest.NewPool(t))}
	w.src = w.addSource("docs")
	if _, err := w.st.ClaimSources(ctx, "host-g", time.Minute); err != nil {
		t.Fatal(err)
	}
	sess, _, err := w.st.OpenSession(ctx, w.src.ID, "host-g", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		t.Fatal(err)
	}
	w.sess = sess
	return w
}

func (w *grantWorld) addSource(name string) ledger.Source {
	w.t.Helper()
	src, _, err := w.st.AddSource(w.ctx, ledger.SourceSpec{Name: name, Transport: ledger.TransportStdio, Command: []string{"srv"}})
	if err != nil {
		w.t.Fatal(err)
	}
	return src
}

func (w *grantWorld) grant(principal string) {
	w.t.Helper()
	if _, _, err := w.st.GrantAccess(w.ctx, principal, w.src.ID, "test"); err != nil {
		w.t.Fatal(err)
	}
}

// subscribe makes an ACTIVE subscription of principal to uri.
func (w *grantWorld) subscribe(principal, uri string) ledger.Subscription {
	w.t.Helper()
	sub, err := w.st.EnsureSubscription(w.ctx, ledger.EnsureSpec{Principal: principal, SourceID: w.src.ID, URI: uri,
		ServerURI: uri, WorkflowID: "wf/" + principal + "/" + uri})
	if err != nil {
		w.t.Fatal(err)
	}
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){w.st.BeginSubscribe, w.st.Activate} {
		if r, err := step(w.ctx, sub.ID, sub.Generation, w.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			w.t.Fatalf("activate %s: %+v %v", uri, r, err)
		}
	}
	return sub
}

// publish accepts body as the next version of sub.
func (w *grantWorld) publish(sub ledger.Subscription, body, mimeType string) {
	w.t.Helper()
	w.reqs++
	req := fmt.Sprintf("req-%d", w.reqs)
	d, err := w.st.AllocateReadOrdinal(w.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: w.sess.Generation, URI: sub.URI, RequestID: req, Reason: mcpsync.ReasonNotification})
	if err != nil || d.Outcome != mcpsync.OutcomeAllocated {
		w.t.Fatalf("allocate: %+v %v", d, err)
	}
	digest, err := w.st.PutBlob(w.ctx, []byte(body), mimeType)
	if err != nil {
		w.t.Fatal(err)
	}
	r, err := w.st.AcceptResourceVersion(w.ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: w.sess.Generation, URI: sub.URI, Ordinal: d.Ordinal, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: mimeType, Digest: digest, Size: int64(len(body))}})
	if err != nil || r.Outcome != mcpsync.OutcomeAccepted {
		w.t.Fatalf("accept: %+v %v", r, err)
	}
}

// passAll is a guard that passes everything and counts its calls.
type passAll struct{ calls atomic.Int64 }

func (p *passAll) eval(_ context.Context, _ ledger.Version, _ []byte) (ledger.GuardVerdict, []byte, error) {
	p.calls.Add(1)
	return ledger.GuardVerdict{Policy: "pass-all", Outcome: ledger.VerdictPass}, nil, nil
}

func (w *grantWorld) read(principal, uri, index string, eval ledger.Evaluator) (ledger.ReadResult, error) {
	return w.st.Read(w.ctx, ledger.ReadRequest{Principal: principal, SourceID: w.src.ID, URI: uri, PolicyID: "test-policy", ForIndex: index}, eval)
}

func TestAddSourceGrantsDefault(t *testing.T) {
	w := newGrantWorld(t)
	other := w.addSource("other")
	gs, err := w.st.Grants(w.ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Principal, Source string
		Standing          bool
	}
	var got []row
	for _, g := range gs {
		got = append(got, row{g.Principal, g.SourceName, g.Standing()})
	}
	want := []row{{"default", "docs", true}, {"default", "other", true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("grants after adding two sources (-want +got):\n%s", diff)
	}
	tests := []struct {
		principal string
		source    int64
		want      error
	}{
		{"default", w.src.ID, nil},
		{"default", other.ID, nil},
		{"alice", w.src.ID, ledger.ErrNoGrant},
	}
	for _, tt := range tests {
		if err := w.st.CheckGrant(w.ctx, tt.principal, tt.source); !errors.Is(err, tt.want) {
			t.Errorf("CheckGrant(%s, %d) = %v, want %v", tt.principal, tt.source, err, tt.want)
		}
	}
}

func TestGrantRevokeGrantAgain(t *testing.T) {
	w := newGrantWorld(t)
	type step struct {
		name        string
		do          func() (created bool, err error)
		wantCreated bool
		wantEpoch   int64
		standing    bool
		wantErr     error
	}
	grant := func() (bool, error) {
		_, created, err := w.st.GrantAccess(w.ctx, "alice", w.src.ID, "test")
		return created, err
	}
	var revocation int64
	revoke := func() (bool, error) {
		rv, err := w.st.Revoke(w.ctx, ledger.RevokeRequest{Principal: "alice", SourceID: w.src.ID, Reason: "test"})
		revocation = rv.ID
		return false, err
	}
	steps := []step{
		{"first grant", grant, true, 1, true, nil},
		{"grant again is a no-op", grant, false, 1, true, nil},
		{"revoke", revoke, false, 1, false, nil},
		{"revoke again finds no standing grant", revoke, false, 1, false, ledger.ErrNoGrant},
		{"grant after revocation stands under the next epoch", grant, true, 2, true, nil},
	}
	for _, s := range steps {
		created, err := s.do()
		if !errors.Is(err, s.wantErr) {
			t.Fatalf("%s: error %v, want %v", s.name, err, s.wantErr)
		}
		g, gerr := w.st.GrantOf(w.ctx, "alice", w.src.ID)
		if gerr != nil {
			t.Fatalf("%s: %v", s.name, gerr)
		}
		if created != s.wantCreated || g.Epoch != s.wantEpoch || g.Standing() != s.standing {
			t.Errorf("%s: created %v epoch %d standing %v, want %v %d %v", s.name, created, g.Epoch, g.Standing(), s.wantCreated, s.wantEpoch, s.standing)
		}
		if s.name == "revoke" {
			var ge *ledger.GrantError
			if err := w.st.CheckGrant(w.ctx, "alice", w.src.ID); !errors.As(err, &ge) || ge.RevocationID != revocation {
				t.Errorf("CheckGrant after revoke = %v, want a GrantError naming revocation %d", err, revocation)
			}
		}
	}
	if _, _, err := w.st.GrantAccess(w.ctx, "alice", 999999, "test"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("grant on a missing source: %v, want ErrNotFound", err)
	}
}

func TestReadThroughGrantAndGuard(t *testing.T) {
	w := newGrantWorld(t)
	w.grant("alice")
	plain := w.subscribe("alice", "demo://plain")
	w.publish(plain, "old", "text/plain")
	w.publish(plain, "hello", "text/plain")
	w.publish(w.subscribe("alice", "demo://dirty"), "a\x1bb", "text/plain")
	w.publish(w.subscribe("alice", "demo://binary"), "\x00\x01", "application/octet-stream")
	w.subscribe("alice", "demo://empty")
	w.grant("bob")
	w.publish(w.subscribe("bob", "demo://plain"), "bob's", "text/plain")
	if _, err := w.st.Revoke(w.ctx, ledger.RevokeRequest{Principal: "bob", SourceID: w.src.ID, Reason: "test"}); err != nil {
		t.Fatal(err)
	}

	// A guard like internal/guard's: strip ESC, reject octet-stream.
	var calls atomic.Int64
	eval := func(_ context.Context, v ledger.Version, body []byte) (ledger.GuardVerdict, []byte, error) {
		calls.Add(1)
		switch {
		case v.MIMEType == "application/octet-stream":
			return ledger.GuardVerdict{Outcome: ledger.VerdictRejected, Reasons: []string{"mime"}}, nil, nil
		case string(body) == "a\x1bb":
			return ledger.GuardVerdict{Outcome: ledger.VerdictSanitized, Stripped: 1}, []byte("ab"), nil
		}
		return ledger.GuardVerdict{Outcome: ledger.VerdictPass}, nil, nil
	}
	tests := []struct {
		principal, uri string
		wantBody       string
		wantOutcome    string
		wantErr        error
	}{
		{"alice", "demo://plain", "hello", ledger.VerdictPass, nil},
		{"alice", "demo://dirty", "ab", ledger.VerdictSanitized, nil},
		{"alice", "demo://binary", "", ledger.VerdictRejected, ledger.ErrGuardRejected},
		{"alice", "demo://empty", "", "", ledger.ErrNotFound},
		{"alice", "demo://never", "", "", ledger.ErrNotFound},
		{"bob", "demo://plain", "", "", ledger.ErrNoGrant},
		{"default", "demo://plain", "", "", ledger.ErrNotFound}, // granted, but not subscribed
	}
	for round := 1; round <= 2; round++ {
		for _, tt := range tests {
			res, err := w.read(tt.principal, tt.uri, "", eval)
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("round %d: read %s %s: error %v, want %v", round, tt.principal, tt.uri, err, tt.wantErr)
				continue
			}
			outcome := ""
			if res.Verdict != nil {
				outcome = res.Verdict.Outcome
			}
			if string(res.Body) != tt.wantBody || outcome != tt.wantOutcome {
				t.Errorf("round %d: read %s %s: body %q verdict %q, want %q %q", round, tt.principal, tt.uri, res.Body, outcome, tt.wantBody, tt.wantOutcome)
			}
		}
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("guard ran %d times over two rounds of three versions, want 3 (verdicts are stored)", got)
	}
	res, err := w.read("alice", "demo://plain", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.State != mcpsync.StateActive || res.Refresh != "notify" || res.StalenessBoundSeconds != 36 || res.Version.ReadOrdinal != 2 {
		t.Errorf("freshness: state %s refresh %q bound %d ordinal %d, want ACTIVE notify 36 2", res.State, res.Refresh, res.StalenessBoundSeconds, res.Version.ReadOrdinal)
	}
}

// lineageKey is what a revocation must name per lineage entry.
type lineageKey struct {
	Index, Principal, URI string
	Revoked               bool
}

func (w *grantWorld) lineage() []lineageKey {
	w.t.Helper()
	ls, err := w.st.Lineage(w.ctx, ledger.LineageFilter{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []lineageKey
	for _, l := range ls {
		out = append(out, lineageKey{l.Index, l.Principal, l.URI, l.RevocationID != nil})
	}
	return out
}

func TestRevokeInvalidatesEveryIndexHoldingThePrincipalsContent(t *testing.T) {
	w := newGrantWorld(t)
	w.grant("alice")
	w.grant("bob")
	for _, u := range []string{"demo://a1", "demo://a2"} {
		w.publish(w.subscribe("alice", u), "alice "+u, "text/plain")
	}
	w.publish(w.subscribe("bob", "demo://b1"), "bob", "text/plain")
	closed := w.subscribe("alice", "demo://closed")
	w.publish(closed, "closed", "text/plain")
	g := &passAll{}
	takes := []struct{ index, principal, uri string }{
		{"idx-a", "alice", "demo://a1"}, {"idx-a", "alice", "demo://a2"}, {"idx-a", "alice", "demo://a2"},
		{"idx-b", "alice", "demo://a1"}, {"idx-b", "bob", "demo://b1"},
		{"idx-c", "bob", "demo://b1"},
		{"idx-d", "alice", "demo://closed"},
	}
	for _, tk := range takes {
		if _, err := w.read(tk.principal, tk.uri, tk.index, g.eval); err != nil {
			t.Fatalf("take %+v: %v", tk, err)
		}
	}
	// Cached content stays readable after unsubscribe (R10) and stays in the index's lineage.
	cr, err := w.st.BeginUnsubscribe(w.ctx, closed.ID, closed.Generation, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.st.CompleteUnsubscribe(w.ctx, closed.ID, closed.Generation, cr.CloseEpoch); err != nil {
		t.Fatal(err)
	}

	rv, err := w.st.Revoke(w.ctx, ledger.RevokeRequest{Principal: "alice", SourceID: w.src.ID, Reason: "left the team"})
	if err != nil {
		t.Fatal(err)
	}
	type ix struct {
		Index   string
		Entries int
		Key     string
	}
	var gotIx []ix
	for _, i := range rv.Indexes {
		gotIx = append(gotIx, ix{i.Index, i.Entries, i.OutboxKey})
	}
	k := func(name string) string { return fmt.Sprintf("revocation/%d/index/%s", rv.ID, name) }
	wantIx := []ix{{"idx-a", 2, k("idx-a")}, {"idx-b", 1, k("idx-b")}, {"idx-d", 1, k("idx-d")}}
	if diff := cmp.Diff(wantIx, gotIx); diff != "" {
		t.Errorf("indexes invalidated (-want +got):\n%s", diff)
	}
	var subs []string
	for _, s := range rv.Subscriptions {
		subs = append(subs, s.URI+" "+string(s.StateAtRevocation))
	}
	if diff := cmp.Diff([]string{"demo://a1 ACTIVE", "demo://a2 ACTIVE"}, subs); diff != "" {
		t.Errorf("subscriptions to close (-want +got):\n%s", diff)
	}
	wantLineage := []lineageKey{
		{"idx-a", "alice", "demo://a1", true}, {"idx-a", "alice", "demo://a2", true},
		{"idx-b", "alice", "demo://a1", true}, {"idx-b", "bob", "demo://b1", false},
		{"idx-c", "bob", "demo://b1", false}, {"idx-d", "alice", "demo://closed", true},
	}
	if diff := cmp.Diff(wantLineage, w.lineage()); diff != "" {
		t.Errorf("lineage after revocation (-want +got):\n%s", diff)
	}
	// The outbox carries one row per index plus the revocation, with the entries to drop.
	// Rows become readable once every older transaction in the cluster has ended.
	var keys []string
	for deadline := time.Now().Add(time.Minute); len(keys) < 4 && time.Now().Before(deadline); {
		rows, heldBack, err := w.st.OutboxBatch(w.ctx, ledger.OutboxCursor{}, 100)
		if err != nil {
			t.Fatal(err)
		}
		keys = nil
		for _, r := range rows {
			if r.Kind == ledger.OutboxIndexInvalidation || r.Kind == ledger.OutboxRevocation {
				keys = append(keys, r.IdempotencyKey)
			}
		}
		if heldBack {
			if _, err := w.st.Grants(w.ctx, ""); err != nil { // a round trip before reading again
				t.Fatal(err)
			}
		}
	}
	if diff := cmp.Diff([]string{k("idx-a"), k("idx-b"), k("idx-d"), rv.OutboxKey}, keys); diff != "" {
		t.Errorf("outbox rows of the revocation (-want +got):\n%s", diff)
	}
	// The trace is stored.
	stored, err := w.st.RevocationByID(w.ctx, rv.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(rv, stored, cmpopts.IgnoreFields(ledger.Revocation{}, "RevokedAt"),
		cmpopts.IgnoreFields(ledger.IndexInvalidation{}, "AckedConsumers")); diff != "" {
		t.Errorf("stored trace (-returned +stored):\n%s", diff)
	}
	// Not one hit for alice, on any URI, with or without an index; bob is unaffected.
	for _, u := range []string{"demo://a1", "demo://a2", "demo://closed"} {
		if res, err := w.read("alice", u, "idx-a", g.eval); !errors.Is(err, ledger.ErrNoGrant) || res.Body != nil {
			t.Errorf("alice reads %s after revocation: body %q err %v, want ErrNoGrant", u, res.Body, err)
		}
	}
	if res, err := w.read("bob", "demo://b1", "", g.eval); err != nil || string(res.Body) != "bob" {
		t.Errorf("bob reads after alice's revocation: %q %v", res.Body, err)
	}
	// A grant and a new take after the revocation make a new live entry; the old stays history.
	w.grant("alice")
	if _, err := w.read("alice", "demo://a1", "idx-a", g.eval); err != nil {
		t.Fatal(err)
	}
	rv2, err := w.st.Revoke(w.ctx, ledger.RevokeRequest{Principal: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rv2.Indexes) != 1 || rv2.Indexes[0].Index != "idx-a" || rv2.Indexes[0].Entries != 1 {
		t.Errorf("second revocation invalidated %+v, want idx-a with the one new entry", rv2.Indexes)
	}
	// The R24 check: zero on this ledger, one for an entry a writer left live behind a revocation.
	for _, tt := range []struct {
		forge string
		want  int
	}{
		{"", 0},
		{`UPDATE index_lineage SET revocation_id = NULL, invalidated_at = NULL WHERE index_name = 'idx-d'`, 1},
	} {
		if tt.forge != "" {
			if _, err := w.st.Pool().Exec(w.ctx, tt.forge); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := w.st.UntracedLineage(w.ctx); err != nil || n != tt.want {
			t.Errorf("UntracedLineage after %q = %d, %v; want %d", tt.forge, n, err, tt.want)
		}
	}
}

// R23 "cache hit after permission revocation", at the ledger: readers race a revocation.
// Every read that returned content must be traced by the revocation (its lineage entry is
// stamped), and no read that starts after Revoke returned gets a byte.
func TestReadsRacingRevocation(t *testing.T) {
	w := newGrantWorld(t)
	w.grant("alice")
	const uris = 5
	for i := range uris {
		w.publish(w.subscribe("alice", fmt.Sprintf("demo://r%d", i)), fmt.Sprintf("body %d", i), "text/plain")
	}
	g := &passAll{}
	if _, err := w.read("alice", "demo://r0", "", g.eval); err != nil { // store the verdicts up front
		t.Fatal(err)
	}
	var revoked atomic.Bool
	var hits, hitsAfter, denied atomic.Int64
	const readers = 6
	var hitsBy [readers]atomic.Int64 // each reader feeds its own index
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range readers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				after := revoked.Load()
				res, err := w.read("alice", fmt.Sprintf("demo://r%d", (r+i)%uris), fmt.Sprintf("idx-%d", r), g.eval)
				switch {
				case err == nil && res.Body != nil:
					hits.Add(1)
					hitsBy[r].Add(1)
					if after {
						hitsAfter.Add(1)
					}
				case errors.Is(err, ledger.ErrNoGrant):
					denied.Add(1)
				default:
					t.Errorf("read: %v", err)
					return
				}
			}
		})
	}
	// Let the readers run until some have hit, and every index holds an entry, then revoke
	// while they keep reading.
	everyIndexFed := func() bool {
		for i := range hitsBy {
			if hitsBy[i].Load() == 0 {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for (hits.Load() < 50 || !everyIndexFed()) && time.Now().Before(deadline) {
		if _, err := w.st.Grants(w.ctx, "alice"); err != nil { // a ledger round trip per check
			t.Fatal(err)
		}
	}
	rv, err := w.st.Revoke(w.ctx, ledger.RevokeRequest{Principal: "alice", SourceID: w.src.ID})
	revoked.Store(true)
	if err != nil {
		t.Fatal(err)
	}
	for denied.Load() < 50 && time.Now().Before(deadline) {
		if _, err := w.st.Grants(w.ctx, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if hits.Load() == 0 || denied.Load() == 0 {
		t.Fatalf("no race: %d hits, %d denials", hits.Load(), denied.Load())
	}
	if n := hitsAfter.Load(); n != 0 {
		t.Errorf("%d reads that started after the revocation returned content", n)
	}
	live, err := w.st.Lineage(w.ctx, ledger.LineageFilter{Principal: "alice", LiveOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Errorf("%d lineage entries of alice escaped the revocation: %+v", len(live), live)
	}
	if n, err := w.st.UntracedLineage(w.ctx); err != nil || n != 0 {
		t.Errorf("UntracedLineage = %d, %v; want 0", n, err)
	}
	stamped, err := w.st.Lineage(w.ctx, ledger.LineageFilter{RevocationID: rv.ID})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, ix := range rv.Indexes {
		total += ix.Entries
	}
	if total != len(stamped) || len(rv.Indexes) != readers {
		t.Errorf("revocation traced %d entries over %d indexes; %d entries are stamped with it (want equal, %d indexes)", total, len(rv.Indexes), len(stamped), readers)
	}
	t.Logf("%d hits before the revocation, %d denials", hits.Load(), denied.Load())
}
