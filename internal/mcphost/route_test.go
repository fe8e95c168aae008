package mcphost_test

import (
	"cmp"
	"fmt"
	"slices"
	"testing"
	"time"

	gocmp "github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// Notifications that queue while the router is busy are routed as a batch, recorded in one
// ledger statement (ledger.RecordNotifications), with the outcome each would have had routed
// alone: a URI's repeats merged into one signal at the last sequence number; another spelling
// of a URI already signalled left to that signal's read (R13) but recorded at its sequence
// number; an unknown URI, a malformed one and a closed subscription's each audited as such,
// nothing signalled for them (R12, R19).
func TestBatchRoutedAsOneByOne(t *testing.T) {
	f := newFixture(t)
	const held, a, b, closedURI = "demo://batch/held", "demo://batch/a", "demo://batch/b", "demo://batch/closed"
	g := f.gatedSource("batch", closedURI, held, a, b, closedURI)
	srv, src, sig, c, gen, subs, serverSeq := g.srv, g.src, g.sig, g.conn, g.gen, g.subs, g.serverSeq
	send := func(u string) {
		t.Helper()
		if err := srv.SendUpdate(serverSeq, u); err != nil {
			t.Fatal(err)
		}
	}

	// Notification 1 is routed and its signal held; 2..8 queue behind it as one batch.
	send(held)
	select {
	case <-sig.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the first notification was never signalled")
	}
	batch := []string{a, "demo://batch/nobody", b, "demo://notes/%zz", closedURI, a, "DEMO://BATCH/b"}
	for _, u := range batch {
		send(u)
	}
	waitFor(t, 20*time.Second, "the batch queued", func() (bool, string) {
		q, d := c.QueueState()
		return q == len(batch) && d == 0, fmt.Sprintf("queued %d, overflow %d", q, d)
	})
	close(sig.release)
	// A sentinel behind the batch, sent once the router has taken the batch off the queue (so
	// that it is not routed in the batch, where its lane could finish before the others): once
	// it is audited, the batch has been routed.
	waitFor(t, 20*time.Second, "the batch taken off the queue", func() (bool, string) {
		q, d := c.QueueState()
		return q == 0 && d == 0, fmt.Sprintf("queued %d, overflow %d", q, d)
	})
	send("demo://batch/sentinel")
	waitFor(t, 20*time.Second, "the sentinel audited", func() (bool, string) {
		all := f.audits(src.ID)
		return slices.ContainsFunc(all, func(a audit) bool { return a.URI == "demo://batch/sentinel" }), fmt.Sprintf("%+v", all)
	})

	upd := func(u string, seq int64, pulses int) update {
		return update{WorkflowID: subs[u].WorkflowID, ResourceUpdated: contract.ResourceUpdated{SessionGeneration: gen, Seq: seq, ServerURI: u, Pulses: pulses}}
	}
	wantSignals := []update{upd(held, 1, 1), upd(a, 7, 2), upd(b, 4, 1)}
	gotSignals := updates(sig.all())
	byWorkflow := func(x, y update) int { return cmp.Compare(x.WorkflowID, y.WorkflowID) }
	slices.SortFunc(wantSignals, byWorkflow)
	slices.SortFunc(gotSignals, byWorkflow)
	if diff := gocmp.Diff(wantSignals, gotSignals); diff != "" {
		t.Errorf("signals (-want +got):\n%s", diff)
	}
	wantAudits := []audit{
		{Kind: mcpsync.ReceiptNotificationUnknown, Gen: gen, URI: "demo://batch/nobody", ServerURI: "demo://batch/nobody", Seq: 3},
		{Kind: mcpsync.ReceiptNotificationMalformedURI, Gen: gen, URI: "demo://notes/%zz", ServerURI: "demo://notes/%zz", Seq: 5},
		{Kind: mcpsync.ReceiptNotificationClosed, Gen: gen, URI: closedURI, ServerURI: closedURI, Seq: 6},
		{Kind: mcpsync.ReceiptNotificationUnknown, Gen: gen, URI: "demo://batch/sentinel", ServerURI: "demo://batch/sentinel", Seq: 9},
	}
	gotAudits := f.audits(src.ID)
	bySeq := func(x, y audit) int { return cmp.Compare(x.Seq, y.Seq) }
	slices.SortFunc(gotAudits, bySeq)
	if diff := gocmp.Diff(wantAudits, gotAudits); diff != "" {
		t.Errorf("audits (-want +got):\n%s", diff)
	}
	for u, want := range map[string]int64{held: 1, a: 7, b: 8} {
		if s := f.sub(subs[u].ID); s.LastNotificationGen != gen || s.LastNotificationSeq != want {
			t.Errorf("%s: ledger's last notification %d/%d, want %d/%d", u, s.LastNotificationGen, s.LastNotificationSeq, gen, want)
		}
	}
}
