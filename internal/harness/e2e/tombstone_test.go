package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R21: a resource deleted on the server answers not-found to the next read; the ACTIVE
// subscription moves to TOMBSTONE_PENDING through the ordinal fence, a reconciliation scan
// started after that read does not list it, and the ledger confirms the deletion: a tombstone
// version, its invalidation, the close fence, then CLOSED. get reports the deletion. In both
// eras: the not-found is the MCP -32002 on a 2025-11-25 session and a bare -32602 (only the
// code says not found, as 2026-07-28 allows) on a 2026-07-28 one.
func TestTombstoneConfirmedByListReconciliation(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			srv := s.startChaosEra("tomb", era, map[string]string{"demo://notes/1": "v1", "demo://notes/2": "w1"})
			notFoundOfEra(srv, era)
			s.mustCLI("subscribe", "tomb", "demo://notes/1")
			s.waitDigest("tomb", "demo://notes/1", ledger.Digest([]byte("v1")))
			assertEra(t, srv, era)
			srv.Delete("demo://notes/1")
			eventually(t, 60*time.Second, "deletion confirmed and closed", func() (bool, string) {
				sub := s.sub("tomb", "demo://notes/1")
				return sub.State == mcpsync.StateClosed, fmt.Sprintf("%s: %s", sub.State, sub.StateReason)
			})
			sub := s.sub("tomb", "demo://notes/1")
			v, err := s.st.LatestVersion(s.ctx, sub.ID)
			if err != nil {
				t.Fatal(err)
			}
			if v.Kind != "tombstone" {
				t.Errorf("latest version %+v, want a tombstone", v)
			}
			if n := s.count(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1 AND kind = 'tombstone'`, sub.ID); n != 1 {
				t.Errorf("%d tombstone invalidations, want 1", n)
			}
			if _, errOut, code := s.cli("get", "tomb", "demo://notes/1"); code != 3 {
				t.Errorf("get of a deleted resource: exit %d (%s), want 3", code, errOut)
			}
			s.checkInvariants()
		})
	}
}

// R21: a not-found answer for a resource that is still (or again) listed does not delete it:
// the reconciliation scan lists the URI, the subscription goes back to ACTIVE and re-reads (in
// both eras).
func TestTombstoneClearedWhenResourcePresent(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			s := newStack(t)
			srv := s.startChaosEra("back", era, map[string]string{"demo://notes/1": "v1"})
			notFoundOfEra(srv, era)
			s.mustCLI("subscribe", "back", "demo://notes/1")
			s.waitDigest("back", "demo://notes/1", ledger.Digest([]byte("v1")))
			assertEra(t, srv, era)
			srv.AddReadFault(chaosmcp.ReadFault{URI: "demo://notes/1", Nth: 1, Fail: chaosmcp.ReadNotFound})
			srv.Set("demo://notes/1", "v2", "text/plain")
			eventually(t, 60*time.Second, "back to ACTIVE with the new content", func() (bool, string) {
				sub := s.sub("back", "demo://notes/1")
				return sub.State == mcpsync.StateActive && sub.LastAcceptedDigest == ledger.Digest([]byte("v2")),
					fmt.Sprintf("%s: %s", sub.State, sub.StateReason)
			})
			sub := s.sub("back", "demo://notes/1")
			if n := s.count(`SELECT count(*) FROM receipts WHERE subscription_id = $1 AND kind = 'TOMBSTONE_PENDING'`, sub.ID); n != 1 {
				t.Errorf("%d TOMBSTONE_PENDING receipts, want 1", n)
			}
			if n := s.count(`SELECT count(*) FROM resource_versions WHERE subscription_id = $1 AND kind = 'tombstone'`, sub.ID); n != 0 {
				t.Errorf("a tombstone was written for a resource still listed")
			}
			reasons := s.readReasons(sub.ID)
			if reasons[len(reasons)-1] != mcpsync.ReasonReconcile {
				t.Errorf("reads %v: want a reconcile read after the tombstone was cleared", reasons)
			}
			s.checkInvariants()
		})
	}
}

// notFoundOfEra makes the server answer not-found as the era does: -32002 with data for
// 2025-11-25 (the default), a bare -32602 for 2026-07-28 (issue 13 item 6).
func notFoundOfEra(srv *chaosmcp.Server, era string) {
	if era == ledger.ProtocolModern {
		srv.SetNotFoundStyle(chaosmcp.NotFoundBare)
	}
}
