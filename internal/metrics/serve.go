package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/uber-go/tally/v4"
	tallyprom "github.com/uber-go/tally/v4/prometheus"
	"go.temporal.io/sdk/client"
	sdktally "go.temporal.io/sdk/contrib/tally"
	"go.uber.org/zap"
)

// EnvAddr names the environment variable with the address the worker serves /metrics on.
const EnvAddr = "MCPSYNC_METRICS_ADDR"

// DefaultAddr is the metrics address when EnvAddr is unset.
const DefaultAddr = "127.0.0.1:9464"

// AddrFromEnv returns the metrics address: EnvAddr's value when it is set (an empty value
// disables metrics), DefaultAddr when it is unset.
func AddrFromEnv() string {
	if v, ok := os.LookupEnv(EnvAddr); ok {
		return v
	}
	return DefaultAddr
}

// sdkReportInterval is how often the Temporal SDK's tally scope reports to the registry.
const sdkReportInterval = time.Second

// TemporalHandler returns a Temporal SDK metrics handler (go.temporal.io/sdk/contrib/tally)
// whose metrics land in m's registry under their SDK names (temporal_request,
// temporal_workflow_task_execution_latency, ...; timers as histograms in seconds), and a
// closer that stops its reporting. Pass the handler as client.Options.MetricsHandler. The
// SDK's metrics reach the registry every second (tally reports on an interval).
func (m *Metrics) TemporalHandler(log *zap.Logger) (client.MetricsHandler, io.Closer) {
	if log == nil {
		log = zap.NewNop()
	}
	var once sync.Once
	reporter := tallyprom.NewReporter(tallyprom.Options{
		Registerer:              m.reg,
		DefaultTimerType:        tallyprom.HistogramTimerType,
		DefaultHistogramBuckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		// The SDK uses some names with different tag sets; the first set wins, and a
		// clash is logged once instead of panicking (tally's default).
		OnRegisterError: func(err error) {
			once.Do(func() { log.Debug("metrics: a Temporal SDK metric was not registered", zap.Error(err)) })
		},
	})
	scope, closer := tally.NewRootScope(tally.ScopeOptions{
		CachedReporter:  reporter,
		Separator:       tallyprom.DefaultSeparator,
		SanitizeOptions: &sdktally.PrometheusSanitizeOptions,
	}, sdkReportInterval)
	return sdktally.NewMetricsHandler(scope), closer
}

// Server serves a registry's metrics over HTTP at /metrics.
type Server struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{}
}

// ErrAddrInUse is returned (wrapped) by Serve when the address is taken.
var ErrAddrInUse = errors.New("address in use")

// Serve binds addr and serves m's registry at /metrics (Prometheus text) until Close. A
// malformed address fails; an address in use fails with ErrAddrInUse in the chain, so the
// caller can decide to run on without metrics. Use port 0 for a free port (tests) and URL
// for the address bound.
func (m *Metrics) Serve(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("metrics address %s: %w", addr, ErrAddrInUse)
		}
		return nil, fmt.Errorf("metrics address %q (%s): %w", addr, EnvAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError, Timeout: 10 * time.Second,
	}))
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the metrics endpoint, e.g. http://127.0.0.1:9464/metrics.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() + "/metrics" }

// Close stops serving (waiting up to 2 s for scrapes in flight).
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	<-s.done
	return err
}
