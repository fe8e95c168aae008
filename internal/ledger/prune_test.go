package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// pruneHistory is the ledger TestPruneKeepsWhatFencesNeed builds: subscription A with six
// accepted ordinals (1-4, then 6 with a late, stale answer to 5), version 2 taken by a derived
// index, an outbox consumer that has passed the rows of 1-3 only and a read 7 in flight;
// subscription B closed after one version; two published catalogs (the older consumed once),
// a failed round, a notification that matched nothing, and blobs: orphaned by the stale read,
// stored again just now, and stored just now for an answer still to come.
type pruneHistory struct {
	f          *fixture
	b          ledger.Subscription
	digests    map[string]string // body -> digest
	reqs       map[int64]string  // A's ordinal -> request ID
	consumer   ledger.OutboxCursor
	newCatalog ledger.Catalog
	newRounds  []int64
}

func passVerdict(_ context.Context, _ ledger.Version, _ []byte) (ledger.GuardVerdict, []byte, error) {
	return ledger.GuardVerdict{Outcome: ledger.VerdictPass, Policy: "test"}, nil, nil
}

func buildPruneHistory(t *testing.T) *pruneHistory {
	f := newFixture(t)
	h := &pruneHistory{f: f, digests: map[string]string{}, reqs: map[int64]string{}}
	ctx, st := f.ctx, f.st
	acceptA := func(n int64) {
		t.Helper()
		body := fmt.Sprintf("v%d", n)
		if r := f.accept(n, h.reqs[n], body); r.Outcome != mcpsync.OutcomeAccepted {
			t.Fatalf("accept %d: %+v", n, r)
		}
		h.digests[body] = ledger.Digest([]byte(body))
	}
	for n := int64(1); n <= 4; n++ {
		h.reqs[n] = fmt.Sprintf("r%d", n)
		f.dispatch(h.reqs[n])
		acceptA(n)
		if n == 2 { // a derived index takes version 2 while it is the newest
			if _, err := st.Read(ctx, ledger.ReadRequest{Principal: "default", SourceID: f.src.ID, URI: testURI,
				PolicyID: "p", ForIndex: "idx"}, passVerdict); err != nil {
				t.Fatal(err)
			}
		}
	}
	h.reqs[5], h.reqs[6] = "r5", "r6"
	f.dispatch("r5")
	f.dispatch("r6")
	acceptA(6)
	if r := f.accept(5, "r5", "late"); r.Outcome != mcpsync.OutcomeStale {
		t.Fatalf("late answer to 5: %+v", r)
	}
	h.digests["late"] = ledger.Digest([]byte("late"))
	h.reqs[7] = "r7"
	f.dispatch("r7") // in flight

	// The consumer passes the outbox rows of ordinals 1-3.
	if _, err := st.EnsureConsumer(ctx, "c1", false); err != nil {
		t.Fatal(err)
	}
	for _, r := range readableOutbox(t, st, ledger.OutboxCursor{}, 5) {
		if r.ReadOrdinal != nil && *r.ReadOrdinal == 3 {
			h.consumer = r.Cursor
		}
	}
	if _, err := st.CommitConsumer(ctx, "c1", h.consumer, 3); err != nil {
		t.Fatal(err)
	}

	// Subscription B: one version, then closed.
	b, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "default", SourceID: f.src.ID, URI: "demo://notes/2",
		ServerURI: "demo://notes/2", WorkflowID: "wf-b"})
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
		if r, err := step(ctx, b.ID, b.Generation, f.sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
			t.Fatalf("activate B: %+v %v", r, err)
		}
	}
	d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: b.ID, Generation: b.Generation,
		SessionGeneration: f.sess.Generation, URI: "demo://notes/2", RequestID: "b1", Reason: mcpsync.ReasonInitial})
	if err != nil || d.Outcome != mcpsync.OutcomeAllocated {
		t.Fatalf("allocate B: %+v %v", d, err)
	}
	bd, err := st.PutBlob(ctx, []byte("b-v1"), "text/plain")
	if err != nil {
		t.Fatal(err)
	}
	h.digests["b-v1"] = bd
	if r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: b.ID, Generation: b.Generation,
		SessionGeneration: f.sess.Generation, URI: "demo://notes/2", Ordinal: d.Ordinal, RequestID: "b1",
		Version: ledger.VersionInfo{Digest: bd, Size: 4}}); err != nil || r.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("accept B: %+v %v", r, err)
	}
	cr, err := st.BeginUnsubscribe(ctx, b.ID, b.Generation, "test")
	if err != nil || cr.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("close B: %+v %v", cr, err)
	}
	if r, err := st.CompleteUnsubscribe(ctx, b.ID, b.Generation, cr.CloseEpoch); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
		t.Fatalf("complete B: %+v %v", r, err)
	}
	if h.b, err = st.SubscriptionByID(ctx, b.ID); err != nil {
		t.Fatal(err)
	}

	// Discovery: an older catalog (consumed once), a failed round, the newest catalog
	// (consumed once too).
	cf := &catFixture{t: t, ctx: ctx, st: st, src: f.src, gen: f.sess.Generation}
	// The older set is the newer one and one entry more: the two share every chunk of stored
	// entries but the last (migration 0018), which only the older catalog's rounds name.
	var newSet []string
	for i := range 2000 {
		newSet = append(newSet, fmt.Sprintf("demo://other/%04d", i))
	}
	oldSet := append(slices.Clone(newSet), "demo://other/9999")
	oldRun, oa, ob := cf.pair(spec{set: "a", uris: oldSet}, spec{set: "a", uris: oldSet})
	if _, err := cf.publish(oldRun, ledger.ProofSnapshotUnproven, oa.ID, ob.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ConsumeCatalog(ctx, ledger.CatalogRequest{Source: f.src.Name, Purpose: ledger.PurposeDisplay, Consumer: "old"}); err != nil {
		t.Fatal(err)
	}
	cf.round(cf.newRun(), 1, spec{failed: "CURSOR_CYCLE"})
	newRun, na, nb := cf.pair(spec{set: "b", uris: newSet}, spec{set: "b", uris: newSet})
	if h.newCatalog, err = cf.publish(newRun, ledger.ProofSnapshotUnproven, na.ID, nb.ID); err != nil {
		t.Fatal(err)
	}
	h.newRounds = []int64{na.ID, nb.ID}
	if _, err := st.ConsumeCatalog(ctx, ledger.CatalogRequest{Source: f.src.Name, Purpose: ledger.PurposeDisplay, Consumer: "new"}); err != nil {
		t.Fatal(err)
	}

	// A notification for a URI nobody subscribed to leaves an audit receipt.
	if _, audit, err := st.RecordNotification(ctx, ledger.Notification{SourceID: f.src.ID, SessionGeneration: f.sess.Generation,
		Seq: 1, URI: "demo://nobody", ServerURI: "demo://nobody"}); err != nil || audit != mcpsync.ReceiptNotificationUnknown {
		t.Fatalf("notification: %q %v", audit, err)
	}

	// Blobs: every blob so far is older than the blob grace; then one orphan is stored again
	// (a read of content seen before) and one new body waits for its answer.
	if _, err := st.Pool().Exec(ctx, `UPDATE content_blobs SET created_at = created_at - interval '2 hours'`); err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{"again", "inflight"} {
		if body == "again" {
			if _, err := st.PutBlob(ctx, []byte(body), ""); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Pool().Exec(ctx, `UPDATE content_blobs SET created_at = created_at - interval '2 hours' WHERE digest = $1`,
				ledger.Digest([]byte(body))); err != nil {
				t.Fatal(err)
			}
		}
		d, err := st.PutBlob(ctx, []byte(body), "")
		if err != nil {
			t.Fatal(err)
		}
		h.digests[body] = d
	}
	return h
}

// readableOutbox waits until at least n outbox rows past cur are readable (rows are held back
// while any older transaction of the cluster, another test's too, is still running) and
// returns them.
func readableOutbox(t *testing.T, st *ledger.Store, cur ledger.OutboxCursor, n int) []ledger.OutboxEvent {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rows, _, err := st.OutboxBatch(context.Background(), cur, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) >= n || time.Now().After(deadline) {
			return rows
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// strings returns the query's single text column, sorted.
func (h *pruneHistory) strings(t *testing.T, q string, args ...any) []string {
	t.Helper()
	rows, err := h.f.st.Pool().Query(h.f.ctx, q, args...)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// snapshot describes, per table, the rows the retention rules are about, as readable strings.
func (h *pruneHistory) snapshot(t *testing.T) map[string][]string {
	a, b := h.f.sub.ID, h.b.ID
	sub := func(id int64) string {
		if id == a {
			return "A"
		}
		return "B"
	}
	body := map[string]string{}
	for k, v := range h.digests {
		body[v] = k
	}
	named := func(list []string, f func(string) string) []string {
		out := make([]string, len(list))
		for i, s := range list {
			out[i] = f(s)
		}
		slices.Sort(out)
		return out
	}
	var subRef func(string) string = func(s string) string {
		var id int64
		var rest string
		if _, err := fmt.Sscanf(s, "%d %s", &id, &rest); err != nil {
			t.Fatalf("row %q: %v", s, err)
		}
		return sub(id) + " " + rest
	}
	return map[string][]string{
		"versions":   named(h.strings(t, `SELECT subscription_id || ' ' || read_ordinal FROM resource_versions`), subRef),
		"outbox":     named(h.strings(t, `SELECT subscription_id || ' ' || read_ordinal FROM invalidation_outbox`), subRef),
		"dispatches": named(h.strings(t, `SELECT subscription_id || ' ' || ordinal FROM read_dispatches`), subRef),
		"receipts": named(h.strings(t, `SELECT coalesce(subscription_id, 0) || ' ' || kind || coalesce('@' || read_ordinal, '')
			FROM receipts WHERE subscription_id IN ($1, $2) OR subscription_id IS NULL`, a, b), func(s string) string {
			if s[0] == '0' {
				return "- " + s[2:]
			}
			return subRef(s)
		}),
		"blobs":        named(h.strings(t, `SELECT digest FROM content_blobs`), func(d string) string { return body[d] }),
		"verdicts":     named(h.strings(t, `SELECT digest FROM guard_verdicts`), func(d string) string { return body[d] }),
		"lineage":      named(h.strings(t, `SELECT index_name || ' ' || read_ordinal FROM index_lineage`), func(s string) string { return s }),
		"catalogs":     h.strings(t, `SELECT id::text FROM catalogs`),
		"scans":        h.strings(t, `SELECT id::text FROM discovery_scans`),
		"entries":      h.strings(t, `SELECT DISTINCT scan_id::text FROM catalog_entry_batches`),
		"chunks":       h.strings(t, `SELECT digest FROM catalog_entry_chunks`),
		"consumptions": h.strings(t, `SELECT consumer FROM catalog_consumptions`),
	}
}

// subscriptionRows returns both subscription rows (watermarks, close fence, digests).
func (h *pruneHistory) subscriptionRows(t *testing.T) []ledger.Subscription {
	var out []ledger.Subscription
	for _, id := range []int64{h.f.sub.ID, h.b.ID} {
		s, err := h.f.st.SubscriptionByID(h.f.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	return out
}

// Issue 17 item 6: a prune with --older-than 0 deletes what no fence, consumer or derived
// index needs (consumed outbox rows and the versions they named, stale and superseded read
// receipts and dispatches, orphaned blobs, an older catalog with its rounds, a failed round,
// notification audits) and keeps the watermarks, the dispatch at the watermark and the read in
// flight, the close receipts, the version a derived index holds, the unconsumed outbox rows
// with their versions, the newest version and catalog, and every blob still named. A dry run
// counts exactly what the prune then deletes. Afterwards every fence still refuses what it
// refused, and the consumer reads on without a gap.
// Batch sizes 1 and 3 put a discovery round and the later round naming its entries in
// different statements and in the same one.
func TestPruneKeepsWhatFencesNeed(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) { testPruneKeepsWhatFencesNeed(t, batch) })
	}
}

func testPruneKeepsWhatFencesNeed(t *testing.T, batch int) {
	h := buildPruneHistory(t)
	f, ctx, st := h.f, h.f.ctx, h.f.st
	subsBefore := h.subscriptionRows(t)
	idx := func(ids ...int64) []string {
		var out []string
		for _, id := range ids {
			out = append(out, fmt.Sprint(id))
		}
		slices.Sort(out)
		return out
	}

	// The newest catalog's chunks stay; the older one's last chunk, named by no other round, goes.
	newChunks := h.strings(t, `SELECT chunk FROM catalog_entry_batches WHERE scan_id = $1`, h.newRounds[0])
	if all := h.strings(t, `SELECT digest FROM catalog_entry_chunks`); len(newChunks) < 2 || len(all) != len(newChunks)+1 {
		t.Fatalf("%d chunks stored, %d of them the newest catalog's: want it to hold at least 2, and the older catalog to add 1", len(all), len(newChunks))
	}
	dry, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: 0, DryRun: true, BatchSize: batch})
	if err != nil {
		t.Fatal(err)
	}
	before := h.snapshot(t)
	rep, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: 0, BatchSize: batch})
	if err != nil {
		t.Fatal(err)
	}
	after := h.snapshot(t)

	want := map[string][]string{
		// 2: lineage; 4: its outbox row is not consumed yet; 6: the newest; B 1: B's newest.
		"versions": {"A 2", "A 4", "A 6", "B 1"},
		"outbox":   {"A 4", "A 6", "B 1"},
		// A 6: the watermark's (and ConfirmTombstone's) dispatch; A 7: in flight; B 1: B's watermark.
		"dispatches": {"A 6", "A 7", "B 1"},
		"receipts": {"- PRUNED", "- SESSION_OPENED",
			"A ACCEPTED@6", "A ACTIVATED", "A ALLOCATED@6", "A ALLOCATED@7", "A SUBSCRIBING", "A SUBSCRIPTION_OPENED",
			"B ACCEPTED@1", "B ACTIVATED", "B ALLOCATED@1", "B CLOSE_FENCE@1", "B CLOSED", "B SUBSCRIBING", "B SUBSCRIPTION_OPENED"},
		// again: stored again just now; inflight: younger than the grace, not named yet.
		"blobs":        {"again", "b-v1", "inflight", "v2", "v4", "v6"},
		"verdicts":     {"v2"},
		"lineage":      {"idx 2"},
		"catalogs":     idx(h.newCatalog.ID),
		"scans":        idx(h.newRounds...),
		"entries":      idx(h.newRounds[0]), // round B reuses round A's entries (same set)
		"chunks":       newChunks,
		"consumptions": {"new"},
	}
	for _, l := range want {
		slices.Sort(l)
	}
	if diff := cmp.Diff(want, after); diff != "" {
		t.Errorf("rows after the prune (-want +got):\n%s\nbefore: %v", diff, before)
	}
	if diff := cmp.Diff(subsBefore, h.subscriptionRows(t)); diff != "" {
		t.Errorf("subscription rows changed (-before +after):\n%s", diff)
	}
	for _, name := range ledger.PruneTables {
		d, r := dry.Table(name), rep.Table(name)
		// Row sizes are measured on the row as the SELECT or the DELETE sees it, a few bytes
		// apart.
		if d.Deleted != r.Deleted || d.FreedBytes < r.FreedBytes*95/100 || d.FreedBytes > r.FreedBytes*105/100 {
			t.Errorf("%s: dry run counted %d rows / %d bytes, the prune deleted %d / %d", name, d.Deleted, d.FreedBytes, r.Deleted, r.FreedBytes)
		}
		if r.RowsAfter != r.RowsBefore-r.Deleted && name != "receipts" { // the prune adds its PRUNED receipt
			t.Errorf("%s: %d rows before, %d deleted, %d after", name, r.RowsBefore, r.Deleted, r.RowsAfter)
		}
		if d.RowsAfter != d.RowsBefore {
			t.Errorf("%s: the dry run changed the row count from %d to %d", name, d.RowsBefore, d.RowsAfter)
		}
	}
	if n := len(before["versions"]) - len(after["versions"]); rep.Table("resource_versions").Deleted != int64(n) {
		t.Errorf("report says %d versions deleted, the table lost %d", rep.Table("resource_versions").Deleted, n)
	}
	if got := rep.Table("content_blobs").FreedBytes; got <= 0 {
		t.Errorf("freed blob bytes = %d, want > 0", got)
	}
	if n, err := st.AuditCount(ctx, 0, "PRUNED"); err != nil || n != 1 {
		t.Errorf("PRUNED receipts = %d (%v), want 1", n, err)
	}

	// The fences still refuse what they refused: answers whose receipts and dispatches are
	// gone are not accepted, and the watermark does not move.
	for _, n := range []int64{3, 5} {
		body := fmt.Sprintf("v%d", n)
		if n == 5 {
			body = "late"
		}
		if r := f.accept(n, h.reqs[n], body); r.Outcome == mcpsync.OutcomeAccepted || r.Outcome == mcpsync.OutcomeRevalidated {
			t.Errorf("answer to pruned ordinal %d after the prune: %s, want a refusal", n, r.Outcome)
		}
	}
	if diff := cmp.Diff(subsBefore[0].LastAcceptedOrdinal, f.refresh().LastAcceptedOrdinal); diff != "" {
		t.Errorf("watermark moved (-want +got):\n%s", diff)
	}
	// The read in flight is accepted, and read back.
	if r := f.accept(7, "r7", "v7"); r.Outcome != mcpsync.OutcomeAccepted {
		t.Errorf("read in flight after the prune: %+v", r)
	}
	res, err := st.Read(ctx, ledger.ReadRequest{Principal: "default", SourceID: f.src.ID, URI: testURI, PolicyID: "p"}, passVerdict)
	if err != nil || string(res.Body) != "v7" {
		t.Errorf("read after the prune: %q %v", res.Body, err)
	}
	// The consumer reads on from its offset: nothing it has not passed is gone.
	var next []string
	for _, r := range readableOutbox(t, st, h.consumer, 4) {
		next = append(next, fmt.Sprintf("%s %d", map[bool]string{true: "A", false: "B"}[*r.SubscriptionID == f.sub.ID], *r.ReadOrdinal))
	}
	if diff := cmp.Diff([]string{"A 4", "A 6", "B 1", "A 7"}, next); diff != "" {
		t.Errorf("consumer's next rows (-want +got):\n%s", diff)
	}
	// A tombstone confirmation may still use the newest catalog.
	if _, err := st.CatalogByID(ctx, h.newCatalog.ID); err != nil {
		t.Errorf("newest catalog: %v", err)
	}
	inv, err := invariants.Check(ctx, st.Pool())
	if err != nil {
		t.Fatal(err)
	}
	if inv.Violations() != 0 {
		t.Errorf("R24 invariants after the prune: %s", inv)
	}
}

// The keep rules hold with age too: a prune whose cutoff is before everything deletes nothing.
func TestPruneKeepsYoungRows(t *testing.T) {
	h := buildPruneHistory(t)
	before := h.snapshot(t)
	rep, err := h.f.st.Prune(h.f.ctx, ledger.PruneOptions{OlderThan: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Only the blobs were made older than an hour; of them only the stale read's orphan is
	// named by nothing (v1 and v3 are named by versions younger than the cutoff, "again" was
	// stored again).
	want := before
	want["blobs"] = slices.DeleteFunc(slices.Clone(before["blobs"]), func(s string) bool { return s == "late" })
	want["receipts"] = append(slices.Clone(before["receipts"]), "- PRUNED")
	slices.Sort(want["receipts"])
	if diff := cmp.Diff(want, h.snapshot(t)); diff != "" {
		t.Errorf("rows after a prune of rows older than an hour (-want +got):\n%s", diff)
	}
	if got := rep.Deleted(); got != 1 {
		t.Errorf("deleted %d rows, want 1 (the stale read's orphaned blob)", got)
	}
}

func TestPruneRejectsNegativeAge(t *testing.T) {
	f := newFixture(t)
	for _, o := range []ledger.PruneOptions{{OlderThan: -time.Second}, {BatchSize: -1}} {
		if _, err := f.st.Prune(f.ctx, o); !errors.Is(err, ledger.ErrInvalid) {
			t.Errorf("Prune(%+v) = %v, want ErrInvalid", o, err)
		}
	}
}
