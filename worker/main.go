// Command mcpsync-worker runs the Temporal worker (SubscriptionWorkflow and the ledger
// activities) and the session host (one live MCP session per source, session-bound
// activities on its own queue). It reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, DATABASE_URL
// and the Temporal TLS and API-key variables (TEMPORAL_TLS_CERT, TEMPORAL_TLS_KEY,
// TEMPORAL_TLS_CA, TEMPORAL_TLS_SERVER_NAME, TEMPORAL_TLS, TEMPORAL_API_KEY), each but the API
// key also a --temporal-… flag; the defaults match mcpsync-dev. It serves the MCP gateway for
// agents on MCPSYNC_GATEWAY_ADDR (default 127.0.0.1:8765; "off" serves none) and /metrics on
// MCPSYNC_METRICS_ADDR. MCPSYNC_NOTIFICATION_DELIVERY says how the session host hands
// notifications to subscription workflows: "update" (the default: Temporal workflow updates) or
// "signal" (mcphost.Delivery). Unless GOGC is set, its garbage collector runs at gcpolicy.Percent.
// SIGINT or SIGTERM stops it;
// with --parent-pid, so does the exit of that process (scripts/run.sh passes its own PID, so
// that killing the script never leaves a worker behind).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/gateway"
	"github.com/mcpsync/mcpsync/internal/gcpolicy"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/metrics"
	"github.com/mcpsync/mcpsync/internal/parentwatch"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

func main() {
	fs := flag.NewFlagSet("mcpsync-worker", flag.ContinueOnError)
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	parentPID := fs.Int("parent-pid", 0, "stop when the process with this PID exits (0: never)")
	// Temporal connection flags override their environment variables (issue 17 item 1).
	env := config.FromEnv()
	env.TemporalFlags(fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mcpsync-worker: unexpected argument %q\n", fs.Arg(0))
		os.Exit(2)
	}
	if code := checkTemporalFlags(fs, env.Temporal, os.Stderr); code != 0 {
		os.Exit(code)
	}
	delivery, code := checkDelivery(os.Getenv(deliveryEnv), os.Stderr)
	if code != 0 {
		os.Exit(code)
	}
	gatewayAddr, metricsAddr := gateway.AddrFromEnv(), metrics.AddrFromEnv()
	if code := checkListenAddrs(os.Stderr, gatewayAddr, metricsAddr); code != 0 {
		os.Exit(code)
	}
	log, err := logging.New(*level)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync-worker:", err)
		os.Exit(2)
	}
	defer log.Sync() //nolint:errcheck
	// The collector's target measured for this process (issue 16); GOGC overrides it.
	log.Info("garbage collector", zap.Stringer("gogc", gcpolicy.Apply()))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The parent's exit stops the worker as a signal would (on Linux it is delivered as SIGTERM).
	ctx, stopWatch := parentwatch.Context(ctx, *parentPID, parentwatch.Options{})
	defer stopWatch()
	w, err := workerapp.Start(ctx, workerapp.Config{
		DatabaseURL: env.DatabaseURL, TemporalAddress: env.TemporalAddress, Namespace: env.Namespace,
		TemporalConn: env.Temporal, Logger: log, MetricsAddr: metricsAddr,
		GatewayAddr: gatewayAddr, Host: mcphost.Options{Delivery: delivery},
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

// deliveryEnv names the variable that chooses how notifications reach their workflows.
const deliveryEnv = "MCPSYNC_NOTIFICATION_DELIVERY"

// checkDelivery reads the value of MCPSYNC_NOTIFICATION_DELIVERY; a bad one is bad input: one
// line naming the variable, exit 2.
func checkDelivery(value string, stderr io.Writer) (mcphost.Delivery, int) {
	d, err := mcphost.ParseDelivery(value)
	if err != nil {
		fmt.Fprintf(stderr, "mcpsync-worker: %s: %v\n", deliveryEnv, err)
		return 0, 2
	}
	return d, 0
}

// checkListenAddrs checks the gateway's and the metrics' listen addresses as written (""
// serves none): one that no listener would take is bad input, one line naming its variable,
// exit 2, before anything is contacted (at start it would fail only after the worker had
// connected everything and started its sessions).
func checkListenAddrs(stderr io.Writer, gatewayAddr, metricsAddr string) int {
	for _, a := range []struct{ name, addr string }{{gateway.EnvAddr, gatewayAddr}, {metrics.EnvAddr, metricsAddr}} {
		if a.addr == "" {
			continue
		}
		if err := config.CheckListenAddr(a.name, a.addr); err != nil {
			fmt.Fprintln(stderr, "mcpsync-worker:", err)
			return 2
		}
	}
	return 0
}

// checkTemporalFlags validates the Temporal TLS settings when any was given as a flag, so that
// a bad flag is bad input (one line, exit 2) before anything is contacted; a bad environment
// variable surfaces at connect (exit 1).
func checkTemporalFlags(fs *flag.FlagSet, conn config.TemporalConn, stderr io.Writer) int {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || strings.HasPrefix(f.Name, "temporal-tls") })
	if !given {
		return 0
	}
	if err := conn.Validate(); err != nil {
		fmt.Fprintln(stderr, "mcpsync-worker:", flagNames.Replace(err.Error()))
		return 2
	}
	return 0
}

// flagNames names the flags beside the variables in config's messages.
var flagNames = strings.NewReplacer(
	"TEMPORAL_TLS_CERT", "--temporal-tls-cert (TEMPORAL_TLS_CERT)",
	"TEMPORAL_TLS_KEY", "--temporal-tls-key (TEMPORAL_TLS_KEY)",
	"TEMPORAL_TLS_CA", "--temporal-tls-ca (TEMPORAL_TLS_CA)",
	"TEMPORAL_TLS_SERVER_NAME", "--temporal-tls-server-name (TEMPORAL_TLS_SERVER_NAME)",
	"TEMPORAL_TLS", "--temporal-tls (TEMPORAL_TLS)",
)
