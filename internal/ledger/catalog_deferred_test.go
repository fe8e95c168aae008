package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// deferredEntries are the entries every round of these tests lists.
func deferredEntries() []ledger.ScanEntry {
	var es []ledger.ScanEntry
	for i := range 1500 {
		u := fmt.Sprintf("demo://d/%05d", i)
		es = append(es, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u, Name: fmt.Sprint(i), MIMEType: "text/plain"})
	}
	return es
}

// begin opens round n of run.
func (f *catFixture) begin(run string, n int) int64 {
	f.t.Helper()
	id, _, err := f.st.BeginScan(f.ctx, ledger.ScanStart{Key: fmt.Sprintf("%s/round-%d", run, n), Run: run, ScanWorkflowID: run, Round: n, SourceID: f.src.ID, SessionGeneration: f.gen})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

func (f *catFixture) scan(id int64) ledger.Scan {
	f.t.Helper()
	sc, err := f.st.ScanByID(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return sc
}

// awaitLockWaiter returns once some session of the test database waits for a lock: the call
// started in the background has reached the pending round's row lock.
func (f *catFixture) awaitLockWaiter() {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for f.countRows(`SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`) == 0 {
		if time.Now().After(deadline) {
			f.t.Fatal("no session ever waited for the pending round's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// release ends pending's transaction when the test ends, if Store has not (a second Store
// fails at once and rolls back): an open transaction would keep the pool from closing.
func release(t *testing.T, pending *ledger.PendingEntries) {
	t.Cleanup(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = pending.Store(ctx)
	})
}

func entriesOf(t *testing.T, f *catFixture, c ledger.Catalog) []ledger.ScanEntry {
	t.Helper()
	got, err := f.st.CatalogEntries(f.ctx, c.ID)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// Round A's entries stored after its end (EndScanDeferred, issue 16 item 5): whatever reads
// them — round B's end, the catalog's publication — waits for them; if storing them fails,
// round B stores its own, and the catalog always carries the listed entries.
func TestCatalogDeferredEntries(t *testing.T) {
	want := deferredEntries()
	const digest = "sha256:deferred"
	tests := []struct {
		name string
		// after round A ended with its entries pending: what happens, and the round whose
		// entries the catalog must name (0: A, 1: B)
		storeFails bool
		holder     int
	}{
		{name: "round B waits for round A's entries and reuses them", holder: 0},
		{name: "round A's store fails: round B stores its own", storeFails: true, holder: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newCatFixture(t, false)
			run := f.newRun()
			a := f.begin(run, 1)
			_, pending, err := f.st.EndScanDeferred(f.ctx, ledger.ScanEnd{ScanID: a, SetDigest: digest}, want)
			if err != nil {
				t.Fatal(err)
			}
			if pending == nil {
				t.Fatal("EndScanDeferred of a new set returned no pending entries")
			}
			release(t, pending)
			if sc := f.scan(a); sc.Outcome != ledger.ScanComplete || sc.EntriesScanID != nil {
				t.Fatalf("round A before its entries are stored: %s, entries round %v; want COMPLETE, none", sc.Outcome, sc.EntriesScanID)
			}
			b := f.begin(run, 2)
			endB := make(chan error, 1)
			go func() {
				_, err := f.st.EndScan(context.Background(), ledger.ScanEnd{ScanID: b, SetDigest: digest}, want)
				endB <- err
			}()
			if tt.storeFails {
				cancelled, cancel := context.WithCancel(f.ctx)
				cancel()
				if err := pending.Store(cancelled); err == nil {
					t.Fatal("Store with a cancelled context succeeded")
				}
			} else {
				f.awaitLockWaiter() // round B's end waits for round A's entries
				if err := pending.Store(f.ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-endB; err != nil {
				t.Fatalf("round B's end: %v", err)
			}
			holder := []int64{a, b}[tt.holder]
			if got := f.scan(b).EntriesScanID; got == nil || *got != holder {
				t.Errorf("round B's entries round = %v, want %d", got, holder)
			}
			if n := f.countRows(`SELECT count(*) FROM catalog_entry_batches WHERE scan_id <> $1`, holder); n != 0 {
				t.Errorf("%d entry batches stored under another round than %d", n, holder)
			}
			c, err := f.publish(run, ledger.ProofSnapshotUnproven, a, b)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, entriesOf(t, f, c)); diff != "" {
				t.Errorf("catalog entries (-listed +published):\n%s", diff)
			}
		})
	}
}

// A RECONCILIATION_REQUIRED catalog on round A's entries waits for them while they are stored.
func TestCatalogDeferredEntriesReconciliationWaits(t *testing.T) {
	f := newCatFixture(t, false)
	want := deferredEntries()
	run := f.newRun()
	a := f.begin(run, 1)
	_, pending, err := f.st.EndScanDeferred(f.ctx, ledger.ScanEnd{ScanID: a, SetDigest: "sha256:recon"}, want)
	if err != nil || pending == nil {
		t.Fatalf("EndScanDeferred: pending %v, error %v", pending, err)
	}
	release(t, pending)
	published := make(chan ledger.Catalog, 1)
	failed := make(chan error, 1)
	go func() {
		c, err := f.st.PublishCatalog(context.Background(), ledger.PublishRequest{
			Key: run, ScanWorkflowID: run, SourceID: f.src.ID, SessionGeneration: f.gen, Level: ledger.ProofReconciliationRequired,
			Reason: "test", RoundsUsed: 1, EntriesScanID: a, Recheck: time.Minute,
		})
		if err != nil {
			failed <- err
			return
		}
		published <- c
	}()
	f.awaitLockWaiter()
	if err := pending.Store(f.ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		t.Fatal(err)
	case c := <-published:
		if c.EntriesScanID == nil || *c.EntriesScanID != a {
			t.Errorf("catalog's entries round = %v, want %d", c.EntriesScanID, a)
		}
		if diff := cmp.Diff(want, entriesOf(t, f, c)); diff != "" {
			t.Errorf("catalog entries (-listed +published):\n%s", diff)
		}
	}
}

// A set an earlier complete round already stored leaves nothing pending: the round points at
// the stored entries at once.
func TestCatalogDeferredEntriesKnownSet(t *testing.T) {
	f := newCatFixture(t, false)
	want := deferredEntries()
	first := f.newRun()
	a := f.begin(first, 1)
	if _, err := f.st.EndScan(f.ctx, ledger.ScanEnd{ScanID: a, SetDigest: "sha256:known"}, want); err != nil {
		t.Fatal(err)
	}
	again := f.begin(f.newRun(), 1)
	_, pending, err := f.st.EndScanDeferred(f.ctx, ledger.ScanEnd{ScanID: again, SetDigest: "sha256:known"}, want)
	if err != nil {
		t.Fatal(err)
	}
	if pending != nil {
		t.Error("EndScanDeferred of a stored set returned pending entries")
	}
	if got := f.scan(again).EntriesScanID; got == nil || *got != a {
		t.Errorf("entries round = %v, want %d", got, a)
	}
}
