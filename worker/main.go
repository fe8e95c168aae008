// Command mcpsync-worker runs the Temporal worker (SubscriptionWorkflow and the ledger
// activities) and the session host (one live MCP session per source, session-bound
// activities on its own queue). It reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE and
// DATABASE_URL; the defaults match mcpsync-dev. SIGINT or SIGTERM stops it; with --parent-pid,
// so does the exit of that process (scripts/run.sh passes its own PID, so that killing the
// script never leaves a worker behind).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/parentwatch"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

func main() {
	fs := flag.NewFlagSet("mcpsync-worker", flag.ContinueOnError)
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	parentPID := fs.Int("parent-pid", 0, "stop when the process with this PID exits (0: never)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mcpsync-worker: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	log, err := logging.New(*level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-worker:", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	env := config.FromEnv()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The parent's exit stops the worker as a signal would (on Linux it is delivered as SIGTERM).
	ctx, stopWatch := parentwatch.Context(ctx, *parentPID, parentwatch.Options{})
	defer stopWatch()
	w, err := workerapp.Start(ctx, workerapp.Config{
		DatabaseURL: env.DatabaseURL, TemporalAddress: env.TemporalAddress, Namespace: env.Namespace, Logger: log,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-worker:", err)
		os.Exit(1)
	}
	<-ctx.Done()
	log.Info("stopping worker")
	w.Stop()
	log.Info("worker stopped", zap.String("reason", context.Cause(ctx).Error()))
}
