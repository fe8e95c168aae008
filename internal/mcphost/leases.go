package mcphost

import (
	"context"
	"errors"

	"go.uber.org/zap"
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
