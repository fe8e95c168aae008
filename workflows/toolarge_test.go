package workflows_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A read over the source's size bound settles as TOO_LARGE (issue 14 item 6): the workflow
// keeps the previous version, says why in its state, and waits for the next notification or
// backstop instead of re-reading hot; the next notification's read within the bound is
// accepted and clears the reason.
func TestTooLargeReadWaitsForTheNextPulse(t *testing.T) {
	const maxBytes = 16
	h := newHarness(t)
	// The session-bound read as MCPRead answers it: over the bound, nothing is stored.
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in contract.ReadInput) (contract.ReadOutput, error) {
		h.mcp.mu.Lock()
		body := h.mcp.bodies[in.ServerURI]
		h.mcp.mu.Unlock()
		if len(body) > maxBytes {
			h.mcp.mu.Lock()
			h.mcp.reads = append(h.mcp.reads, in)
			h.mcp.mu.Unlock()
			return contract.ReadOutput{Found: true, TooLarge: true, Size: int64(len(body)), MaxBytes: maxBytes, ServerName: "fake"}, nil
		}
		return h.mcp.read(ctx, in)
	}, activity.RegisterOptions{Name: contract.ActMCPRead, DisableAlreadyRegisteredCheck: true})
	big := strings.Repeat("b", maxBytes+1)
	var during contract.StateView
	h.at(time.Minute, func() {
		h.mcp.set(big)
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
	})
	h.at(30*time.Minute, func() {
		v, err := h.env.QueryWorkflow(contract.QueryState)
		if err != nil {
			t.Errorf("query: %v", err)
			return
		}
		if err := v.Get(&during); err != nil {
			t.Error(err)
		}
	})
	h.at(31*time.Minute, func() {
		h.mcp.set("v3")
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 2, ServerURI: uri})
	})
	h.at(32*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
	v := h.run()
	sub := h.sub()
	if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification, mcpsync.ReasonNotification}, h.dispatchReasons(sub.ID)); diff != "" {
		t.Errorf("reads (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v3"))}, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if n := h.receiptKinds(sub.ID)[mcpsync.ReceiptKind(mcpsync.OutcomeTooLarge)]; n != 1 {
		t.Errorf("%d TOO_LARGE receipts, want 1", n)
	}
	if during.State != mcpsync.StateActive || !strings.HasPrefix(during.Reason, "read 2 too large: 17 bytes over the source's bound of 16") ||
		during.LastAcceptedDigest != ledger.Digest([]byte("v1")) {
		t.Errorf("between the reads: state %s, reason %q, digest %s", during.State, during.Reason, during.LastAcceptedDigest)
	}
	if v.Counters.Refused != 1 || v.Counters.Accepted != 2 {
		t.Errorf("counters: %+v", v.Counters)
	}
}
