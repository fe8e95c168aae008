package mcphost

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// A new session makes every live subscription of its source re-subscribe and re-read (R12):
// with thousands of subscriptions, telling them all at once puts thousands of workflow tasks
// in front of the live updates of the subscriptions that have re-established already, and
// the session-bound activities of the late ones time out in the queue and back off, which
// adds more work (issue 16 item 4). So the host tells them in a moving window: at most
// stormWindow subscriptions of the source are re-establishing at a time; one leaves the
// window when the ledger shows it past re-establishing (ledger.Reestablished) or after
// stormStall, whichever comes first (its own retries go on; the window only paces).
var (
	// stormWindow is how many subscriptions of one source re-establish at once.
	stormWindow = 64
	// stormPoll is how often the window is checked against the ledger.
	stormPoll = 250 * time.Millisecond
	// stormStall is how long one subscription may hold a place in the window.
	stormStall = 30 * time.Second
)

// reestablishedFunc answers which of ids have re-established on generation gen
// (ledger.Store.Reestablished); a variable of the host so that tests can observe the pacing.
type reestablishedFunc func(ctx context.Context, gen int64, ids []int64) ([]int64, error)

// paceSessionChanged tells every live subscription of the source that its session changed to
// generation gen, at most stormWindow re-establishing at once (see above). It returns once
// every subscription was signalled, or when ctx ends (the session is over: the next one
// signals them all again).
func (h *Host) paceSessionChanged(ctx context.Context, gen int64, live []ledger.LiveSubscription, log *zap.Logger) {
	h.paceWith(ctx, gen, live, log, h.opts.Store.Reestablished)
}

func (h *Host) paceWith(ctx context.Context, gen int64, live []ledger.LiveSubscription, log *zap.Logger, done reestablishedFunc) {
	if len(live) <= stormWindow {
		h.signalSessionChanged(ctx, gen, live, log)
		return
	}
	began := time.Now()
	inWindow := map[int64]time.Time{}
	next, stalled := 0, 0
	for next < len(live) {
		if free := stormWindow - len(inWindow); free > 0 {
			batch := live[next:min(next+free, len(live))]
			next += len(batch)
			h.signalSessionChanged(ctx, gen, batch, log)
			now := time.Now()
			for _, s := range batch {
				inWindow[s.ID] = now
			}
			if next == len(live) {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(stormPoll):
		}
		ids := make([]int64, 0, len(inWindow))
		for id := range inWindow {
			ids = append(ids, id)
		}
		moved, err := done(ctx, gen, ids)
		if err != nil {
			// Pacing is advisory: without an answer only the stall bound frees places.
			log.Warn("checking re-established subscriptions failed", zap.Error(err))
		}
		for _, id := range moved {
			delete(inWindow, id)
		}
		for id, at := range inWindow {
			if time.Since(at) > stormStall {
				delete(inWindow, id)
				stalled++
			}
		}
	}
	log.Info("session change signalled", zap.Int("subscriptions", len(live)), zap.Int("window", stormWindow),
		zap.Int("stalled", stalled), zap.Duration("took", time.Since(began)))
}
