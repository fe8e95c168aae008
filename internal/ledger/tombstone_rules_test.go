package ledger_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// catalogWith publishes a catalog of level from two fresh rounds listing the resources uris
// and the resource templates templates.
func (f *catFixture) catalogWith(level ledger.ProofLevel, uris, templates []string) ledger.Catalog {
	f.t.Helper()
	run := f.newRun()
	var basis []int64
	for n := 1; n <= 2; n++ {
		id, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{
			Key: fmt.Sprintf("%s/round-%d", run, n), Run: run, ScanWorkflowID: run, Round: n, SourceID: f.src.ID, SessionGeneration: f.gen,
		})
		if err != nil {
			f.t.Fatal(err)
		}
		var entries []ledger.ScanEntry
		for _, u := range uris {
			entries = append(entries, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u, Name: "r"})
		}
		for _, tpl := range templates {
			entries = append(entries, ledger.ScanEntry{Kind: ledger.EntryTemplate, URI: tpl, ServerURI: tpl, Name: "t"})
		}
		end := ledger.ScanEnd{ScanID: id, SetDigest: "sha256:" + strings.Join(uris, ",") + "|" + strings.Join(templates, ","),
			Progress:              ledger.ScanProgress{ResourcePages: 1, TemplatePages: 1, Resources: len(uris), Templates: len(templates)},
			ResourceCursorDigests: []string{"c1"}, SnapshotIDs: []string{"X"}, SnapshotPages: 2, SnapshotID: "X"}
		if _, err := f.st.EndScan(f.ctx, end, entries); err != nil {
			f.t.Fatal(err)
		}
		basis = append(basis, id)
	}
	c, err := f.publish(run, level, basis...)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// consumption is one catalog_consumptions row as the tests compare it.
type consumption struct {
	CatalogID    *int64
	Subscription *int64
	Purpose      string
	ProofLevel   *string
	Outcome      string
	Refusal      *string
}

func (f *catFixture) tombstoneConsumptions() []consumption {
	f.t.Helper()
	rows, err := f.st.Pool().Query(f.ctx, `SELECT catalog_id, subscription_id, purpose, proof_level, outcome, refusal
		FROM catalog_consumptions WHERE purpose = 'tombstone' ORDER BY id`)
	if err != nil {
		f.t.Fatal(err)
	}
	defer rows.Close()
	var out []consumption
	for rows.Next() {
		var c consumption
		if err := rows.Scan(&c.CatalogID, &c.Subscription, &c.Purpose, &c.ProofLevel, &c.Outcome, &c.Refusal); err != nil {
			f.t.Fatal(err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		f.t.Fatal(err)
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// R7, R21, R25: confirming a deletion from a catalog uses that catalog for a per-URI fact, and
// every such use is recorded as a consumption with purpose 'tombstone' in the confirmation's
// own statement: an accepted one with the catalog, its proof level and the subscription, a
// refused one with the refusal; replays record nothing more.
func TestTombstoneRecordsConsumption(t *testing.T) {
	tests := []struct {
		name  string
		uris  []string // the catalog's resources
		level ledger.ProofLevel
		want  func(sub ledger.Subscription, c ledger.Catalog) consumption
	}{
		{
			name: "confirmed from an unproven catalog", level: ledger.ProofSnapshotUnproven, uris: []string{"demo://other"},
			want: func(sub ledger.Subscription, c ledger.Catalog) consumption {
				return consumption{&c.ID, &sub.ID, "tombstone", ptr("SNAPSHOT_UNPROVEN"), "ACCEPTED", nil}
			},
		},
		{
			name: "confirmed from a proven catalog", level: ledger.ProofSnapshotProven, uris: []string{"demo://other"},
			want: func(sub ledger.Subscription, c ledger.Catalog) consumption {
				return consumption{&c.ID, &sub.ID, "tombstone", ptr("SNAPSHOT_PROVEN"), "ACCEPTED", nil}
			},
		},
		{
			name: "refused: the catalog lists the URI", level: ledger.ProofSnapshotUnproven, uris: []string{catURI},
			want: func(sub ledger.Subscription, c ledger.Catalog) consumption {
				return consumption{&c.ID, &sub.ID, "tombstone", ptr("SNAPSHOT_UNPROVEN"), "REFUSED", ptr(string(mcpsync.TombstoneResourcePresent))}
			},
		},
		{
			name: "refused: the catalog needs reconciliation", level: ledger.ProofReconciliationRequired,
			want: func(sub ledger.Subscription, c ledger.Catalog) consumption {
				return consumption{&c.ID, &sub.ID, "tombstone", ptr("RECONCILIATION_REQUIRED"), "REFUSED", ptr(string(mcpsync.TombstoneNotReconciled))}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, true)
			sub := f.pendingTombstone()
			c := f.catalog(tt.level, tt.uris...)
			req := ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID}
			for range 2 { // the second call is a replay: it records nothing more
				if _, err := f.st.ConfirmTombstone(f.ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			if diff := cmp.Diff([]consumption{tt.want(sub, c)}, f.tombstoneConsumptions()); diff != "" {
				t.Errorf("tombstone consumptions (-want +got):\n%s", diff)
			}
			gate, err := f.st.CatalogGateCounts(f.ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want(sub, c)
			got := [2]int64{gate.TombstoneAccepted, gate.TombstoneRefused}
			if exp := map[string][2]int64{"ACCEPTED": {1, 0}, "REFUSED": {0, 1}}[want.Outcome]; got != exp {
				t.Errorf("gate tombstone accepted, refused = %v, want %v", got, exp)
			}
		})
	}
}

// R21: a URI that one of the catalog's resource templates can produce never appears in a
// list, so a catalog without it proves nothing: ConfirmTombstone refuses TEMPLATE_URI unless
// the URI is also listed as a concrete resource (then RESOURCE_PRESENT).
func TestTemplateURINotConfirmedByListAbsence(t *testing.T) {
	tests := []struct {
		name      string
		uris      []string
		templates []string
		refusal   mcpsync.TombstoneRefusal // "": confirmed
	}{
		{name: "a level-1 template produces the URI", templates: []string{"demo://cat/{id}"}, refusal: mcpsync.TombstoneTemplateURI},
		{name: "an unproven catalog, template among others", uris: []string{"demo://other"},
			templates: []string{"demo://dog/{id}", "demo://{kind}/{id}"}, refusal: mcpsync.TombstoneTemplateURI},
		{name: "a reserved expansion produces the URI", templates: []string{"demo://{+path}"}, refusal: mcpsync.TombstoneTemplateURI},
		{name: "regular-expression characters in the template are literal", templates: []string{"demo://cat.{id}"}},
		{name: "a level-1 variable never spans a slash", templates: []string{"demo://{id}"}},
		{name: "no template produces the URI", uris: []string{"demo://other"}, templates: []string{"demo://dog/{id}"}},
		{name: "listed as a resource too", uris: []string{catURI}, templates: []string{"demo://cat/{id}"}, refusal: mcpsync.TombstoneResourcePresent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, true)
			sub := f.pendingTombstone()
			c := f.catalogWith(ledger.ProofSnapshotUnproven, tt.uris, tt.templates)
			res, err := f.st.ConfirmTombstone(f.ctx, ledger.ConfirmTombstoneRequest{SubscriptionID: sub.ID, Generation: sub.Generation, CatalogID: c.ID})
			if err != nil {
				t.Fatal(err)
			}
			after := f.recSub(sub.ID)
			tombstones := f.countRows(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1 AND kind = 'tombstone'`, sub.ID)
			type outcome struct {
				Outcome    mcpsync.Outcome
				Refusal    mcpsync.TombstoneRefusal
				State      mcpsync.State
				Tombstones int
			}
			want := outcome{mcpsync.OutcomeTransitioned, "", mcpsync.StateUnsubscribing, 1}
			if tt.refusal != "" {
				want = outcome{mcpsync.OutcomeRefused, tt.refusal, mcpsync.StateTombstonePending, 0}
			}
			if diff := cmp.Diff(want, outcome{res.Outcome, res.Refusal, after.State, tombstones}); diff != "" {
				t.Errorf("confirmation (-want +got):\n%s", diff)
			}
		})
	}
}

// R21: a TOMBSTONE_PENDING subscription whose URI only a template produces is confirmed by
// repeated not-found reads: ConfirmTombstoneByReads passes only after the required number of
// not-found probes on the pending read's generation and session, writes the tombstone with a
// TOMBSTONE_CONFIRMED receipt of reason 'repeated_not_found', and replays as ALREADY_DONE.
func TestConfirmTombstoneByReads(t *testing.T) {
	f := newCatFixture(t, true)
	sub := f.pendingTombstone()
	probe := func(req string, gen, sessionGen int64) mcpsync.Outcome {
		t.Helper()
		r, err := f.st.RecordTombstoneProbe(f.ctx, ledger.TombstoneProbeRequest{SubscriptionID: sub.ID, Generation: gen,
			SessionGeneration: sessionGen, RequestID: req})
		if err != nil {
			t.Fatal(err)
		}
		return r.Outcome
	}
	confirm := func() ledger.TombstoneResult {
		t.Helper()
		r, err := f.st.ConfirmTombstoneByReads(f.ctx, ledger.ConfirmByReadsRequest{SubscriptionID: sub.ID, Generation: sub.Generation})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if got := probe("probe-x", sub.Generation+1, f.gen); got != mcpsync.OutcomeRefused {
		t.Errorf("probe of another generation: %s, want REFUSED", got)
	}
	if got := probe("probe-y", sub.Generation, f.gen+1); got != mcpsync.OutcomeRefused {
		t.Errorf("probe on another session: %s, want REFUSED", got)
	}
	for i := 1; i < ledger.TombstoneProbesRequired; i++ {
		if got := probe(fmt.Sprintf("probe-%d", i), sub.Generation, f.gen); got != mcpsync.OutcomeAccepted {
			t.Fatalf("probe %d: %s, want ACCEPTED", i, got)
		}
		if got := probe(fmt.Sprintf("probe-%d", i), sub.Generation, f.gen); got != mcpsync.OutcomeAlreadyDone {
			t.Fatalf("probe %d replayed: %s, want ALREADY_DONE", i, got) // a replay does not count twice
		}
		if r := confirm(); r.Outcome != mcpsync.OutcomeRefused || r.Refusal != mcpsync.TombstoneTooFewReads {
			t.Fatalf("after %d probes: %+v, want refusal %s", i, r, mcpsync.TombstoneTooFewReads)
		}
	}
	if got := probe("probe-last", sub.Generation, f.gen); got != mcpsync.OutcomeAccepted {
		t.Fatalf("last probe: %s", got)
	}
	r := confirm()
	if r.Outcome != mcpsync.OutcomeTransitioned || r.ReadOrdinal != sub.LastAcceptedOrdinal || r.VersionID == 0 {
		t.Fatalf("confirm: %+v", r)
	}
	if again := confirm(); again.Outcome != mcpsync.OutcomeAlreadyDone || again.VersionID != r.VersionID {
		t.Errorf("replay: %+v, want ALREADY_DONE with version %d", again, r.VersionID)
	}
	after := f.recSub(sub.ID)
	if after.State != mcpsync.StateUnsubscribing {
		t.Errorf("state %s, want UNSUBSCRIBING", after.State)
	}
	if n := f.countRows(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'TOMBSTONE_CONFIRMED'
			AND detail->>'reason' = 'repeated_not_found'`, sub.ID); n != 1 {
		t.Errorf("%d TOMBSTONE_CONFIRMED receipts with reason repeated_not_found, want 1", n)
	}
	if n := f.countRows(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1 AND kind = 'tombstone'`, sub.ID); n != 1 {
		t.Errorf("%d tombstone invalidations, want 1", n)
	}
	if n := f.countRows(`SELECT count(*) FROM catalog_consumptions WHERE subscription_id = $1`, sub.ID); n != 0 {
		t.Errorf("%d catalog consumptions for a confirmation by reads, want 0", n)
	}
}

// A probe after the subscription left TOMBSTONE_PENDING (restored by a good read) is refused,
// and probes of an earlier pending period never count towards a later one.
func TestTombstoneProbesDoNotOutliveThePending(t *testing.T) {
	f := newCatFixture(t, true)
	sub := f.pendingTombstone()
	for i := range ledger.TombstoneProbesRequired {
		r, err := f.st.RecordTombstoneProbe(f.ctx, ledger.TombstoneProbeRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: f.gen, RequestID: fmt.Sprintf("old-%d", i)})
		if err != nil || r.Outcome != mcpsync.OutcomeAccepted {
			t.Fatalf("probe %d: %+v %v", i, r, err)
		}
	}
	if r, err := f.st.RestoreFromTombstone(f.ctx, sub.ID, sub.Generation, f.gen); err != nil || !r.Outcome.OK() {
		t.Fatalf("restore: %+v %v", r, err)
	}
	r, err := f.st.RecordTombstoneProbe(f.ctx, ledger.TombstoneProbeRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: f.gen, RequestID: "after-restore"})
	if err != nil || r.Outcome != mcpsync.OutcomeRefused {
		t.Errorf("probe on ACTIVE: %+v %v, want REFUSED", r, err)
	}
	f.recNotFound(sub, "read-again") // a new pending period
	c, err := f.st.ConfirmTombstoneByReads(f.ctx, ledger.ConfirmByReadsRequest{SubscriptionID: sub.ID, Generation: sub.Generation})
	if err != nil || c.Outcome != mcpsync.OutcomeRefused || c.Refusal != mcpsync.TombstoneTooFewReads {
		t.Errorf("confirm with the old period's probes: %+v %v, want refusal %s", c, err, mcpsync.TombstoneTooFewReads)
	}
}
