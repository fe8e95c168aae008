package activities_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Issue 16 item 2, the fast path on a real session and ledger: on the process holding the
// session it allocates, reads and accepts in one call (one resources/read), storing the body
// in the acceptance's transaction, or before it returns when the acceptance failed; elsewhere it only
// allocates; a read held past the handoff is left in flight and MCPRead of the same request
// joins it (still one resources/read), and when the close fence overtook it, its late answer
// is only STALE_AFTER_CLOSE (R19).
func TestLocalRead(t *testing.T) {
	const u = "demo://notes/1"
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	store := ledger.New(pgtest.NewPool(t))
	srv := chaosmcp.New(chaosmcp.Options{})
	t.Cleanup(func() { srv.Close() })
	srv.Set(u, "v1", "text/plain")
	hs := hostSource(ctx, t, store, ledger.SourceSpec{Name: "fast", Transport: ledger.TransportHTTP, URL: serveChaos(t, srv)}, true, "host-fast", zap.WarnLevel)
	src, h, gen := hs.src, hs.host, hs.gen
	sub := hs.activeSubscription(ctx, t, u, "wf-fast")
	led := &activities.Ledger{Store: store}
	sess := &activities.Session{Host: h, Store: store}
	here := &activities.LocalRead{Session: sess, Ledger: led}
	elsewhere := &activities.LocalRead{Session: &activities.Session{Store: store}, Ledger: led}
	input := func(reqID string, handoff time.Duration) contract.LocalReadInput {
		return contract.LocalReadInput{Allocate: contract.AllocateInput{SubscriptionID: sub.ID, Generation: sub.Generation,
			SessionGeneration: gen, URI: u, RequestID: reqID, Reason: mcpsync.ReasonNotification},
			SourceID: src.ID, ServerURI: u, Handoff: handoff}
	}
	// got is what a step came to: the fast path's answer and the server's reads of u so far.
	type got struct {
		Alloc            mcpsync.Outcome
		Ordinal          int64
		Here, HandedOff  bool
		Settled          bool
		Outcome          mcpsync.Outcome
		Digest           string
		ServerReads      int
		JoinedOutcome    mcpsync.Outcome // the joined read's acceptance, for a handed-off read
		JoinedReadDigest string
	}
	// held is the gate of the read being held (hold): released only once the fast path has
	// handed the read off, so the hand-off is observed rather than raced by a timer.
	var held *chaosmcp.Gate
	run := func(lr *activities.LocalRead, reqID string, handoff time.Duration, during func()) got {
		t.Helper()
		out, err := lr.LocalRead(ctx, input(reqID, handoff))
		if err != nil {
			t.Fatalf("%s: %v", reqID, err)
		}
		g := got{Alloc: out.Alloc.Outcome, Ordinal: out.Alloc.Ordinal, Here: out.Here, HandedOff: out.HandedOff,
			Settled: out.Settled, Outcome: out.Outcome, Digest: out.Read.Digest}
		if out.HandedOff {
			if during != nil {
				during()
			}
			if held != nil {
				held.Release()
				held = nil
			}
			read, err := sess.MCPRead(ctx, contract.ReadInput{SourceID: src.ID, SessionGeneration: gen, ServerURI: u,
				Ordinal: out.Alloc.Ordinal, RequestID: reqID})
			if err != nil {
				t.Fatalf("%s: joining the handed-off read: %v", reqID, err)
			}
			acc, err := led.AcceptResourceVersion(ctx, contract.AcceptInput{ReadID: mcpsync.ReadID{SubscriptionID: sub.ID,
				Generation: sub.Generation, SessionGeneration: gen, URI: u, Ordinal: out.Alloc.Ordinal, RequestID: reqID}, Read: read})
			if err != nil {
				t.Fatal(err)
			}
			g.JoinedOutcome, g.JoinedReadDigest = acc.Outcome, read.Digest
		}
		g.ServerReads = srv.Stats().Reads[u]
		return g
	}
	hold := func(body string) {
		srv.Set(u, body, "text/plain")
		held = chaosmcp.NewGate()
		srv.AddReadFault(chaosmcp.ReadFault{URI: u, Nth: 1, Gate: held, Fail: chaosmcp.ReadOK})
		// A fast path that never hands off would wait on the read: let it through late, so the
		// step fails its comparison instead of hanging the test.
		time.AfterFunc(time.Minute, held.Release)
	}

	// On the session's process: one call, one read, accepted.
	if diff := cmp.Diff(got{Alloc: mcpsync.OutcomeAllocated, Ordinal: 1, Here: true, Settled: true, Outcome: mcpsync.OutcomeAccepted,
		Digest: ledger.Digest([]byte("v1")), ServerReads: 1}, run(here, "r1", time.Minute, nil)); diff != "" {
		t.Errorf("here (-want +got):\n%s", diff)
	}
	// The acceptance fails (a trigger makes the ledger refuse the version's row): the answer
	// is left for the workflow to offer on the regular path, which names the body by its
	// digest only, so the body is stored before the fast path returns.
	srv.Set(u, "v2", "text/plain")
	if _, err := store.Pool().Exec(ctx, `CREATE FUNCTION fail_v2() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'test: version rows are refused'; END $$;
		CREATE TRIGGER fail_v2 BEFORE INSERT ON resource_versions FOR EACH ROW EXECUTE FUNCTION fail_v2()`); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(got{Alloc: mcpsync.OutcomeAllocated, Ordinal: 2, Here: true, Digest: ledger.Digest([]byte("v2")), ServerReads: 2},
		run(here, "r2", time.Minute, nil)); diff != "" {
		t.Errorf("acceptance failed (-want +got):\n%s", diff)
	}
	if _, err := store.Pool().Exec(ctx, `DROP TRIGGER fail_v2 ON resource_versions`); err != nil {
		t.Fatal(err)
	}
	if body, err := store.Blob(ctx, ledger.Digest([]byte("v2"))); err != nil || string(body) != "v2" {
		t.Errorf("body of the answer left to the workflow: %q, %v; want it stored", body, err)
	}
	acc, err := led.AcceptResourceVersion(ctx, contract.AcceptInput{ReadID: mcpsync.ReadID{SubscriptionID: sub.ID, Generation: sub.Generation,
		SessionGeneration: gen, URI: u, Ordinal: 2, RequestID: "r2"}, Read: contract.ReadOutput{Found: true, Digest: ledger.Digest([]byte("v2")),
		MIMEType: "text/plain", Size: 2}})
	if err != nil || acc.Outcome != mcpsync.OutcomeAccepted {
		t.Fatalf("offering the answer again: %+v %v", acc, err)
	}
	// Elsewhere: allocated, not read.
	if diff := cmp.Diff(got{Alloc: mcpsync.OutcomeAllocated, Ordinal: 3, ServerReads: 2}, run(elsewhere, "r2e", time.Minute, nil)); diff != "" {
		t.Errorf("elsewhere (-want +got):\n%s", diff)
	}
	// Held past the handoff: MCPRead joins the same resources/read, which is accepted.
	hold("v3")
	if diff := cmp.Diff(got{Alloc: mcpsync.OutcomeAllocated, Ordinal: 4, Here: true, HandedOff: true, ServerReads: 3,
		JoinedOutcome: mcpsync.OutcomeAccepted, JoinedReadDigest: ledger.Digest([]byte("v3"))}, run(here, "r3", 50*time.Millisecond, nil)); diff != "" {
		t.Errorf("held past the handoff (-want +got):\n%s", diff)
	}
	// Held past the handoff while the close fence passes: the late answer is STALE_AFTER_CLOSE.
	hold("v4")
	fence := func() {
		if _, err := store.BeginUnsubscribe(ctx, sub.ID, sub.Generation, "unsubscribed"); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(got{Alloc: mcpsync.OutcomeAllocated, Ordinal: 5, Here: true, HandedOff: true, ServerReads: 4,
		JoinedOutcome: mcpsync.OutcomeStaleAfterClose, JoinedReadDigest: ledger.Digest([]byte("v4"))}, run(here, "r4", 50*time.Millisecond, fence)); diff != "" {
		t.Errorf("held past the handoff, overtaken by the close fence (-want +got):\n%s", diff)
	}
	// After the fence: refused at allocation (R18), nothing read.
	if diff := cmp.Diff(got{Alloc: mcpsync.OutcomeNotActive, ServerReads: 4}, run(here, "r5", time.Minute, nil)); diff != "" {
		t.Errorf("after the fence (-want +got):\n%s", diff)
	}
	vs, err := store.Versions(ctx, sub.ID)
	if err != nil {
		t.Fatal(err)
	}
	var digests []string
	for _, v := range vs {
		digests = append(digests, v.Digest)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v2")), ledger.Digest([]byte("v3"))}, digests); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	// Every accepted version names a stored body: v1's stored in its acceptance's own
	// transaction, v2's before the fast path gave the answer back, v3's by the joined read.
	for i, v := range vs {
		if body, err := store.Blob(ctx, v.Digest); err != nil || string(body) != fmt.Sprintf("v%d", i+1) {
			t.Errorf("body of version %d: %q, %v; want %q", i+1, body, err, fmt.Sprintf("v%d", i+1))
		}
	}
}
