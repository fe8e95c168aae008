package workflows_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// fakeLocalSubscribe stands in for activities.LocalSubscribe: it records every call, and mode
// picks its answer:
//   - "here": subscribed on the session held here;
//   - "here-not-acknowledged": subscribed, the listen acknowledgement left the URI out;
//   - "not-here": the session is on another worker;
//   - "handoff": the subscribe did not answer within the handoff;
//   - "transient": failed with an error a retry may fix;
//   - "stale", "permanent": failed as MCPSubscribe fails on an ended session or a refusal.
type fakeLocalSubscribe struct {
	mode string

	mu    sync.Mutex
	calls []contract.LocalSubscribeInput
}

func (f *fakeLocalSubscribe) run(_ context.Context, in contract.LocalSubscribeInput) (contract.LocalSubscribeOutput, error) {
	f.mu.Lock()
	f.calls = append(f.calls, in)
	f.mu.Unlock()
	switch f.mode {
	case "here":
		return contract.LocalSubscribeOutput{Here: true}, nil
	case "here-not-acknowledged":
		return contract.LocalSubscribeOutput{Here: true, Subscribe: contract.SubscribeOutput{NotAcknowledged: true}}, nil
	case "handoff":
		return contract.LocalSubscribeOutput{Here: true, HandedOff: true}, nil
	case "transient":
		return contract.LocalSubscribeOutput{}, errors.New("subscribe: connection reset")
	case "stale":
		return contract.LocalSubscribeOutput{}, temporal.NewNonRetryableApplicationError("subscribe on generation 1, which ended", contract.ErrTypeStaleSession, nil)
	case "permanent":
		return contract.LocalSubscribeOutput{}, temporal.NewNonRetryableApplicationError("subscribe: invalid params", contract.ErrTypePermanent, nil)
	}
	return contract.LocalSubscribeOutput{}, nil
}

// useLocalSubscribe replaces the harness's session-less subscribe fast path with f.
func (h *harness) useLocalSubscribe(mode string) *fakeLocalSubscribe {
	f := &fakeLocalSubscribe{mode: mode}
	h.env.RegisterActivityWithOptions(f.run, activity.RegisterOptions{Name: contract.ActLocalSubscribe, DisableAlreadyRegisteredCheck: true})
	return f
}

// Issue 16 item 4: the subscribe fast path decides the subscribe only when it ran on the worker
// holding the session — subscribed (with the listen acknowledgement's answer, which Activate
// records), or failed as the host queue would have failed (ended session, refusal: the
// subscription is parked in RECONCILIATION_REQUIRED, R12). Every other answer (not here, handed
// off, a transient failure) sends the subscribe to the host queue as before. BeginSubscribe
// and Activate fence it either way: the ledger goes ACTIVE on the session's generation and the
// first version is accepted.
func TestLocalSubscribePaths(t *testing.T) {
	type outcome struct {
		LocalCalls, HostSubscribes int
		// At30s is the ledger state 30 s in, NotAcknowledged what Activate recorded.
		At30s           mcpsync.State
		NotAcknowledged bool
		Versions        []string
		ReasonMentions  bool // the machine's reason names the failed MCP subscribe
	}
	v1 := []string{ledger.Digest([]byte("v1"))}
	tests := []struct {
		mode string
		want outcome
	}{
		{mode: "here", want: outcome{LocalCalls: 1, HostSubscribes: 0, At30s: mcpsync.StateActive, Versions: v1}},
		{mode: "here-not-acknowledged", want: outcome{LocalCalls: 1, HostSubscribes: 0, At30s: mcpsync.StateActive, NotAcknowledged: true, Versions: v1}},
		{mode: "not-here", want: outcome{LocalCalls: 1, HostSubscribes: 1, At30s: mcpsync.StateActive, Versions: v1}},
		{mode: "handoff", want: outcome{LocalCalls: 1, HostSubscribes: 1, At30s: mcpsync.StateActive, Versions: v1}},
		{mode: "transient", want: outcome{LocalCalls: 1, HostSubscribes: 1, At30s: mcpsync.StateActive, Versions: v1}},
		{mode: "stale", want: outcome{LocalCalls: 4, HostSubscribes: 0, At30s: mcpsync.StateReconciliationRequired, ReasonMentions: true}},
		{mode: "permanent", want: outcome{LocalCalls: 4, HostSubscribes: 0, At30s: mcpsync.StateReconciliationRequired, ReasonMentions: true}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			h := newHarness(t)
			f := h.useLocalSubscribe(tt.mode)
			var got outcome
			h.at(30*time.Second, func() {
				s := h.sub()
				got.At30s, got.NotAcknowledged = s.State, s.NotAcknowledged
				f.mu.Lock()
				got.LocalCalls = len(f.calls)
				f.mu.Unlock()
				var v contract.StateView
				if enc, err := h.env.QueryWorkflow(contract.QueryState); err != nil {
					t.Errorf("query: %v", err)
				} else if err := enc.Get(&v); err != nil {
					t.Errorf("query: %v", err)
				}
				got.ReasonMentions = strings.Contains(v.Reason, "MCP subscribe")
			})
			h.at(time.Minute, func() { h.signal(contract.SignalUnsubscribe, contract.Unsubscribe{ID: "u1"}) })
			v := h.run()
			sub := h.sub()
			if v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
				t.Fatalf("state %s / ledger %s, want CLOSED", v.State, sub.State)
			}
			got.HostSubscribes = len(h.mcp.subscribes)
			got.Versions = h.versionDigests(sub.ID)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			for _, c := range f.calls {
				want := contract.SessionCall{SourceID: h.src.ID, SessionGeneration: h.sess.Generation, ServerURI: uri, SubscriptionID: sub.ID}
				if diff := cmp.Diff(want, c.Call); diff != "" || c.Handoff <= 0 {
					t.Errorf("fast-path call (-want +got), handoff %s:\n%s", c.Handoff, diff)
				}
			}
		})
	}
}
