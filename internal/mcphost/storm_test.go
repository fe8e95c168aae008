package mcphost_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// stormSignaler records SessionChanged signals and the most subscriptions signalled but not
// yet re-established at any time.
type stormSignaler struct {
	mu          sync.Mutex
	signalled   map[int64]int
	moved       map[int64]bool
	maxInWindow int
}

func (s *stormSignaler) SignalWorkflow(_ context.Context, workflowID, _, name string, arg any) error {
	id, err := strconv.ParseInt(workflowID, 10, 64)
	if err != nil || name != contract.SignalSessionChanged || arg.(contract.SessionChanged).Generation != 7 {
		return fmt.Errorf("unexpected signal %s %s %v", workflowID, name, arg)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.signalled[id]++
	s.maxInWindow = max(s.maxInWindow, len(s.signalled)-len(s.moved))
	return nil
}

// reestablish reports up to k of the signalled subscriptions as re-established per call
// (none when k is 0).
func (s *stormSignaler) reestablish(k int) func(context.Context, int64, []int64) ([]int64, error) {
	return func(_ context.Context, gen int64, ids []int64) ([]int64, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []int64
		for _, id := range ids {
			if len(out) == k {
				break
			}
			if s.signalled[id] == 0 {
				return nil, fmt.Errorf("asked about %d, which was never signalled", id)
			}
			s.moved[id] = true
			out = append(out, id)
		}
		return out, nil
	}
}

// After a session change the host signals every live subscription exactly once, never more
// than the window re-establishing at once when the ledger reports them slowly; when the
// ledger reports none (or fails), the stall bound still lets every one be signalled (issue 16
// item 4: a bounded re-read storm).
func TestSessionChangePacedInAWindow(t *testing.T) {
	const n, window = 200, 10
	tests := []struct {
		name          string
		perPoll       int
		stall         time.Duration
		wantMaxWindow int
	}{
		{name: "ledger reports a few per poll", perPoll: 3, stall: time.Hour, wantMaxWindow: window},
		{name: "ledger reports none: the stall bound frees places", perPoll: 0, stall: 20 * time.Millisecond, wantMaxWindow: n},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer mcphost.SetStorm(window, time.Millisecond, tt.stall)()
			sig := &stormSignaler{signalled: map[int64]int{}, moved: map[int64]bool{}}
			h := mcphost.New(mcphost.Options{Signaler: sig, Queue: "storm-test", Logger: zap.NewNop()})
			live := make([]ledger.LiveSubscription, n)
			want := map[int64]int{}
			for i := range live {
				live[i] = ledger.LiveSubscription{ID: int64(i + 1), WorkflowID: strconv.Itoa(i + 1)}
				want[int64(i+1)] = 1
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			mcphost.PaceSessionChanged(h, ctx, 7, live, sig.reestablish(tt.perPoll))
			if diff := cmp.Diff(want, sig.signalled); diff != "" {
				t.Errorf("signals per subscription (-want +got):\n%s", diff)
			}
			if sig.maxInWindow != tt.wantMaxWindow {
				t.Errorf("at most %d re-establishing at once, want %d", sig.maxInWindow, tt.wantMaxWindow)
			}
		})
	}
}
