package workerapp

import (
	"errors"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/metrics"
)

// workerMetrics is a worker's Prometheus instrumentation (issue 17, part 2): the registry
// with mcpsync's instruments and the ledger gauges, the Temporal SDK's metrics handler and
// the /metrics server. A nil *workerMetrics (metrics disabled) does nothing.
type workerMetrics struct {
	m   *metrics.Metrics
	srv *metrics.Server // nil when the address was in use
	sdk io.Closer
	log *zap.Logger
}

// startMetrics serves /metrics on cfg.MetricsAddr; an empty address disables metrics (nil).
// A malformed address is an error. An address in use is one WARN line and the worker runs on
// without serving metrics: a second worker on the same machine (make run plus another) must
// not fail for it, and the line says how to choose another address.
func startMetrics(cfg Config, pool *pgxpool.Pool) (*workerMetrics, error) {
	if cfg.MetricsAddr == "" {
		return nil, nil
	}
	m := metrics.New()
	m.Registry().MustRegister(metrics.NewLedgerCollector(pool, 0, cfg.Logger))
	wm := &workerMetrics{m: m, log: cfg.Logger}
	srv, err := m.Serve(cfg.MetricsAddr)
	switch {
	case errors.Is(err, metrics.ErrAddrInUse):
		cfg.Logger.Warn("metrics not served: address in use; set "+metrics.EnvAddr+" to another address, or to empty to disable metrics",
			zap.String("addr", cfg.MetricsAddr))
	case err != nil:
		return nil, err
	default:
		wm.srv = srv
		cfg.Logger.Info("metrics served", zap.String("url", srv.URL()))
	}
	return wm, nil
}

// temporalHandler returns the Temporal SDK metrics handler for a client the worker dials
// itself (nil: the SDK's no-op handler).
func (wm *workerMetrics) temporalHandler() client.MetricsHandler {
	if wm == nil {
		return nil
	}
	h, closer := wm.m.TemporalHandler(wm.log)
	wm.sdk = closer
	return h
}

// instrument hooks the session host: notification receipts (through its Signaler) and
// health reports (sessions by state, reconnects).
func (wm *workerMetrics) instrument(h *mcphost.Options) {
	if wm == nil {
		return
	}
	h.Signaler = wm.m.Signaler(h.Signaler)
	if prev := h.OnHealth; prev != nil {
		h.OnHealth = func(id int64, r ledger.HealthReport) { prev(id, r); wm.m.Health(id, r) }
	} else {
		h.OnHealth = wm.m.Health
	}
}

// metrics returns the instruments for the activities (nil when disabled).
func (wm *workerMetrics) metrics() *metrics.Metrics {
	if wm == nil {
		return nil
	}
	return wm.m
}

func (wm *workerMetrics) close() {
	if wm == nil {
		return
	}
	if wm.srv != nil {
		_ = wm.srv.Close()
	}
	if wm.sdk != nil {
		_ = wm.sdk.Close()
	}
}

// MetricsURL is the worker's /metrics URL, or "" when it serves none (disabled, or the
// address was in use).
func (w *Worker) MetricsURL() string {
	if w.obs == nil || w.obs.srv == nil {
		return ""
	}
	return w.obs.srv.URL()
}
