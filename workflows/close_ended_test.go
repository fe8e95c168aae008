package workflows_test

import (
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// R20: a close requested after the subscription's session ended (its end recorded before the
// close fence passed, as when a source is removed and its host drops the session) completes as
// soon as the unsubscribe finds the session gone: no server-side subscription outlives its
// session, and no later session end would close it, so it must not wait in
// UNSUBSCRIBE_UNKNOWN retrying a session that will never come back.
func TestCloseAfterSessionEndedCompletes(t *testing.T) {
	h := newHarness(t)
	stale := func() error {
		return temporal.NewNonRetryableApplicationError("source has no session on this host", contract.ErrTypeStaleSession, nil)
	}
	for range 50 {
		h.mcp.unsubscribeErrs = append(h.mcp.unsubscribeErrs, stale())
	}
	h.at(time.Minute, func() {
		if _, err := h.st.CloseSession(h.ctx, h.src.ID, h.sess.Generation, "source removed"); err != nil {
			t.Error(err)
		}
		h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"})
	})
	v := h.run()
	if v.State != mcpsync.StateClosed {
		t.Fatalf("final state %s, want CLOSED", v.State)
	}
	if got := len(h.mcp.unsubscribes); got != 1 {
		t.Errorf("unsubscribe calls: %d, want 1 (the close completes when the session is found gone)", got)
	}
	if n := h.receiptKinds(h.sub().ID)[mcpsync.ReceiptUnsubscribeUnknown]; n != 0 {
		t.Errorf("%d UNSUBSCRIBE_UNKNOWN receipts, want none", n)
	}
}
