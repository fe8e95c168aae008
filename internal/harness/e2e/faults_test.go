package e2e_test

// The fault-injection suite of SPEC R23: one named end-to-end test per fault, each on real
// workers, a real Temporal server, the Postgres ledger and the fault-injecting MCP server, and
// each ending with the R24 invariants checked from the ledger's own tables. (The discovery
// faults — multi-page change with the notification lost, circular cursor, forged snapshot ID
// — are in discovery_test.go; the cache hit after a permission revocation in
// consumers_test.go.)

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// receiptsOf returns the outcomes the ledger recorded for the answers to one read ordinal.
func (s *stack) receiptsOf(subID, ordinal int64) []mcpsync.Outcome {
	s.t.Helper()
	rows, err := s.st.Pool().Query(s.ctx, `SELECT kind FROM receipts WHERE subscription_id = $1 AND read_ordinal = $2
		AND kind IN ('ACCEPTED', 'REVALIDATED', 'STALE', 'STALE_AFTER_CLOSE', 'OLD_SESSION', 'OLD_GENERATION',
		             'NOT_DISPATCHED', 'DUPLICATE', 'TOMBSTONE_PENDING')
		ORDER BY id`, subID, ordinal)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var out []mcpsync.Outcome
	for rows.Next() {
		var k mcpsync.Outcome
		if err := rows.Scan(&k); err != nil {
			s.t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

func (s *stack) count(query string, args ...any) int {
	s.t.Helper()
	var n int
	if err := s.st.Pool().QueryRow(s.ctx, query, args...).Scan(&n); err != nil {
		s.t.Fatal(err)
	}
	return n
}

// Fault: out-of-order updated notifications. Notifications are held and delivered in reverse
// order, with duplicates; the subscription converges on the newest content and never accepts
// an older version after a newer one.
func TestFaultOutOfOrderNotifications(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			srv := s.startChaosEra("ooo", era, map[string]string{"demo://notes/1": "v0"})
			s.mustCLI("subscribe", "ooo", "demo://notes/1")
			s.waitDigest("ooo", "demo://notes/1", ledger.Digest([]byte("v0")))
			assertEra(t, srv, era)
			srv.HoldUpdates(true)
			srv.SetUpdateDuplicates(2)
			for i := 1; i <= 20; i++ {
				srv.Set("demo://notes/1", fmt.Sprintf("v%d", i), "text/plain")
			}
			srv.ReorderUpdates(20)
			srv.HoldUpdates(false)
			srv.FlushUpdates()
			sub := s.waitDigest("ooo", "demo://notes/1", ledger.Digest([]byte("v20")))
			vs, err := s.st.Versions(s.ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			for i := 1; i < len(vs); i++ {
				if vs[i].ReadOrdinal <= vs[i-1].ReadOrdinal {
					t.Errorf("version %d at ordinal %d after ordinal %d", i, vs[i].ReadOrdinal, vs[i-1].ReadOrdinal)
				}
			}
			s.checkInvariants()
		})
	}
}

// Fault: lost unsubscribe ACK. The server never answers resources/unsubscribe and keeps
// notifying: the subscription sits in UNSUBSCRIBE_UNKNOWN, silent locally (notifications are
// audited, nothing is read or accepted), retries on the same session, and closes once the
// server answers; it is never ACTIVE again (R20). 2025-11-25 only: a 2026-07-28 session has no
// resources/unsubscribe to answer or lose (the URI leaves the listen stream, which is
// re-opened without it, and nothing acknowledges the removal), so the fault has no meaning
// there; the source is pinned to 2025-11-25.
func TestFaultLostUnsubscribeAck(t *testing.T) {
	s := newStack(t)
	srv := s.startChaosEra("ack", ledger.ProtocolLegacy, map[string]string{"demo://notes/1": "v1"})
	s.mustCLI("subscribe", "ack", "demo://notes/1")
	s.waitDigest("ack", "demo://notes/1", ledger.Digest([]byte("v1")))
	assertEra(t, srv, ledger.ProtocolLegacy)
	srv.SetUnsubscribeMode(chaosmcp.UnsubscribeHang)
	if _, errOut, code := s.cli("unsubscribe", "ack", "demo://notes/1", "--wait", "0"); code != 0 {
		t.Fatalf("unsubscribe: %d %s", code, errOut)
	}
	var unknown ledger.Subscription
	eventually(t, 30*time.Second, string(mcpsync.StateUnsubscribeUnknown), func() (bool, string) {
		unknown = s.sub("ack", "demo://notes/1")
		return unknown.State == mcpsync.StateUnsubscribeUnknown, string(unknown.State)
	})
	srv.Set("demo://notes/1", "v2 while unknown", "text/plain")
	eventually(t, 30*time.Second, "notification audited after close", func() (bool, string) {
		n := s.count(`SELECT count(*) FROM receipts WHERE kind = $1 AND uri = $2`, mcpsync.ReceiptNotificationClosed, "demo://notes/1")
		return n > 0, fmt.Sprintf("%d audits", n)
	})
	srv.SetUnsubscribeMode(chaosmcp.UnsubscribeNormal)
	eventually(t, 60*time.Second, "CLOSED after the retry is answered", func() (bool, string) {
		sub := s.sub("ack", "demo://notes/1")
		return sub.State == mcpsync.StateClosed, string(sub.State) + ": " + sub.StateReason
	})
	closed := s.sub("ack", "demo://notes/1")
	if closed.LastIssuedOrdinal != unknown.LastIssuedOrdinal || closed.LastAcceptedDigest != ledger.Digest([]byte("v1")) {
		t.Errorf("reads after the close fence: issued %d→%d, digest %s", unknown.LastIssuedOrdinal, closed.LastIssuedOrdinal, closed.LastAcceptedDigest)
	}
	if n := s.count(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'ACTIVATED' AND id > (SELECT min(id) FROM receipts WHERE subscription_id = $1 AND kind = 'CLOSE_FENCE')`, closed.ID); n != 0 {
		t.Errorf("ACTIVE again after the close fence (%d activations)", n)
	}
	if st := srv.Stats(); st.UnsubscribeCalls < 2 {
		t.Errorf("%d unsubscribe calls, want a retry on the same session", st.UnsubscribeCalls)
	}
	s.checkInvariants()
}

// holdNextRead installs a gate on the next read of uri and returns it.
func holdNextRead(srv *chaosmcp.Server, uri string, fail chaosmcp.ReadFailure) *chaosmcp.Gate {
	g := chaosmcp.NewGate()
	srv.AddReadFault(chaosmcp.ReadFault{URI: uri, Nth: 1, Gate: g, Fail: fail})
	return g
}

// Fault: close racing read acceptance. Ten subscriptions each have a read in flight when
// unsubscribe and the read's answer race; whichever wins, nothing is accepted past a close
// fence, and every late answer leaves exactly one STALE_AFTER_CLOSE receipt.
func TestFaultCloseRacingReadAcceptance(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			const n = 10
			res := map[string]string{}
			for i := 0; i < n; i++ {
				res[fmt.Sprintf("demo://race/%d", i)] = "v1"
			}
			srv := s.startChaosEra("race", era, res)
			for u := range res {
				s.mustCLI("subscribe", "race", u)
				s.waitDigest("race", u, ledger.Digest([]byte("v1")))
			}
			assertEra(t, srv, era)
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				u := fmt.Sprintf("demo://race/%d", i)
				g := holdNextRead(srv, u, chaosmcp.ReadOK)
				srv.Set(u, "v2", "text/plain")
				<-g.Arrived()
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Release and unsubscribe race, with a different head start each time.
					time.Sleep(time.Duration(i) * 3 * time.Millisecond)
					go g.Release()
					s.cli("unsubscribe", "race", u, "--wait", "0")
				}()
			}
			wg.Wait()
			for u := range res {
				eventually(t, 60*time.Second, u+" closed and its read settled", func() (bool, string) {
					sub := s.sub("race", u)
					kinds := s.receiptsOf(sub.ID, sub.LastIssuedOrdinal)
					return sub.State == mcpsync.StateClosed && len(kinds) == 1, fmt.Sprintf("%s receipts %v", sub.State, kinds)
				})
				sub := s.sub("race", u)
				kinds := s.receiptsOf(sub.ID, sub.LastIssuedOrdinal)
				if kinds[0] != mcpsync.OutcomeAccepted && kinds[0] != mcpsync.OutcomeStaleAfterClose {
					t.Errorf("%s: the raced read ended %v", u, kinds)
				}
			}
			s.checkInvariants()
		})
	}
}

// Fault: late content and late not-found after CLOSED. A read is held at the server while the
// subscription closes completely; when it finally answers — with content, or with not-found —
// it only leaves a STALE_AFTER_CLOSE receipt: no version, no tombstone, no invalidation (R19).
func TestFaultLateAnswerAfterClosed(t *testing.T) {
	type lateCase struct {
		name, era string
		fail      chaosmcp.ReadFailure
	}
	var tests []lateCase
	for _, era := range eras {
		tests = append(tests, lateCase{era + "/content", era, chaosmcp.ReadOK}, lateCase{era + "/not found", era, chaosmcp.ReadNotFound})
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStack(t)
			srv := s.startChaosEra("late", tc.era, map[string]string{"demo://notes/1": "v1"})
			s.mustCLI("subscribe", "late", "demo://notes/1")
			s.waitDigest("late", "demo://notes/1", ledger.Digest([]byte("v1")))
			assertEra(t, srv, tc.era)
			g := holdNextRead(srv, "demo://notes/1", tc.fail)
			srv.Set("demo://notes/1", "v2", "text/plain")
			<-g.Arrived()
			s.mustCLI("unsubscribe", "late", "demo://notes/1")
			sub := s.sub("late", "demo://notes/1")
			if sub.State != mcpsync.StateClosed {
				t.Fatalf("state %s: the close waited for the held read", sub.State)
			}
			versions, outbox := s.count(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1`, sub.ID),
				s.count(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1`, sub.ID)
			g.Release()
			eventually(t, 30*time.Second, "late answer recorded", func() (bool, string) {
				kinds := s.receiptsOf(sub.ID, *sub.CloseOrdinal)
				return len(kinds) == 1 && kinds[0] == mcpsync.OutcomeStaleAfterClose, fmt.Sprintf("receipts of ordinal %d: %v", *sub.CloseOrdinal, kinds)
			})
			after := s.sub("late", "demo://notes/1")
			if after.State != mcpsync.StateClosed || after.LastAcceptedOrdinal != sub.LastAcceptedOrdinal {
				t.Errorf("after the late answer: %s watermark %d→%d", after.State, sub.LastAcceptedOrdinal, after.LastAcceptedOrdinal)
			}
			if v, o := s.count(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1`, sub.ID),
				s.count(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1`, sub.ID); v != versions || o != outbox {
				t.Errorf("versions %d→%d, invalidations %d→%d after CLOSED", versions, v, outbox, o)
			}
			s.checkInvariants()
		})
	}
}

// Fault: read A slower than read B. The workflow's read A is held at the server; a second
// reader of the same subscription (a cache revalidation, through the same fence: R17)
// allocates B, reads the newer content and is accepted; when A finally answers with the older
// content it only leaves a STALE receipt, and the newer version stays.
func TestFaultReadASlowerThanReadB(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			srv := s.startChaosEra("ab", era, map[string]string{"demo://notes/1": "v1"})
			s.mustCLI("subscribe", "ab", "demo://notes/1")
			s.waitDigest("ab", "demo://notes/1", ledger.Digest([]byte("v1")))
			assertEra(t, srv, era)
			g := holdNextRead(srv, "demo://notes/1", chaosmcp.ReadOK)
			srv.Set("demo://notes/1", "v2", "text/plain") // read A takes v2 and is held
			<-g.Arrived()
			srv.Set("demo://notes/1", "v3", "text/plain")
			sub := s.sub("ab", "demo://notes/1")
			ordA := sub.LastIssuedOrdinal

			// Read B: allocate, read on the live session through the session activity, accept.
			w := s.workers[0]
			sess := &activities.Session{Host: w.Host, Store: s.st}
			reqB := "revalidate/b"
			d, err := s.st.AllocateReadOrdinal(s.ctx, ledger.AllocateRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
				SessionGeneration: sub.SessionGeneration, URI: sub.URI, RequestID: reqB, Reason: mcpsync.ReasonRevalidate})
			if err != nil || d.Outcome != mcpsync.OutcomeAllocated || d.Ordinal != ordA+1 {
				t.Fatalf("allocate B: %+v %v", d, err)
			}
			out, err := sess.MCPRead(s.ctx, contract.ReadInput{SourceID: sub.SourceID, SessionGeneration: sub.SessionGeneration,
				ServerURI: sub.ServerURI, Ordinal: d.Ordinal, RequestID: reqB})
			if err != nil {
				t.Fatal(err)
			}
			acc, err := s.st.AcceptResourceVersion(s.ctx, ledger.AcceptRequest{SubscriptionID: sub.ID, Generation: sub.Generation,
				SessionGeneration: sub.SessionGeneration, URI: sub.URI, Ordinal: d.Ordinal, RequestID: reqB,
				Version: ledger.VersionInfo{MIMEType: out.MIMEType, Digest: out.Digest, Size: out.Size}})
			if err != nil || acc.Outcome != mcpsync.OutcomeAccepted {
				t.Fatalf("accept B: %+v %v", acc, err)
			}
			g.Release()
			eventually(t, 30*time.Second, "read A settled", func() (bool, string) {
				kinds := s.receiptsOf(sub.ID, ordA)
				return len(kinds) == 1, fmt.Sprintf("%v", kinds)
			})
			if kinds := s.receiptsOf(sub.ID, ordA); kinds[0] != mcpsync.OutcomeStale {
				t.Errorf("late read A: %v, want STALE", kinds)
			}
			// The workflow's follow-ups may revalidate v3 later; the accepted content is never v2.
			after := s.sub("ab", "demo://notes/1")
			if after.LastAcceptedDigest != ledger.Digest([]byte("v3")) {
				t.Errorf("accepted digest %s, want v3's", after.LastAcceptedDigest)
			}
			if n := s.count(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1 AND digest = $2`, sub.ID, ledger.Digest([]byte("v2"))); n != 0 {
				t.Errorf("the slow read's older content was accepted %d times", n)
			}
			s.checkInvariants()
		})
	}
}

// Fault: URI encoding confusion. The server notifies with percent-encoded unreserved
// characters and an upper-case scheme and host; the notification still reaches the
// subscription, and reads use the server's own spelling of the URI.
func TestFaultURIEncodingConfusion(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			const u = "demo://notes/~draft_1.v-2"
			srv := s.startChaosEra("enc", era, map[string]string{u: "v1"})
			s.mustCLI("subscribe", "enc", u)
			s.waitDigest("enc", u, ledger.Digest([]byte("v1")))
			assertEra(t, srv, era)
			srv.SetUpdateURIRewrite(func(x string) string { return chaosmcp.UpperSchemeHost(chaosmcp.EncodeUnreserved(x)) })
			srv.Set(u, "v2", "text/plain")
			s.waitDigest("enc", u, ledger.Digest([]byte("v2")))
			for read := range srv.Stats().Reads {
				if read != u {
					t.Errorf("read sent for %q, want only the server's %q", read, u)
				}
			}
			s.checkInvariants()
		})
	}
}

// Fault: notification from an old session. Host A's lease lapses while its session stays open
// (it never renews); host B takes the source and opens generation 2. A notification the
// server sends on A's old session is audited as NOTIFICATION_OLD_SESSION and causes no read;
// the same change notified on B's session is accepted. In 2026-07-28 A's old session is its
// listen stream, still open and still carrying the URI: a change is notified on A's stream and
// on B's; A's copy is audited at generation 1 and reads nothing, B's is read and accepted.
func TestFaultOldSessionNotification(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			s.stopWorkers() // replace the default worker with two tuned ones
			srv := newEraServer(t, "old", map[string]string{"demo://notes/1": "v1"})
			h := serveBothEras(t, srv, "127.0.0.1:0")
			s.mustCLI("source", "add", "old", "--url", h.URL, "--protocol", era)
			// Host A never renews. Its own watchdog would close its session at half the lease
			// (issue 12), so the lease is long and expired in the ledger directly, as a long
			// stall would.
			s.startWorker("host-a", func(o *mcphost.Options) { o.ClaimInterval, o.Lease = time.Hour, time.Hour })
			// Host A claims once (its claim interval is an hour): a round that skipped the
			// source because this subscribe held the row (fixed in ClaimLeases) left it without
			// a session for good. The wait is longer than the default 20 s for a loaded machine.
			s.mustCLI("subscribe", "old", "demo://notes/1", "--wait", "60s")
			s.waitDigest("old", "demo://notes/1", ledger.Digest([]byte("v1")))
			assertEra(t, srv, era)
			aSeq := 0
			if era == ledger.ProtocolLegacy {
				aSeq = srv.Sessions()[0].Seq
			}
			if _, err := s.st.Pool().Exec(s.ctx, `UPDATE sources SET lease_until = now() WHERE name = 'old'`); err != nil {
				t.Fatal(err)
			}
			s.startWorker("host-b")
			eventually(t, 30*time.Second, "host B took over with generation 2, re-subscribed and re-read", func() (bool, string) {
				sub := s.sub("old", "demo://notes/1")
				reasons := s.readReasons(sub.ID)
				settled := len(s.receiptsOf(sub.ID, sub.LastIssuedOrdinal)) > 0
				return sub.SessionGeneration == 2 && sub.State == mcpsync.StateActive && settled &&
						reasons[len(reasons)-1] == mcpsync.ReasonSessionChange,
					fmt.Sprintf("session %d %s, reads %v, last settled %v", sub.SessionGeneration, sub.State, reasons, settled)
			})
			before := s.sub("old", "demo://notes/1")
			audited := func(want func(int) bool) {
				t.Helper()
				eventually(t, 30*time.Second, "old-session notification audited", func() (bool, string) {
					n := s.count(`SELECT count(*) FROM receipts WHERE kind = $1 AND session_generation = 1`, mcpsync.ReceiptNotificationOld)
					return want(n), fmt.Sprintf("%d audits", n)
				})
			}
			if era == ledger.ProtocolLegacy {
				if err := srv.SendUpdate(aSeq, "demo://notes/1"); err != nil {
					t.Fatal(err)
				}
				audited(func(n int) bool { return n == 1 })
				if after := s.sub("old", "demo://notes/1"); after.LastIssuedOrdinal != before.LastIssuedOrdinal {
					t.Errorf("the old-session notification caused a read: issued %d→%d", before.LastIssuedOrdinal, after.LastIssuedOrdinal)
				}
				srv.Set("demo://notes/1", "v2", "text/plain")
				s.waitDigest("old", "demo://notes/1", ledger.Digest([]byte("v2")))
			} else {
				srv.Set("demo://notes/1", "v2", "text/plain")
				audited(func(n int) bool { return n >= 1 })
				after := s.waitDigest("old", "demo://notes/1", ledger.Digest([]byte("v2")))
				for _, d := range s.readsSince(after.ID, before.LastIssuedOrdinal) {
					if d.SessionGeneration != 2 {
						t.Errorf("read %+v on the old session", d)
					}
				}
			}
			s.checkInvariants()
		})
	}
}
