package workflows_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// fakeLocalRead stands in for activities.LocalRead on a worker that holds the session: it
// allocates, reads and settles through the real ledger activities, reading through fakeMCP
// (whose read records the call, so reads on the fast path are told apart from reads on the host
// queue by counting local ones here). mode picks what it does after allocating:
//   - "here": read and settle (the fast path);
//   - "unsettled": read, but leave the answer for the workflow to offer (ledger unreachable);
//   - "not-here": the session is on another worker;
//   - "handoff": the read did not answer within the handoff;
//   - "error": fail after allocating (the allocation's outcome unknown to the workflow).
type fakeLocalRead struct {
	led  *activities.Ledger
	mcp  *fakeMCP
	mode string

	mu    sync.Mutex
	local int // reads done here
}

func (f *fakeLocalRead) run(ctx context.Context, in contract.LocalReadInput) (contract.LocalReadOutput, error) {
	alloc, err := f.led.AllocateReadOrdinal(ctx, in.Allocate)
	if err != nil {
		return contract.LocalReadOutput{}, err
	}
	out := contract.LocalReadOutput{Alloc: alloc}
	if alloc.Outcome != mcpsync.OutcomeAllocated {
		return out, nil
	}
	switch f.mode {
	case "not-here":
		return out, nil
	case "handoff":
		out.Here, out.HandedOff = true, true
		return out, nil
	case "error":
		return contract.LocalReadOutput{}, errors.New("worker lost its ledger connection")
	}
	out.Here = true
	read, err := f.mcp.readBody(ctx, in.ServerURI)
	if err != nil {
		return contract.LocalReadOutput{}, err
	}
	f.mu.Lock()
	f.local++
	f.mu.Unlock()
	out.Read = read
	if f.mode == "unsettled" {
		return out, nil
	}
	a := in.Allocate
	id := mcpsync.ReadID{SubscriptionID: a.SubscriptionID, Generation: a.Generation, SessionGeneration: a.SessionGeneration,
		URI: a.URI, Ordinal: alloc.Ordinal, RequestID: a.RequestID}
	acc, err := f.led.AcceptResourceVersion(ctx, contract.AcceptInput{ReadID: id, Read: read})
	if err != nil {
		return contract.LocalReadOutput{}, err
	}
	out.Settled, out.Outcome, out.VersionID = true, acc.Outcome, acc.VersionID
	return out, nil
}

// useLocalRead replaces the harness's session-less fast path with f.
func (h *harness) useLocalRead(mode string) *fakeLocalRead {
	f := &fakeLocalRead{led: &activities.Ledger{Store: h.st}, mcp: h.mcp, mode: mode}
	h.env.RegisterActivityWithOptions(f.run, activity.RegisterOptions{Name: contract.ActLocalRead, DisableAlreadyRegisteredCheck: true})
	return f
}

// Issue 16 item 2: every way the fast path can end leads to the same accepted versions and
// dispatches as the regular path; only where the read ran differs. On the worker holding the
// session the read never goes to the host queue; without the session, after a handoff or a
// failed fast path it goes there under the ordinal the fast path allocated (one dispatch per
// read: a failed fast path's allocation is found again by its request ID, R14).
func TestLocalReadPaths(t *testing.T) {
	tests := []struct {
		mode                  string
		hostReads, localReads int
		readsLocal            int64
	}{
		{mode: "here", hostReads: 0, localReads: 2, readsLocal: 2},
		{mode: "unsettled", hostReads: 0, localReads: 2, readsLocal: 2},
		{mode: "not-here", hostReads: 2, localReads: 0, readsLocal: 0},
		{mode: "handoff", hostReads: 2, localReads: 0, readsLocal: 0},
		{mode: "error", hostReads: 2, localReads: 0, readsLocal: 0},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			h := newHarness(t)
			f := h.useLocalRead(tt.mode)
			h.at(time.Minute, func() {
				h.mcp.set("v2")
				h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
			})
			h.at(2*time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
			v := h.run()
			sub := h.sub()
			if v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
				t.Fatalf("state %s / ledger %s, want CLOSED", v.State, sub.State)
			}
			if diff := cmp.Diff([]string{ledger.Digest([]byte("v1")), ledger.Digest([]byte("v2"))}, h.versionDigests(sub.ID)); diff != "" {
				t.Errorf("accepted digests (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]mcpsync.ReadReason{mcpsync.ReasonInitial, mcpsync.ReasonNotification}, h.dispatchReasons(sub.ID)); diff != "" {
				t.Errorf("dispatches (-want +got):\n%s", diff)
			}
			type where struct {
				Host, Local       int
				ReadsLocal, Reads int64
				Accepted          int64
				LastAccepted      int64
			}
			want := where{Host: tt.hostReads, Local: tt.localReads, ReadsLocal: tt.readsLocal, Reads: 2, Accepted: 2, LastAccepted: 2}
			got := where{Host: len(h.mcp.reads), Local: f.local, ReadsLocal: v.Counters.ReadsLocal, Reads: v.Counters.Reads,
				Accepted: v.Counters.Accepted, LastAccepted: v.LastAcceptedOrdinal}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("where the reads ran (-want +got):\n%s", diff)
			}
			for _, r := range h.mcp.reads {
				if r.Ordinal == 0 || r.RequestID == "" {
					t.Errorf("host read without the fast path's ordinal and request ID: %+v", r)
				}
			}
		})
	}
}

// R18, R19 on the fast path: a read handed to the host queue because it did not answer within
// the handoff is overtaken by the close fence like any read in flight; its late content only
// leaves a STALE_AFTER_CLOSE receipt.
func TestLocalReadHandedOffReadOvertakenByClose(t *testing.T) {
	h := newHarness(t)
	h.useLocalRead("handoff")
	h.at(time.Minute, func() {
		h.mcp.set("v2")
		h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
		h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"})
	})
	v := h.run()
	sub := h.sub()
	if v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
		t.Fatalf("state %s / ledger %s, want CLOSED", v.State, sub.State)
	}
	if diff := cmp.Diff([]string{ledger.Digest([]byte("v1"))}, h.versionDigests(sub.ID)); diff != "" {
		t.Errorf("versions (-want +got):\n%s", diff)
	}
	if *sub.CloseOrdinal != 2 || sub.LastIssuedOrdinal != 2 {
		t.Errorf("close ordinal %d, last issued %d: the racing read (2) was dispatched before the fence", *sub.CloseOrdinal, sub.LastIssuedOrdinal)
	}
	if k := h.receiptKinds(sub.ID); k[mcpsync.ReceiptKind(mcpsync.OutcomeStaleAfterClose)] != 1 || k[mcpsync.ReceiptKind(mcpsync.OutcomeAccepted)] != 1 {
		t.Errorf("receipts %v: want one ACCEPTED and one STALE_AFTER_CLOSE", k)
	}
}
