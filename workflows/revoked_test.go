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

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// R23, R29: the ledger refuses a read of a principal whose grant was revoked (REVOKED) at
// allocation, acceptance and not-found alike. Meeting that refusal is itself a close request
// with the revoke reason: the subscription passes the close fence and ends CLOSED with no
// Revoke signal ever sent (a lost signal must not leave it re-subscribing or reading), and it
// never subscribes again.
func TestRevokedOutcomeClosesWithoutSignal(t *testing.T) {
	tests := []struct {
		name string
		// revokeDuringRead revokes while the second read is on the server, so that the
		// refusal comes at acceptance (or not-found); otherwise the grant is revoked before
		// the second read is allocated.
		revokeDuringRead bool
		notFound         bool
		// fenceFailures is how many close fence attempts fail first (retried with backoff).
		fenceFailures int
		wantReads     int
	}{
		{name: "refused at allocate", wantReads: 1},
		{name: "refused at accept", revokeDuringRead: true, wantReads: 2},
		{name: "refused at not-found", revokeDuringRead: true, notFound: true, wantReads: 2},
		{name: "refused at allocate, close fence fails twice", fenceFailures: 2, wantReads: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			revoke := func() {
				if _, err := h.st.Revoke(h.ctx, ledger.RevokeRequest{Principal: "default", SourceID: h.src.ID, Reason: "test"}); err != nil {
					t.Error(err)
				}
			}
			var mu sync.Mutex
			reads := 0
			h.env.RegisterActivityWithOptions(func(ctx context.Context, in contract.ReadInput) (contract.ReadOutput, error) {
				out, err := h.mcp.read(ctx, in)
				mu.Lock()
				reads++
				second := reads == 2
				mu.Unlock()
				if second && tt.revokeDuringRead {
					revoke()
				}
				return out, err
			}, activity.RegisterOptions{Name: contract.ActMCPRead, DisableAlreadyRegisteredCheck: true})
			// A second subscribe means the refusal sent the subscription back to establishing:
			// stop there rather than loop.
			h.env.RegisterActivityWithOptions(func(ctx context.Context, c contract.SessionCall) error {
				if err := h.mcp.subscribe(ctx, c); err != nil {
					return err
				}
				h.mcp.mu.Lock()
				n := len(h.mcp.subscribes)
				h.mcp.mu.Unlock()
				if n > 1 {
					h.env.CancelWorkflow()
				}
				return nil
			}, activity.RegisterOptions{Name: contract.ActMCPSubscribe, DisableAlreadyRegisteredCheck: true})
			var fenceReasons []string
			realFence := (&activities.Ledger{Store: h.st}).BeginUnsubscribe
			h.env.RegisterActivityWithOptions(func(ctx context.Context, in contract.TransitionInput) (contract.TransitionOutput, error) {
				mu.Lock()
				fenceReasons = append(fenceReasons, in.Reason)
				fail := len(fenceReasons) <= tt.fenceFailures
				mu.Unlock()
				if fail {
					return contract.TransitionOutput{}, errInjected()
				}
				return realFence(ctx, in)
			}, activity.RegisterOptions{Name: contract.ActBeginUnsubscribe, DisableAlreadyRegisteredCheck: true})
			h.at(time.Minute, func() {
				if tt.revokeDuringRead {
					h.mcp.set("v2")
					h.mcp.mu.Lock()
					h.mcp.notFound = tt.notFound
					h.mcp.mu.Unlock()
				} else {
					revoke()
				}
				h.signal(contract.SignalResourceUpdated, contract.ResourceUpdated{SessionGeneration: h.sess.Generation, Seq: 1, ServerURI: uri})
			})
			// Were the refusal only settled, the subscription would stay ACTIVE: give up.
			h.at(2*time.Hour, h.env.CancelWorkflow)
			h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, h.input())
			if !h.env.IsWorkflowCompleted() {
				t.Fatal("workflow did not complete")
			}
			var v contract.StateView
			if err := h.env.GetWorkflowError(); err != nil {
				t.Errorf("workflow error (the REVOKED refusal did not close the subscription): %v", err)
			} else if err := h.env.GetWorkflowResult(&v); err != nil {
				t.Fatal(err)
			}
			sub := h.sub()
			if v.State != mcpsync.StateClosed || sub.State != mcpsync.StateClosed {
				t.Errorf("state %q / ledger %s, want CLOSED", v.State, sub.State)
			}
			if len(fenceReasons) != tt.fenceFailures+1 {
				t.Errorf("close fence attempts %d, want %d", len(fenceReasons), tt.fenceFailures+1)
			}
			for _, r := range fenceReasons {
				if !strings.HasPrefix(r, "revoked") {
					t.Errorf("close fence reason %q, want the revoke reason", r)
				}
			}
			if len(h.mcp.subscribes) != 1 {
				t.Errorf("MCP subscribes %d, want 1", len(h.mcp.subscribes))
			}
			if len(h.mcp.unsubscribes) != 1 {
				t.Errorf("MCP unsubscribes %d, want 1", len(h.mcp.unsubscribes))
			}
			if reads != tt.wantReads {
				t.Errorf("MCP reads %d, want %d", reads, tt.wantReads)
			}
			if got := h.versionDigests(sub.ID); len(got) != 1 {
				t.Errorf("versions %v, want only the one accepted before the revocation", got)
			}
			if k := h.receiptKinds(sub.ID); k[mcpsync.ReceiptKind(mcpsync.OutcomeRevoked)] != 1 {
				t.Errorf("receipts %v, want one REVOKED", k)
			}
		})
	}
}

// A run that finds its subscription's ledger row open while the principal holds no standing
// grant (R23) — `mcpsync reconcile` restarting a workflow that ended before its grant was
// revoked, or a first workflow task lost after its ledger transitions committed and retried
// after the revocation — closes the row through the close fence with the revoke reason, on
// the session it lives on, and never subscribes or reads. Without an open row of its own it
// fails as before: there is nothing to close, and nothing opens without a grant.
func TestUngrantedOpenSubscriptionCloses(t *testing.T) {
	tests := []struct {
		name string
		// before brings the row to the state the ended run left it in; nil: no row.
		before           func(t *testing.T, h *harness)
		wantErr          bool
		wantState        mcpsync.State
		wantUnsubscribes int
		wantReasonPrefix string
	}{
		{name: "active on the live session", before: endedActive, wantState: mcpsync.StateClosed, wantUnsubscribes: 1,
			wantReasonPrefix: "revoked: no standing grant"},
		{name: "past the close fence already", before: func(t *testing.T, h *harness) {
			endedActive(t, h)
			s := h.sub()
			if _, err := h.st.BeginUnsubscribe(h.ctx, s.ID, s.Generation, "unsubscribed"); err != nil {
				t.Fatal(err)
			}
		}, wantState: mcpsync.StateClosed, wantUnsubscribes: 1, wantReasonPrefix: "unsubscribed"},
		{name: "never subscribed", before: func(t *testing.T, h *harness) {
			if _, err := h.st.EnsureSubscription(h.ctx, ledger.EnsureSpec{Principal: "default", SourceID: h.src.ID, URI: uri,
				ServerURI: uri, WorkflowID: "default-test-workflow-id"}); err != nil {
				t.Fatal(err)
			}
		}, wantState: mcpsync.StateClosed, wantUnsubscribes: 0, wantReasonPrefix: "revoked: no standing grant"},
		{name: "no row", wantErr: true},
		{name: "closed row", before: func(t *testing.T, h *harness) {
			endedActive(t, h)
			s := h.sub()
			cr, err := h.st.BeginUnsubscribe(h.ctx, s.ID, s.Generation, "unsubscribed")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := h.st.CompleteUnsubscribe(h.ctx, s.ID, s.Generation, cr.CloseEpoch); err != nil {
				t.Fatal(err)
			}
			if s := h.sub(); s.State != mcpsync.StateClosed {
				t.Fatalf("set-up: %s, want CLOSED", s.State)
			}
		}, wantErr: true, wantState: mcpsync.StateClosed, wantReasonPrefix: "unsubscribed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			if tt.before != nil {
				tt.before(t, h)
			}
			var before ledger.Subscription
			if tt.before != nil {
				before = h.sub()
			}
			if _, err := h.st.Revoke(h.ctx, ledger.RevokeRequest{Principal: "default", SourceID: h.src.ID, Reason: "test"}); err != nil {
				t.Fatal(err)
			}
			h = h.fresh()
			h.mcp.mu.Lock()
			subscribes, reads, unsubscribes := len(h.mcp.subscribes), len(h.mcp.reads), len(h.mcp.unsubscribes)
			h.mcp.mu.Unlock()
			h.at(time.Hour, h.env.CancelWorkflow) // a run that neither closes nor fails
			h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, h.input())
			if !h.env.IsWorkflowCompleted() {
				t.Fatal("workflow did not complete")
			}
			err := h.env.GetWorkflowError()
			if tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), "no standing grant") {
					t.Errorf("workflow error %v, want the refusal for want of a grant", err)
				}
			} else if err != nil {
				t.Fatalf("workflow error: %v", err)
			}
			h.mcp.mu.Lock()
			got := [3]int{len(h.mcp.subscribes) - subscribes, len(h.mcp.reads) - reads, len(h.mcp.unsubscribes) - unsubscribes}
			h.mcp.mu.Unlock()
			if diff := cmp.Diff([3]int{0, 0, tt.wantUnsubscribes}, got); diff != "" {
				t.Errorf("MCP subscribes, reads, unsubscribes of the run (-want +got):\n%s", diff)
			}
			if tt.before == nil {
				if _, err := h.st.SubscriptionByKey(h.ctx, "default", "demo", uri); !errors.Is(err, ledger.ErrNotFound) {
					t.Errorf("subscription after a refused run: %v, want none", err)
				}
				return
			}
			after := h.sub()
			if after.State != tt.wantState || !strings.HasPrefix(after.StateReason, tt.wantReasonPrefix) || after.Generation != before.Generation {
				t.Errorf("ledger %s %q generation %d, want %s %q… generation %d", after.State, after.StateReason, after.Generation,
					tt.wantState, tt.wantReasonPrefix, before.Generation)
			}
		})
	}
}

// endedActive leaves the harness's subscription ACTIVE with a first version and no workflow
// (the run is cancelled, which closes nothing).
func endedActive(t *testing.T, h *harness) {
	t.Helper()
	h.at(time.Minute, h.env.CancelWorkflow)
	h.env.ExecuteWorkflow(contract.SubscriptionWorkflowName, h.input())
	if s := h.sub(); s.State != mcpsync.StateActive || s.LastAcceptedOrdinal == 0 {
		t.Fatalf("set-up: %s, accepted ordinal %d, want ACTIVE with a version", s.State, s.LastAcceptedOrdinal)
	}
}
