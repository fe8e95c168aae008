package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R21: a resource deleted (tombstone confirmed, subscription CLOSED) and then re-created with
// the very same bytes. A subscribe right after the close reopens the subscription in the next
// generation, and its first read is a new version with its invalidation, so get serves the
// content again, not the tombstone.
func TestResubscribeAfterTombstoneServesRecreatedContent(t *testing.T) {
	s := newStack(t)
	const uri, body = "demo://notes/1", "same bytes"
	srv := s.startChaosHTTP("again", map[string]string{uri: body, "demo://notes/2": "w1"})
	s.mustCLI("subscribe", "again", uri)
	s.waitDigest("again", uri, ledger.Digest([]byte(body)))
	srv.Delete(uri)
	eventually(t, 60*time.Second, "deletion confirmed and closed", func() (bool, string) {
		sub := s.sub("again", uri)
		return sub.State == mcpsync.StateClosed, fmt.Sprintf("%s: %s", sub.State, sub.StateReason)
	})
	closed := s.sub("again", uri)
	tomb, err := s.st.LatestVersion(s.ctx, closed.ID)
	if err != nil || tomb.Kind != "tombstone" {
		t.Fatalf("latest version before the re-creation: %+v %v, want the tombstone", tomb, err)
	}
	srv.Set(uri, body, "text/plain")

	s.mustCLI("subscribe", "again", uri)
	eventually(t, 30*time.Second, "the re-created resource accepted in the next generation", func() (bool, string) {
		sub := s.sub("again", uri)
		return sub.Generation == closed.Generation+1 && sub.State == mcpsync.StateActive && sub.LastAcceptedOrdinal > tomb.ReadOrdinal,
			fmt.Sprintf("generation %d %s, watermark %d (tombstone at %d)", sub.Generation, sub.State, sub.LastAcceptedOrdinal, tomb.ReadOrdinal)
	})
	sub := s.sub("again", uri)
	v, err := s.st.LatestVersion(s.ctx, sub.ID)
	if err != nil || v.Kind != "content" || v.Digest != ledger.Digest([]byte(body)) || v.Generation != sub.Generation {
		t.Errorf("latest version %+v (%v), want the content of generation %d", v, err, sub.Generation)
	}
	if n := s.count(`SELECT count(*) FROM invalidation_outbox WHERE subscription_id = $1 AND kind = 'version' AND read_ordinal = $2`, sub.ID, v.ReadOrdinal); n != 1 {
		t.Errorf("%d invalidations of the re-created version, want 1", n)
	}
	if out, errOut, code := s.cli("get", "again", uri); code != 0 || out != body {
		t.Errorf("get after the re-creation: exit %d, stdout %q, stderr %q; want exit 0 and %q", code, out, errOut, body)
	}
	s.checkInvariants()
}
