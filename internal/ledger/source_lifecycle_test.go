package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// receiptsOfSource counts the receipts of kind left for source id.
func (f *fixture) receiptsOfSource(kind string) int {
	f.t.Helper()
	var n int
	if err := f.st.Pool().QueryRow(f.ctx, `SELECT count(*) FROM receipts WHERE kind = $1 AND source_id = $2`, kind, f.src.ID).Scan(&n); err != nil {
		f.t.Fatal(err)
	}
	return n
}

// Issue 14 item 5: an update replaces the definition as the next definition version, once per
// change, only from the version the caller read, never on a removed source.
func TestUpdateSource(t *testing.T) {
	f := newFixture(t)
	src, err := f.st.SourceByName(f.ctx, "demo")
	if err != nil {
		t.Fatal(err)
	}
	v0 := src.DefinitionVersion
	spec := src.SourceSpec
	spec.Transport, spec.Command, spec.URL = ledger.TransportHTTP, nil, "http://127.0.0.1:1/mcp"
	spec.BackstopSeconds = 90

	got, changed, err := f.st.UpdateSource(f.ctx, spec, v0)
	if err != nil || !changed {
		t.Fatalf("update: changed %v, %v", changed, err)
	}
	if got.DefinitionVersion != v0+1 || got.URL != spec.URL || got.Command != nil || got.Transport != ledger.TransportHTTP || got.BackstopSeconds != 90 {
		t.Errorf("after update: %+v", got)
	}
	if n := f.receiptsOfSource("SOURCE_UPDATED"); n != 1 {
		t.Errorf("%d SOURCE_UPDATED receipts, want 1", n)
	}

	// The same definition again: nothing changes, no new version.
	got, changed, err = f.st.UpdateSource(f.ctx, spec, v0+1)
	if err != nil || changed || got.DefinitionVersion != v0+1 {
		t.Errorf("same definition: changed %v, version %d, %v; want unchanged at %d", changed, got.DefinitionVersion, err, v0+1)
	}

	// A caller that read version v0 lost to the update above: nothing is written.
	stale := spec
	stale.PollSeconds = 5
	if _, _, err := f.st.UpdateSource(f.ctx, stale, v0); !errors.Is(err, ledger.ErrSourceChanged) {
		t.Errorf("update from a stale version: %v, want ErrSourceChanged", err)
	}
	if cur, _ := f.st.SourceByName(f.ctx, "demo"); cur.PollSeconds == 5 || cur.DefinitionVersion != v0+1 {
		t.Errorf("a stale update was written: %+v", cur)
	}

	unknown := spec
	unknown.Name = "nope"
	if _, _, err := f.st.UpdateSource(f.ctx, unknown, 0); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("update of an unknown source: %v, want ErrNotFound", err)
	}
	bad := spec
	bad.URL = "ftp://x"
	if _, _, err := f.st.UpdateSource(f.ctx, bad, v0+1); !errors.Is(err, ledger.ErrInvalid) {
		t.Errorf("update to a bad URL: %v, want ErrInvalid", err)
	}

	if _, _, err := f.st.RemoveSource(f.ctx, "demo"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.st.UpdateSource(f.ctx, stale, v0+1); !errors.Is(err, ledger.ErrSourceRemoved) {
		t.Errorf("update of a removed source: %v, want ErrSourceRemoved", err)
	}
}

// Two updates read at the same version: exactly one is written.
func TestUpdateSourceConcurrent(t *testing.T) {
	f := newFixture(t)
	src, err := f.st.SourceByName(f.ctx, "demo")
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			spec := src.SourceSpec
			spec.PollSeconds = 10 + i
			_, _, errs[i] = f.st.UpdateSource(f.ctx, spec, src.DefinitionVersion)
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ledger.ErrSourceChanged):
			t.Errorf("unexpected error %v", err)
		}
	}
	cur, _ := f.st.SourceByName(f.ctx, "demo")
	if won != 1 || cur.DefinitionVersion != src.DefinitionVersion+1 {
		t.Errorf("%d updates won, version %d; want 1 and %d", won, cur.DefinitionVersion, src.DefinitionVersion+1)
	}
}

// Removing marks the source once, lists what must pass the close fence, keeps every version,
// refuses new subscriptions, and the name can be added again as the next definition version.
func TestRemoveSource(t *testing.T) {
	f := newFixture(t)
	d := f.dispatch("r1")
	f.accept(d.Ordinal, "r1", "body one")

	src, open, err := f.st.RemoveSource(f.ctx, "demo")
	if err != nil {
		t.Fatal(err)
	}
	if src.RemovedAt == nil {
		t.Fatal("removed_at not set")
	}
	want := []ledger.OpenSubscription{{SubscriptionID: f.sub.ID, WorkflowID: "wf-1", Principal: "default", URI: testURI, State: mcpsync.StateActive}}
	if diff := cmp.Diff(want, open); diff != "" {
		t.Errorf("open subscriptions (-want +got):\n%s", diff)
	}
	again, open2, err := f.st.RemoveSource(f.ctx, "demo")
	if err != nil || !again.RemovedAt.Equal(*src.RemovedAt) || len(open2) != 1 {
		t.Errorf("second remove: removed at %v (first %v), %d open, %v", again.RemovedAt, src.RemovedAt, len(open2), err)
	}
	if n := f.receiptsOfSource("SOURCE_REMOVED"); n != 1 {
		t.Errorf("%d SOURCE_REMOVED receipts, want 1", n)
	}
	if _, _, err := f.st.RemoveSource(f.ctx, "nope"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("remove unknown: %v, want ErrNotFound", err)
	}

	// No new subscription opens on a removed source; the open one is still found.
	_, err = f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: "demo://other", ServerURI: "demo://other", WorkflowID: "wf-2"})
	if !errors.Is(err, ledger.ErrSourceRemoved) {
		t.Errorf("ensure on a removed source: %v, want ErrSourceRemoved", err)
	}
	if sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-1"}); err != nil || sub.ID != f.sub.ID {
		t.Errorf("ensure of the open subscription: %+v %v", sub, err)
	}

	// The close fence passes as usual; versions and receipts stay.
	cr := f.closeFence()
	if _, err := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch); err != nil {
		t.Fatal(err)
	}
	if _, open, err := f.st.RemoveSource(f.ctx, "demo"); err != nil || len(open) != 0 {
		t.Errorf("remove after close: %d open, %v", len(open), err)
	}
	if n := f.count("resource_versions"); n != 1 {
		t.Errorf("%d versions after remove, want 1", n)
	}

	// Added again: the same row, the next definition version, subscribing opens generation 2.
	spec := src.SourceSpec
	spec.Command = []string{"demo-server", "--v2"}
	back, err := f.st.ReaddSource(f.ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if back.ID != src.ID || back.RemovedAt != nil || back.DefinitionVersion != src.DefinitionVersion+1 {
		t.Errorf("re-added: %+v", back)
	}
	if _, err := f.st.ReaddSource(f.ctx, spec); !errors.Is(err, ledger.ErrSourceChanged) {
		t.Errorf("re-add of a source that is not removed: %v, want ErrSourceChanged", err)
	}
	sub, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-1"})
	if err != nil || sub.Generation != 2 {
		t.Errorf("subscribe after re-add: generation %d, %v; want 2", sub.Generation, err)
	}
}

// A subscription opening while its source is removed is either refused or listed by the
// removal: none is left open unseen (the source row lock of EnsureSubscription/RemoveSource).
func TestRemoveSourceRacingEnsure(t *testing.T) {
	f := newFixture(t)
	const n = 40
	var wg sync.WaitGroup
	var open []ledger.OpenSubscription
	var rmErr error
	for i := range n {
		wg.Go(func() {
			u := fmt.Sprintf("demo://race/%d", i)
			_, err := f.st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: u, ServerURI: u, WorkflowID: fmt.Sprintf("wf-race-%d", i)})
			if err != nil && !errors.Is(err, ledger.ErrSourceRemoved) {
				t.Errorf("ensure %d: %v", i, err)
			}
		})
		if i == n/2 {
			wg.Go(func() { _, open, rmErr = f.st.RemoveSource(f.ctx, "demo") })
		}
	}
	wg.Wait()
	if rmErr != nil {
		t.Fatal(rmErr)
	}
	listed := map[int64]bool{}
	for _, o := range open {
		listed[o.SubscriptionID] = true
	}
	all, err := f.st.ListSubscriptions(f.ctx, ledger.SubscriptionFilter{Source: "demo"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		if s.State != mcpsync.StateClosed && !listed[s.ID] {
			t.Errorf("subscription %d (%s) opened but not listed by the removal", s.ID, s.URI)
		}
	}
	t.Logf("%d subscriptions, %d listed by the removal", len(all), len(open))
}

// Content is purged only from a removed source whose every subscription is CLOSED; a body
// another source shares stays; versions and receipts stay.
func TestPurgeSourceContent(t *testing.T) {
	f := newFixture(t)
	d := f.dispatch("r1")
	f.accept(d.Ordinal, "r1", "only mine")
	d = f.dispatch("r2")
	f.accept(d.Ordinal, "r2", "shared body")
	mine, shared := ledger.Digest([]byte("only mine")), ledger.Digest([]byte("shared body"))

	// A second source with a version of the same bytes.
	other := newFixtureOn(t, f.st, "other")
	od := other.dispatch("o1")
	other.accept(od.Ordinal, "o1", "shared body")

	var refusal *ledger.PurgeRefusal
	if _, err := f.st.PurgeSourceContent(f.ctx, f.src.ID); !errors.As(err, &refusal) || !refusal.NotRemoved {
		t.Fatalf("purge of a source not removed: %v, want a NotRemoved refusal", err)
	}
	if _, _, err := f.st.RemoveSource(f.ctx, "demo"); err != nil {
		t.Fatal(err)
	}
	_, err := f.st.PurgeSourceContent(f.ctx, f.src.ID)
	if !errors.As(err, &refusal) || refusal.NotClosed != 1 || !errors.Is(err, ledger.ErrPurgeRefused) {
		t.Fatalf("purge with an open subscription: %v, want a refusal naming 1 not CLOSED", err)
	}
	if _, err := f.st.Blob(f.ctx, mine); err != nil {
		t.Fatalf("a refused purge deleted content: %v", err)
	}

	cr := f.closeFence()
	// UNSUBSCRIBING is past the fence but not CLOSED: still refused.
	if _, err := f.st.PurgeSourceContent(f.ctx, f.src.ID); !errors.As(err, &refusal) || refusal.NotClosed != 1 {
		t.Fatalf("purge while UNSUBSCRIBING: %v, want a refusal", err)
	}
	if _, err := f.st.CompleteUnsubscribe(f.ctx, f.sub.ID, f.sub.Generation, cr.CloseEpoch); err != nil {
		t.Fatal(err)
	}
	res, err := f.st.PurgeSourceContent(f.ctx, f.src.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ledger.PurgeResult{Blobs: 1, Bytes: int64(len("only mine"))}, res); diff != "" {
		t.Errorf("purge result (-want +got):\n%s", diff)
	}
	if _, err := f.st.Blob(f.ctx, mine); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("purged blob still readable: %v", err)
	}
	if _, err := f.st.Blob(f.ctx, shared); err != nil {
		t.Errorf("a blob another source shares was purged: %v", err)
	}
	if n := f.count("resource_versions"); n != 2 {
		t.Errorf("%d versions after purge, want 2 (kept)", n)
	}
	if n := f.receiptsOfSource("SOURCE_PURGED"); n != 1 {
		t.Errorf("%d SOURCE_PURGED receipts, want 1", n)
	}
	if res, err := f.st.PurgeSourceContent(f.ctx, f.src.ID); err != nil || res.Blobs != 0 {
		t.Errorf("purge again: %+v %v, want nothing more", res, err)
	}
}

// newFixtureOn is a fixture on st for one more stdio source called name: a live session and
// one ACTIVE subscription.
func newFixtureOn(t *testing.T, st *ledger.Store, name string) *fixture {
	t.Helper()
	f := &fixture{t: t, ctx: context.Background(), st: st, queue: "host-" + name}
	var err error
	f.src, _, err = st.AddSource(f.ctx, ledger.SourceSpec{Name: name, Transport: ledger.TransportStdio, Command: []string{"demo-server"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimSources(f.ctx, f.queue, time.Minute); err != nil {
		t.Fatal(err)
	}
	f.openSession()
	f.sub, err = st.EnsureSubscription(f.ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: testURI, ServerURI: testURI, WorkflowID: "wf-" + name})
	if err != nil {
		t.Fatal(err)
	}
	f.activate()
	return f
}
