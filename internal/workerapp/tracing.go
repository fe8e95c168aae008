package workerapp

import (
	"context"
	"fmt"
	"slices"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/worker"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/redact"
	"github.com/mcpsync/mcpsync/internal/tracing"
)

// workerTracing is a worker's share of tracing (issue 17 part 3): its hold on the process's
// tracer provider (OTLP when OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT is set, see
// tracing.Acquire), the Temporal tracing interceptors for its workers, and a client sharing
// the worker's connection whose signals carry the trace (the session host's signaler). With
// tracing off it holds no interceptors and no client, so workers and signals are unchanged.
// A nil *workerTracing does nothing.
type workerTracing struct {
	release      func(context.Context) error
	interceptors []interceptor.WorkerInterceptor
	client       client.Client // nil when tracing is off
	log          *zap.Logger
}

// startTracing acquires the tracer provider and, when tracing is on, builds the interceptors
// and the signalling client over c's connection. A malformed OTEL_* setting is an error.
func startTracing(ctx context.Context, c client.Client, cfg Config) (*workerTracing, error) {
	log := cfg.Logger
	release, err := tracing.Acquire(ctx, tracing.Options{
		ServiceName: "mcpsync-worker",
		OnError:     func(err error) { log.Warn("trace export failed", zap.Error(redact.Err(err))) },
	})
	if err != nil {
		return nil, fmt.Errorf("tracing: %w", err)
	}
	t := &workerTracing{release: release, log: log}
	ics, err := tracing.TemporalInterceptors()
	if err != nil || len(ics) == 0 {
		if err != nil {
			t.close()
		}
		return t, err
	}
	clientIcs := make([]interceptor.ClientInterceptor, 0, len(ics))
	for _, ic := range ics {
		t.interceptors = append(t.interceptors, ic)
		clientIcs = append(clientIcs, ic)
	}
	t.client, err = client.NewClientFromExistingWithContext(ctx, c, client.Options{
		Namespace: cfg.Namespace, Logger: logging.Temporal(log.Named("temporal")), Interceptors: clientIcs,
	})
	if err != nil {
		t.close()
		return nil, fmt.Errorf("tracing: temporal client: %w", err)
	}
	if tracing.Configured() {
		log.Info("traces exported over OTLP", zap.String("endpoint", redact.URL(tracing.Endpoint())))
	}
	return t, nil
}

// signaler is what the session host signals workflows through: the tracing client when
// tracing is on (its signals carry the notification's trace), else c.
func (t *workerTracing) signaler(c client.Client) mcphost.Signaler {
	if t == nil || t.client == nil {
		return c
	}
	return t.client
}

// options returns o with the tracing interceptors appended (o itself when tracing is off).
func (t *workerTracing) options(o worker.Options) worker.Options {
	if t == nil || len(t.interceptors) == 0 {
		return o
	}
	o.Interceptors = append(slices.Clone(o.Interceptors), t.interceptors...)
	return o
}

// close closes the tracing client and releases the provider; the last worker of the process
// to release it flushes the spans still buffered.
func (t *workerTracing) close() {
	if t == nil {
		return
	}
	if t.client != nil {
		t.client.Close()
		t.client = nil
	}
	if t.release != nil {
		if err := t.release(context.Background()); err != nil {
			t.log.Warn("flushing traces failed", zap.Error(err))
		}
		t.release = nil
	}
}
