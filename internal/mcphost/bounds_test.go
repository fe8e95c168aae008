package mcphost_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// gatedSignaler holds the first signal until release is closed, so the router stalls and the
// notification queue fills; every signal is recorded.
type gatedSignaler struct {
	*recorder
	release chan struct{}
	once    sync.Once
	held    chan struct{}
}

func (g *gatedSignaler) SignalWorkflow(ctx context.Context, workflowID, runID, name string, arg any) error {
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.held)
		select {
		case <-g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.recorder.SignalWorkflow(ctx, workflowID, runID, name, arg)
}

// gatedSource is a source on a fault-injecting HTTP server serving its URIs, whose host holds
// the first signal (gatedSignaler), with an ACTIVE subscription per URI on the live session;
// closedURI's subscription is closed.
type gatedSource struct {
	srv       *chaosmcp.Server
	src       ledger.Source
	sig       *gatedSignaler
	conn      *mcphost.Conn
	gen       int64
	subs      map[string]ledger.Subscription // by URI, closedURI's included
	serverSeq int                            // the server's number of the host's session
}

func (f *fixture) gatedSource(name, closedURI string, uris ...string) gatedSource {
	f.t.Helper()
	srv, hs := f.chaosHTTP(chaosmcp.Options{})
	for _, u := range uris {
		srv.Set(u, "0", "text/plain")
	}
	g := gatedSource{srv: srv, sig: &gatedSignaler{recorder: newRecorder(), release: make(chan struct{}), held: make(chan struct{})},
		subs: map[string]ledger.Subscription{}}
	g.src = f.addSource(ledger.SourceSpec{Name: name, Transport: ledger.TransportHTTP, URL: hs.URL})
	g.conn = f.waitSession(f.startHost("host-a", mcphost.Options{}, g.sig), g.src.ID, 0)
	g.gen = g.conn.Generation()
	for _, u := range uris {
		g.subs[u] = f.activeSub(g.src.ID, u, g.gen)
	}
	f.closeSub(g.subs[closedURI])
	g.serverSeq = srv.Sessions()[0].Seq
	return g
}

// A server flooding notifications faster than the host routes them fills the session's
// bounded queue (issue 14 item 6); what does not fit is not lost: one NOTIFICATION_OVERFLOW
// audit records it, and every live subscription of the source is signalled as notified at the
// last dropped sequence number, so each re-reads, while a closed one is not signalled.
func TestNotificationQueueOverflowLosesNothing(t *testing.T) {
	const queueCap, flood = 3, 60
	defer mcphost.SetNotificationQueueCap(queueCap)()
	f := newFixture(t)
	uris := []string{"demo://flood/a", "demo://flood/b", "demo://flood/c", "demo://flood/d"}
	const closedURI = "demo://flood/closed"
	g := f.gatedSource("flood", closedURI, append(slices.Clone(uris), closedURI)...)
	srv, src, sig, c, gen, subs, serverSeq := g.srv, g.src, g.sig, g.conn, g.gen, g.subs, g.serverSeq
	closed := subs[closedURI]

	// Notification 1 is routed and its signal held; 2..flood arrive meanwhile.
	lastSeqOf := map[string]int64{}
	for i := 1; i <= flood; i++ {
		u := uris[(i-1)%len(uris)]
		if i%10 == 0 {
			u = closedURI
		}
		if err := srv.SendUpdate(serverSeq, u); err != nil {
			t.Fatal(err)
		}
		lastSeqOf[u] = int64(i)
		if i == 1 {
			select {
			case <-sig.held:
			case <-time.After(20 * time.Second):
				t.Fatal("the first notification was never signalled")
			}
		}
	}
	waitFor(t, 20*time.Second, "the flood queued or overflowed", func() (bool, string) {
		q, d := c.QueueState()
		return int64(q)+d == flood-1, fmt.Sprintf("queued %d, overflow %d", q, d)
	})
	if q, d := c.QueueState(); q != queueCap || d != flood-1-queueCap {
		t.Fatalf("queue holds %d and the overflow %d, want %d and %d", q, d, queueCap, flood-1-queueCap)
	}
	close(sig.release)

	// Every live subscription ends up signalled at or after its last notification.
	lastSignalled := func(s []signal) map[string]int64 {
		out := map[string]int64{}
		for _, u := range updates(s) {
			out[u.WorkflowID] = max(out[u.WorkflowID], u.Seq)
		}
		return out
	}
	want := map[string]int64{}
	for _, u := range uris {
		want[subs[u].WorkflowID] = flood // the overflow's last sequence number covers them all
	}
	sig.wait(t, "every live subscription signalled after the overflow", func(s []signal) bool {
		m := lastSignalled(s)
		for _, u := range uris {
			if m[subs[u].WorkflowID] < lastSeqOf[u] {
				return false
			}
		}
		return len(m) >= len(uris)
	})
	time.Sleep(200 * time.Millisecond) // anything more would have come by now
	got := lastSignalled(sig.all())
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("last sequence number signalled per subscription (-want +got):\n%s", diff)
	}
	for _, u := range updates(sig.all()) {
		if u.WorkflowID == closed.WorkflowID {
			t.Errorf("the closed subscription was signalled: %+v", u)
		}
		if u.SessionGeneration != gen {
			t.Errorf("signal of generation %d, want %d", u.SessionGeneration, gen)
		}
	}
	for _, u := range uris {
		if s := f.sub(subs[u].ID); s.LastNotificationGen != gen || s.LastNotificationSeq != flood {
			t.Errorf("%s: ledger's last notification %d/%d, want %d/%d", u, s.LastNotificationGen, s.LastNotificationSeq, gen, flood)
		}
	}
	type overflowAudit struct {
		First, Last, Dropped int64
		Cap, Subscriptions   int
		Current              bool
	}
	var a overflowAudit
	var n int
	if err := f.store.Pool().QueryRow(f.ctx, `SELECT count(*) OVER (), (detail->>'first_seq')::bigint, (detail->>'last_seq')::bigint,
			(detail->>'dropped')::bigint, (detail->>'queue_cap')::int, (detail->>'subscriptions')::int, (detail->>'current')::bool
		FROM receipts WHERE source_id = $1 AND kind = $2`, src.ID, mcpsync.ReceiptNotificationOverflow).Scan(
		&n, &a.First, &a.Last, &a.Dropped, &a.Cap, &a.Subscriptions, &a.Current); err != nil {
		t.Fatalf("overflow audit: %v", err)
	}
	wantAudit := overflowAudit{First: 2 + queueCap, Last: flood, Dropped: flood - 1 - queueCap, Cap: queueCap, Subscriptions: len(uris), Current: true}
	if diff := cmp.Diff(wantAudit, a); n != 1 || diff != "" {
		t.Errorf("%d overflow audits; (-want +got):\n%s", n, diff)
	}
	_ = contract.SignalResourceUpdated
}

// A notification URI longer than ledger.MaxPayloadString never reaches a signal as such
// (issue 14 item 6): one that normalizes to a subscribed URI signals with the normalized form;
// one that stays long can match nothing and is audited as malformed under its bounded form
// (with the digest of the whole).
func TestLongNotificationURIsAreBounded(t *testing.T) {
	f := newFixture(t)
	const subscribed = "demo://long/x/a"
	s := f.subscribeURI(subscribed)
	srv, src, sig, sub := s.srv, s.src, s.sig, s.sub
	serverSeq := srv.Sessions()[0].Seq
	dotted := "demo://long/x/" + strings.Repeat("b/../", 20000) + "a" // 100 KiB, normalizes to subscribed
	if err := srv.SendUpdate(serverSeq, dotted); err != nil {
		t.Fatal(err)
	}
	got := updates(sig.wait(t, "signal of the dotted URI", func(s []signal) bool { return len(updates(s)) > 0 }))
	if len(got) != 1 || got[0].WorkflowID != sub.WorkflowID || got[0].ServerURI != subscribed {
		t.Errorf("signals: %d, first to %s with a URI of %d bytes", len(got), got[0].WorkflowID, len(got[0].ServerURI))
	}
	long := "demo://long/" + strings.Repeat("z", 100<<10)
	if err := srv.SendUpdate(serverSeq, long); err != nil {
		t.Fatal(err)
	}
	audits := f.waitAudits(src.ID, 1)
	if a := audits[0]; a.Kind != mcpsync.ReceiptNotificationMalformedURI || len(a.ServerURI) > ledger.MaxPayloadString ||
		a.ServerURI != ledger.Bounded(long, ledger.MaxPayloadString) {
		t.Errorf("audit of the long URI: %s with %d bytes", a.Kind, len(a.ServerURI))
	}
}
