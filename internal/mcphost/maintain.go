package mcphost

import (
	"context"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// maintain connects a source, records each connection as a new generation and reconnects
// with jittered backoff until ctx ends. A session that ends before it lived ReconnectMax counts
// as a failure, so a server that dies right after initializing is not reconnected in a tight
// loop.
func (h *Host) maintain(ctx context.Context, src ledger.Source) {
	log := h.log.With(zap.String("source", src.Name))
	failures := 0
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := h.opts.Store.ReleaseSource(rctx, src.ID, h.opts.Queue); err != nil {
			log.Warn("releasing lease failed", zap.Error(err))
		}
	}()
	for ctx.Err() == nil {
		started := time.Now()
		reason, err := h.session(ctx, src, log)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			failures++
			log.Warn("session failed", zap.Error(err), zap.Int("failures", failures))
		case time.Since(started) < h.opts.ReconnectMax:
			failures++
			log.Info("session ended early; reconnecting", zap.String("reason", reason), zap.Int("failures", failures))
		default:
			failures = 0
			log.Info("session ended; reconnecting", zap.String("reason", reason))
		}
		d := h.opts.ReconnectMin << min(max(failures-1, 0), 10)
		if d > h.opts.ReconnectMax || d <= 0 {
			d = h.opts.ReconnectMax
		}
		d = d/2 + rand.N(d/2+1) // jitter
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}
