package workflows_test

import (
	"testing"
	"time"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Issue 14 item 5: `source update --backstop 60s` reaches a running subscription. The update
// raises the source's definition version and the host reconnects (a new session); when the
// subscription establishes itself on that session it adopts the source's new periods, so it
// re-reads every 60 s instead of at the period it was started with (here 1 h).
func TestSourceUpdateReachesRunningSubscription(t *testing.T) {
	h := newHarness(t)
	h.at(time.Minute, func() {
		if _, err := h.st.Pool().Exec(h.ctx, `UPDATE sources SET backstop_seconds = 60, definition_version = definition_version + 1 WHERE id = $1`, h.src.ID); err != nil {
			t.Error(err)
		}
		next, _, err := h.st.OpenSession(h.ctx, h.src.ID, hostQueue, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
		if err != nil {
			t.Error(err)
			return
		}
		h.signal(contract.SignalSessionChanged, contract.SessionChanged{Generation: next.Generation})
	})
	h.at(12*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	h.run()
	backstops := 0
	for _, r := range h.dispatchReasons(h.sub().ID) {
		if r == mcpsync.ReasonBackstop {
			backstops++
		}
	}
	// Jittered 60 s periods over ~10 minutes: several; the start input's 1 h: none.
	if backstops < 5 {
		t.Errorf("%d backstop reads in the 11 minutes after the update to a 60 s backstop, want at least 5", backstops)
	}
}
