package mcphost

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Backoff of a source whose server refused the credentials (AUTH_FAILED) or whose definition
// cannot be used (FAILED): retrying soon cannot help, so attempts start 30 s apart and double
// up to 5 min (issue 14, item 2), instead of the ReconnectMin..ReconnectMax backoff of other
// failures.
const (
	slowBackoffMin = 30 * time.Second
	slowBackoffMax = 5 * time.Minute
)

// healthWriteTimeout bounds one health write; health is best effort and never holds up a
// session.
const healthWriteTimeout = 2 * time.Second

// maintain connects a source, records each connection as a new generation and reconnects
// with backoff until ctx ends, reporting the source's health to the ledger as it goes
// (issue 14, item 2): CONNECTING before each attempt (every attempt after the first counts as
// a reconnect), LIVE once the session is recorded, then BACKOFF with the error or end reason
// and the time of the next attempt; AUTH_FAILED when the server refused the credentials
// (an *AuthError in the chain: its WWW-Authenticate challenge is the stored error) and FAILED
// when the source's definition cannot be used (a transport that cannot be built), both with
// the slow backoff. A failure is logged at WARN when its state or error text changes, at
// DEBUG when it repeats, so a source that keeps failing is visible without flooding the log.
// A session that ends before it lived ReconnectMax counts as a failure, so a server that dies
// right after initializing is not reconnected in a tight loop.
func (h *Host) maintain(ctx context.Context, src ledger.Source) {
	log := h.log.With(zap.String("source", src.Name))
	rep := newHealthReporter(h, src.ID, log)
	go rep.run()
	defer func() {
		rep.close() // its last report goes out while the lease is still ours
		if f := h.opts.OnHealth; f != nil {
			f(src.ID, ledger.HealthReport{}) // no longer held by this host
		}
		// A restart for a changed definition keeps the lease (the source restarts here, no
		// hand-over churn); after a failed renewal the ledger is unreachable, so there is
		// nothing to release and the lease simply expires.
		if cause := context.Cause(ctx); errors.Is(cause, errDefinitionChanged) || errors.Is(cause, errLeaseRenewalFailed) {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := h.opts.Store.ReleaseSource(rctx, src.ID, h.opts.Queue); err != nil {
			log.Warn("releasing lease failed", zap.Error(err))
		}
	}()
	failures, slowFailures := 0, 0
	var logged failureLog
	for attempt := 0; ctx.Err() == nil; attempt++ {
		started := time.Now()
		r := ledger.HealthReport{State: ledger.HealthConnecting, At: started}
		if attempt > 0 {
			r.Reconnects = 1
		}
		rep.report(r)
		reason, err := h.session(ctx, src, log, rep)
		if ctx.Err() != nil {
			return
		}
		now := time.Now()
		state, text := classify(err)
		if reason != "" {
			logged = failureLog{} // the session opened: its next failure is a change again
		}
		switch {
		case state != ledger.HealthBackoff:
			slowFailures++
			failures = 0
		case err != nil:
			failures++
			slowFailures = 0
		case now.Sub(started) < h.opts.ReconnectMax:
			failures++
			slowFailures = 0
			text = "session ended early: " + ledger.HealthErrorText(reason)
			log.Info("session ended early; reconnecting", zap.String("reason", ledger.HealthErrorText(reason)), zap.Int("failures", failures))
		default:
			failures, slowFailures = 0, 0
			text = "session ended: " + ledger.HealthErrorText(reason)
			log.Info("session ended; reconnecting", zap.String("reason", ledger.HealthErrorText(reason)))
		}
		var d time.Duration
		if slowFailures > 0 {
			d = slowBackoffMin << min(slowFailures-1, 10)
			if d > slowBackoffMax || d <= 0 {
				d = slowBackoffMax
			}
			d -= rand.N(d/5 + 1) // jitter, never below 80 %
		} else {
			d = h.opts.ReconnectMin << min(max(failures-1, 0), 10)
			if d > h.opts.ReconnectMax || d <= 0 {
				d = h.opts.ReconnectMax
			}
			d = d/2 + rand.N(d/2+1) // jitter
		}
		if err != nil {
			logged.log(log, state, text, failures+slowFailures, d)
		}
		rep.report(ledger.HealthReport{State: state, At: now, Err: text, NextAttempt: now.Add(d)})
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// classify maps a session's failure to the state it leaves the source in and the error text
// to store and log (redacted and bounded by ledger.HealthErrorText): AUTH_FAILED with the
// server's challenge for an *AuthError, FAILED for a configuration error, BACKOFF otherwise
// (also for nil: a session that ended).
func classify(err error) (ledger.HealthState, string) {
	if err == nil {
		return ledger.HealthBackoff, ""
	}
	var ae *AuthError
	if errors.As(err, &ae) {
		return ledger.HealthAuthFailed, ledger.HealthErrorText(ae.Error())
	}
	var ce *configError
	if errors.As(err, &ce) {
		return ledger.HealthFailed, ledger.HealthErrorText(err.Error())
	}
	return ledger.HealthBackoff, ledger.HealthErrorText(err.Error())
}

// failureLog remembers the last failure logged at WARN, so that a repeat of the same state
// and error is logged at DEBUG only.
type failureLog struct {
	state ledger.HealthState
	text  string
}

func (l *failureLog) log(log *zap.Logger, state ledger.HealthState, text string, failures int, retryIn time.Duration) {
	fields := []zap.Field{zap.String("state", string(state)), zap.String("error", text),
		zap.Int("failures", failures), zap.Duration("retryIn", retryIn)}
	if l.state == state && l.text == text {
		log.Debug("session failed again", fields...)
		return
	}
	l.state, l.text = state, text
	log.Warn("session failed", fields...)
}

// healthReporter writes the health reports of one source to the ledger from its own
// goroutine, so that a slow or unavailable ledger never delays a session: report never
// blocks, reports made while a write is in flight are merged into one (the newest state, the
// newest error, the reconnects summed), and each write is bounded by healthWriteTimeout.
type healthReporter struct {
	h        *Host
	sourceID int64
	log      *zap.Logger

	mu      sync.Mutex
	pending *ledger.HealthReport
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	// lastWriteErr is the last write failure logged, logged again only when it changes.
	lastWriteErr string
}

func newHealthReporter(h *Host, sourceID int64, log *zap.Logger) *healthReporter {
	return &healthReporter{h: h, sourceID: sourceID, log: log,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// report queues r, merged with any report not yet written.
func (r *healthReporter) report(rep ledger.HealthReport) {
	if f := r.h.opts.OnHealth; f != nil {
		f(r.sourceID, rep)
	}
	r.mu.Lock()
	if p := r.pending; p != nil {
		rep.Reconnects += p.Reconnects
		if rep.Err == "" && p.Err != "" {
			rep.Err, rep.ErrAt = p.Err, p.ErrAt
			if rep.ErrAt.IsZero() {
				rep.ErrAt = p.At
			}
		}
	}
	r.pending = &rep
	r.mu.Unlock()
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// run writes queued reports until close; then it writes what is still queued and returns.
func (r *healthReporter) run() {
	defer close(r.done)
	for {
		select {
		case <-r.kick:
			r.flush()
		case <-r.stop:
			r.flush()
			return
		}
	}
}

// close stops the reporter after it wrote what was queued (within healthWriteTimeout).
func (r *healthReporter) close() {
	close(r.stop)
	<-r.done
}

func (r *healthReporter) flush() {
	r.mu.Lock()
	p := r.pending
	r.pending = nil
	r.mu.Unlock()
	if p == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), healthWriteTimeout)
	defer cancel()
	err := r.h.opts.Store.SetSourceHealth(ctx, r.sourceID, r.h.opts.Queue, *p)
	switch {
	case err == nil:
		r.lastWriteErr = ""
	case errors.Is(err, ledger.ErrLeaseLost):
		r.log.Debug("health not recorded: lease lost", zap.String("state", string(p.State)))
	default:
		if text := ledger.HealthErrorText(err.Error()); text != r.lastWriteErr {
			r.lastWriteErr = text
			r.log.Warn("recording source health failed", zap.String("state", string(p.State)), zap.String("error", text))
		}
	}
}
