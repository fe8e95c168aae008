// Package workerapp assembles an mcpsync worker: the ledger (migrations applied at start), the
// Temporal worker running workflows and ledger activities on the shared queue, and the session
// host with its session-bound activities on a queue of its own. mcpsync-worker runs one; tests
// run several in-process.
package workerapp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/redact"
	"github.com/mcpsync/mcpsync/internal/searchattr"
	"github.com/mcpsync/mcpsync/workflows"
)

// Config configures a worker.
type Config struct {
	DatabaseURL     string
	TemporalAddress string
	Namespace       string
	// TemporalConn is TLS and the API key for the Temporal connection (issue 17 item 1).
	TemporalConn config.TemporalConn
	Logger       *zap.Logger
	// Client, if set, is used instead of dialling TemporalAddress (tests).
	Client client.Client
	// HostQueue names this worker's session-host queue; a unique name is made if empty.
	HostQueue string
	// Host tunes the session host (Store, Signaler and Queue are filled in).
	Host mcphost.Options
	// Prune is the retention schedule (prune.go); nil: MCPSYNC_PRUNE_EVERY and
	// MCPSYNC_PRUNE_OLDER_THAN, off by default.
	Prune *PruneSchedule
	// MetricsAddr is where /metrics is served (internal/metrics; mcpsync-worker passes
	// MCPSYNC_METRICS_ADDR, default 127.0.0.1:9464); empty disables metrics. The Temporal
	// SDK's metrics are included only for the client the worker dials itself (Client nil).
	MetricsAddr string
	// GatewayAddr is where the MCP gateway listens (internal/gateway; mcpsync-worker passes
	// MCPSYNC_GATEWAY_ADDR, default 127.0.0.1:8765, "off" for none); empty: no gateway.
	GatewayAddr string
}

// workerOptions keeps enough pollers waiting that the server can hand tasks over directly
// (sync match) instead of persisting them, which matters under a steady stream of updates.
//
// StickyScheduleToStartTimeout is how long a workflow task waits on this worker's sticky
// queue before the server hands it to the normal queue, where whichever worker takes it
// replays the workflow's whole history. The SDK's default, 5 s, is shorter than the queue
// a live worker has when updates arrive faster than it carries them: at 150-250 offered
// updates/s over 1,000 subscriptions (the throughput bench, issue 16) tasks that waited past
// 5 s were timed out and replayed in full, which cost more CPU per update, so that more tasks
// waited past 5 s: the bench's slow regime (p99 12-18 s, 0.02-0.2 timed-out workflow tasks
// per accepted update). At 30 s none timed out in the same runs (five at 250/s, three at 150/s;
// TestStickyTaskWaitsForABusyWorker). The price: tasks queued for
// a worker that is gone wait up to this long before another worker (or its successor) takes
// them. Only those already queued: the server sends new tasks to the normal queue once the
// worker has stopped (it says so on Stop) or no poll of its has been seen for 10 s.
var workerOptions = worker.Options{
	MaxConcurrentWorkflowTaskPollers: 8,
	MaxConcurrentActivityTaskPollers: 8,
	StickyScheduleToStartTimeout:     30 * time.Second,
}

// WorkerOptions returns the worker options mcpsync's workers run with (its poller counts and
// sticky schedule-to-start timeout), for a bench's floor to run with the same.
func WorkerOptions() worker.Options { return workerOptions }

// Worker is a running mcpsync worker.
type Worker struct {
	Store  *ledger.Store
	Host   *mcphost.Host
	Client client.Client

	pool       *pgxpool.Pool
	ownsClient bool
	workers    []worker.Worker
	cancel     context.CancelFunc
	hostDone   chan struct{}
	stopOnce   sync.Once
	obs        *workerMetrics   // nil: metrics disabled
	trace      *workerTracing   // nil before Start set it up; off: no interceptors
	gateway    *gateway.Gateway // nil: no gateway (gateway.go)
}

// Start connects to Postgres (applying migrations) and Temporal (registering the search
// attributes if missing), starts both Temporal workers and the session host. It fails with a
// clear error if either service is unreachable.
func Start(ctx context.Context, cfg Config) (*Worker, error) {
	if cacheSizeErr != nil { // cache.go: the sticky cache size from the environment
		return nil, cacheSizeErr
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	prune, err := cfg.pruneSchedule()
	if err != nil {
		return nil, err
	}
	pool, err := ledger.Open(ctx, cfg.DatabaseURL, 10*time.Second)
	if err != nil {
		// One line, the password masked (ledger.OpenError).
		switch oe, _ := errors.AsType[*ledger.OpenError](err); {
		case oe != nil && oe.Kind == ledger.OpenMalformed:
			return nil, fmt.Errorf("DATABASE_URL is malformed: %w", err)
		case oe != nil && oe.Kind == ledger.OpenAuth:
			return nil, fmt.Errorf("database %s refused the credentials of DATABASE_URL: %w", redact.DSN(cfg.DatabaseURL), err)
		}
		return nil, fmt.Errorf("database %s unreachable: %w", redact.DSN(cfg.DatabaseURL), err)
	}
	if applied, err := dbschema.Apply(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	} else if len(applied) > 0 {
		cfg.Logger.Info("ledger migrations applied", zap.Ints("versions", applied))
	}
	w := &Worker{Store: ledger.New(pool), pool: pool, Client: cfg.Client, hostDone: make(chan struct{})}
	if w.obs, err = startMetrics(cfg, pool); err != nil {
		pool.Close()
		return nil, err
	}
	if w.Client == nil {
		c, err := cfg.TemporalConn.Dial(ctx, cfg.TemporalAddress, cfg.Namespace, client.Options{
			Logger: logging.Temporal(cfg.Logger.Named("temporal")), MetricsHandler: w.obs.temporalHandler(),
		})
		if err != nil {
			w.obs.close()
			pool.Close()
			return nil, err // one line naming the address or setting (config.DialError, ConfigError)
		}
		w.Client, w.ownsClient = c, true
	}
	if err := searchattr.Ensure(ctx, w.Client, cfg.Namespace); err != nil {
		w.close()
		return nil, err
	}
	queue := cfg.HostQueue
	if queue == "" {
		host, _ := os.Hostname()
		queue = fmt.Sprintf("mcpsync-host-%s-%d-%d", host, os.Getpid(), time.Now().UnixNano()%1e6)
	}
	hopts := cfg.Host
	if w.trace, err = startTracing(ctx, w.Client, cfg); err != nil {
		w.close()
		return nil, err
	}
	hopts.Store, hopts.Signaler, hopts.Queue = w.Store, w.trace.signaler(w.Client), queue
	if hopts.Logger == nil {
		hopts.Logger = cfg.Logger
	}
	if hopts.SourceEvents == nil {
		hopts.SourceEvents = SourceEventSignaler(w.Client, cfg.Logger)
	}
	w.obs.instrument(&hopts)
	w.Host = mcphost.New(hopts)

	main := worker.New(w.Client, contract.TaskQueue, w.trace.options(workerOptions))
	for name, fn := range workflows.ByType {
		main.RegisterWorkflowWithOptions(fn, workflow.RegisterOptions{Name: name})
	}
	led := &activities.Ledger{Store: w.Store, Metrics: w.obs.metrics()}
	led.Register(main)
	// One Session value on both queues: MCPRead joins the reads the fast path handed off.
	sess := &activities.Session{Host: w.Host, Store: w.Store}
	(&activities.LocalRead{Session: sess, Ledger: led}).Register(main)
	(&activities.LocalSubscribe{Session: sess}).Register(main) // the subscribe fast path (issue 16 item 4)
	(&activities.Catalog{Store: w.Store}).Register(main)
	// Bulk subscribes' starts, from this client: eager onto main (issue 16 item 4).
	(&activities.StartBatch{Client: w.Client, Namespace: cfg.Namespace}).Register(main)
	hostWorker := worker.New(w.Client, queue, w.trace.options(workerOptions))
	sess.Register(hostWorker)
	(&activities.Discovery{Host: w.Host, Store: w.Store}).Register(hostWorker)
	for _, wk := range []worker.Worker{main, hostWorker} {
		if err := wk.Start(); err != nil {
			for _, started := range w.workers {
				started.Stop()
			}
			w.close()
			return nil, fmt.Errorf("start temporal worker: %w", err)
		}
		w.workers = append(w.workers, wk)
	}
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancel = hcancel
	go func() {
		defer close(w.hostDone)
		_ = w.Host.Run(hctx)
	}()
	startPrune(hctx, w.Store, prune, cfg.Logger)
	if w.gateway, err = startGateway(hctx, cfg, w); err != nil {
		w.Stop()
		return nil, err
	}
	cfg.Logger.Info("worker started", zap.String("task_queue", contract.TaskQueue), zap.String("host_queue", queue))
	return w, nil
}

// Stop stops the session host (ending its sessions and releasing leases) and the Temporal
// workers, and closes connections. It is safe to call more than once.
func (w *Worker) Stop() {
	w.stopOnce.Do(func() {
		if w.gateway != nil {
			_ = w.gateway.Close()
		}
		for _, wk := range w.workers {
			wk.Stop()
		}
		if w.cancel != nil {
			w.cancel()
			<-w.hostDone
		}
		w.close()
	})
}

func (w *Worker) close() {
	w.trace.close()
	if w.ownsClient {
		w.Client.Close()
	}
	w.obs.close()
	w.pool.Close()
}
