package mcphost

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// PaceSessionChanged runs the windowed SessionChanged signalling of storm.go with done in
// place of ledger.Store.Reestablished.
func PaceSessionChanged(h *Host, ctx context.Context, gen int64, live []ledger.LiveSubscription, done func(context.Context, int64, []int64) ([]int64, error)) {
	h.paceWith(ctx, gen, live, zap.NewNop(), done)
}

// SetStorm sets the window, poll interval and stall bound of the pacing until restore.
func SetStorm(window int, poll, stall time.Duration) (restore func()) {
	w, p, s := stormWindow, stormPoll, stormStall
	stormWindow, stormPoll, stormStall = window, poll, stall
	return func() { stormWindow, stormPoll, stormStall = w, p, s }
}
