// Command mcpsync-gate is mcpsync's release gate: it brings up a whole deployment in this
// process (Temporal, a Postgres ledger, workers, fault-injecting MCP servers), runs the seed's
// release measurements — 100,000 shuffled interleavings, discovery chaos, a duplicate
// notification storm, convergence with dropped notifications, revocation latency — and the
// R24 invariants, then prints the release table: metric, seed threshold, measured, pass/fail.
// The storm and convergence sections run once per MCP era (2025-11-25 and 2026-07-28), one
// row each, and both must pass.
// It exits 0 if every row passes, 1 if any fails, 2 on bad flags. `mcpsync gate` runs it.
// The console shows progress and the table only; the components' logs go to a file whose path
// the first line names.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
)

func main() {
	fs := flag.NewFlagSet("mcpsync gate", flag.ContinueOnError)
	shuffles := fs.Int("shuffles", 100000, "shuffled interleavings (R26)")
	asJSON := fs.Bool("json", false, "print the table as JSON")
	database := fs.String("database", os.Getenv("MCPSYNC_GATE_DATABASE_URL"), "admin URL of a Postgres server to use (empty: start a private one)")
	only := fs.String("only", "", "comma-separated sections to run (shuffles,discovery,storm,converge,revocation); the checker self-test and the invariants always run")
	resources := fs.Int("resources", 1000, "active resources of the convergence run (R28)")
	revocations := fs.Int("revocations", 1000, "principals revoked with reads in flight for the revocation latency (R29)")
	stormResources := fs.Int("storm-resources", 50, "resources of the duplicate-notification storm (R27), each changed 10 times and notified 100 times per change")
	convergeFor := fs.Duration("converge-for", 60*time.Second, "how long the convergence run (R28) mutates resources, per era")
	logLevel := fs.String("log-level", "warn", "log level of the deployment's component logs")
	logFile := fs.String("log-file", "", "file for the component logs of the deployment (empty: a new file in the temporary directory); the console shows only progress and the table")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 || *shuffles < 0 || *resources <= 0 || *revocations <= 0 || *stormResources <= 0 || *convergeFor <= 0 {
		fmt.Fprintln(os.Stderr, "usage: mcpsync gate [--shuffles N] [--resources N] [--converge-for D] [--revocations N] [--storm-resources N] [--only a,b] [--json] [--database URL]")
		os.Exit(2)
	}
	log, path, closeLog, err := fileLogger(*logLevel, *logFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync gate:", err)
		os.Exit(2)
	}
	defer closeLog()
	fmt.Fprintf(os.Stderr, "gate: component logs: %s\n", path)
	opts := gate.Options{AdminURL: *database, Progress: os.Stderr, Logger: log, Shuffles: *shuffles, ConvergeResources: *resources, ConvergeFor: *convergeFor, Revocations: *revocations, StormResources: *stormResources}
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
		for _, s := range opts.Only {
			if !gate.Known(s) {
				fmt.Fprintf(os.Stderr, "mcpsync gate: unknown section %q (have %s)\n", s, strings.Join(gate.Sections(), ", "))
				os.Exit(2)
			}
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := gate.Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync gate:", err)
		closeLog()
		os.Exit(1)
	}
	if *asJSON {
		err = res.WriteJSON(os.Stdout)
	} else {
		err = res.WriteTable(os.Stdout)
	}
	if err != nil || !res.Pass {
		closeLog()
		os.Exit(1)
	}
}

// fileLogger returns a logger at level writing to path (a new temporary file if empty), the
// file's path, and a function that flushes and closes it. The deployment's components (workers,
// session hosts, the Temporal SDK) log there, so that their errors — expected by the thousand
// when the gate tears fault-injecting servers down under live sessions — never reach the
// console, which shows only progress and the table.
func fileLogger(level, path string) (*zap.Logger, string, func(), error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, "", nil, fmt.Errorf("log level %q: %w", level, err)
	}
	var f *os.File
	var err error
	if path == "" {
		f, err = os.CreateTemp("", "mcpsync-gate-*.log")
	} else {
		f, err = os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	}
	if err != nil {
		return nil, "", nil, fmt.Errorf("component log file: %w", err)
	}
	cfg := zap.NewDevelopmentEncoderConfig()
	cfg.EncodeTime = zapcore.ISO8601TimeEncoder
	log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(cfg), zapcore.Lock(f), lvl))
	var once sync.Once
	return log, f.Name(), func() { once.Do(func() { _ = log.Sync(); _ = f.Close() }) }, nil
}
