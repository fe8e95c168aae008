package mcphost

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Leases (issue 12, defect 6). Each claim round is one ledger.ClaimLeases: it renews this
// host's heartbeat and leases, takes free or expired sources up to the host's fair share and
// names the sources to shed. The host
//   - starts maintaining every source it holds and does not run yet;
//   - restarts a source whose definition version went up;
//   - drops the sources it must shed or that were removed (maintain releases the lease once
//     the session is closed, so the next holder never overlaps it) and those it no longer
//     holds;
//   - drops every session when no round succeeded for RenewGrace (< Lease), measured on the
//     local monotonic clock from the start of the last successful round, so a host cut off
//     from Postgres closes its sessions before its leases can expire and another host take
//     them;
//   - starts a source again only after its previous maintain finished.

// runner is one source being maintained.
type runner struct {
	src    ledger.Source
	cancel context.CancelCauseFunc
	// stopping: cancel was called; the source is not started again before its maintain
	// returned and the runner left Host.running.
	stopping bool
}

// claim runs one lease round and applies it.
func (h *Host) claim(ctx context.Context) {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, h.opts.RenewGrace)
	round, err := h.opts.Store.ClaimLeases(cctx, h.opts.Queue, h.opts.Lease)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("renewing leases failed", zap.Error(err),
				zap.Duration("sinceLastRenewal", h.sinceRenewal()), zap.Duration("renewGrace", h.opts.RenewGrace))
		}
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if ctx.Err() != nil {
		return // stopping: Run stops every runner
	}
	h.renewedLocked(start)
	keep := make(map[int64]bool, len(round.Held)+len(round.Shed))
	for _, src := range round.Held {
		keep[src.ID] = true
		r := h.running[src.ID]
		switch {
		case r == nil:
			h.startLocked(ctx, src)
		case r.stopping:
			// Its previous session is still ending; a later round starts it again.
		case r.src.DefinitionVersion < src.DefinitionVersion:
			h.log.Info("source definition changed; restarting its session", zap.String("source", src.Name),
				zap.Int64("from", r.src.DefinitionVersion), zap.Int64("to", src.DefinitionVersion))
			h.stopLocked(r, errDefinitionChanged)
		}
	}
	for _, src := range round.Shed {
		keep[src.ID] = true
		cause := errShed
		if src.RemovedAt != nil {
			cause = errSourceRemoved
		}
		r := h.running[src.ID]
		switch {
		case r == nil:
			// Held in the ledger but not running here (a release that failed): release now.
			h.wg.Go(func() { h.release(ctx, src.ID) })
		case !r.stopping:
			h.log.Info("giving up source", zap.String("source", src.Name), zap.NamedError("reason", cause),
				zap.Int("share", round.Share), zap.Int("liveHosts", round.LiveHosts))
			h.stopLocked(r, cause)
		}
	}
	for id, r := range h.running {
		if !keep[id] && !r.stopping {
			h.log.Warn("lease lost; dropping source", zap.Int64("source", id))
			h.stopLocked(r, errLeaseLost)
		}
	}
}

// startLocked starts maintaining src. maintain closes the session and releases the lease
// when its context ends; the runner leaves h.running only after that.
func (h *Host) startLocked(ctx context.Context, src ledger.Source) {
	sctx, cancel := context.WithCancelCause(ctx)
	r := &runner{src: src, cancel: cancel}
	h.running[src.ID] = r
	h.wg.Go(func() {
		h.maintain(sctx, src)
		cancel(nil)
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.running[src.ID] == r {
			delete(h.running, src.ID)
		}
	})
}

// stopLocked ends r's session with cause, once.
func (h *Host) stopLocked(r *runner, cause error) {
	if !r.stopping {
		r.stopping = true
		r.cancel(cause)
	}
}

// release gives up the lease of a source that is not running here.
func (h *Host) release(ctx context.Context, sourceID int64) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.opts.Store.ReleaseSource(rctx, sourceID, h.opts.Queue); err != nil {
		h.log.Warn("releasing lease failed", zap.Int64("source", sourceID), zap.Error(err))
	}
}

// renewedLocked records a successful round that started at start and arms the watchdog for
// RenewGrace after it.
func (h *Host) renewedLocked(start time.Time) {
	if start.After(h.renewedAt) {
		h.renewedAt = start
	}
	left := h.opts.RenewGrace - time.Since(h.renewedAt)
	if h.watchdog == nil {
		h.watchdog = time.AfterFunc(left, h.checkRenewal)
	} else {
		h.watchdog.Reset(left)
	}
}

// sinceRenewal returns the time since the last successful round started (0 before the first).
func (h *Host) sinceRenewal() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.renewedAt.IsZero() {
		return 0
	}
	return time.Since(h.renewedAt)
}

// checkRenewal is the watchdog: when no round succeeded for RenewGrace, it drops every
// session, because the leases may expire before the host can renew them; otherwise it re-arms.
func (h *Host) checkRenewal() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return
	}
	if left := h.opts.RenewGrace - time.Since(h.renewedAt); left > 0 {
		h.watchdog.Reset(left)
		return
	}
	dropped := 0
	for _, r := range h.running {
		if !r.stopping {
			h.stopLocked(r, errLeaseRenewalFailed)
			dropped++
		}
	}
	if dropped > 0 {
		h.log.Error("leases not renewed in time; dropping every session before the leases can expire",
			zap.Int("sessions", dropped), zap.Duration("sinceLastRenewal", time.Since(h.renewedAt)),
			zap.Duration("lease", h.opts.Lease))
	}
}

// Causes of a session's context ending, recorded as the session's end reason.
var (
	errHostStopping       = errors.New("host stopping")
	errLeaseLost          = errors.New("lease lost to another host")
	errLeaseRenewalFailed = errors.New("lease renewal failed: the ledger was unreachable for too long")
	errShed               = errors.New("source handed over to spread sources across hosts")
	errSourceRemoved      = errors.New("source removed")
	errDefinitionChanged  = errors.New("source definition changed")
)
