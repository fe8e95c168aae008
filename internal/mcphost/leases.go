package mcphost

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// claim renews this host's leases and claims free sources, starts maintaining each newly held
// source and drops the sources whose lease was lost.
func (h *Host) claim(ctx context.Context) {
	held, err := h.opts.Store.ClaimSources(ctx, h.opts.Queue, h.opts.Lease)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("claiming sources failed", zap.Error(err))
		}
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[int64]bool{}
	for _, src := range held {
		seen[src.ID] = true
		if _, ok := h.running[src.ID]; ok {
			continue
		}
		sctx, cancel := context.WithCancelCause(ctx)
		h.running[src.ID] = cancel
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.maintain(sctx, src)
		}()
	}
	for id, cancel := range h.running {
		if !seen[id] {
			h.log.Warn("lease lost; dropping source", zap.Int64("source", id))
			cancel(errLeaseLost)
			delete(h.running, id)
		}
	}
}

// Causes of a session's context ending, recorded as the session's end reason.
var (
	errHostStopping = errors.New("host stopping")
	errLeaseLost    = errors.New("lease lost to another host")
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
