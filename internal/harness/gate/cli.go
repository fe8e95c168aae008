package gate

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Main is the release gate's command line (cmd/mcpsync-gate, `mcpsync gate`, and
// `mcpsync-bench gate`): it parses args (without the program name), runs the gate until it
// ends or the process is interrupted, prints the release table (or JSON) on stdout and progress
// on stderr, and returns the exit code: 0 if every row passes, 1 if any fails or the gate
// cannot run, 2 on bad flags. The deployment's component logs go to a file whose path the first
// line on stderr names, never to the console.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mcpsync gate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	shuffles := fs.Int("shuffles", 100000, "shuffled interleavings (R26)")
	asJSON := fs.Bool("json", false, "print the table as JSON")
	database := fs.String("database", os.Getenv("MCPSYNC_GATE_DATABASE_URL"), "admin URL of a Postgres server to use (empty: start a private one)")
	only := fs.String("only", "", "comma-separated sections to run (shuffles,discovery,storm,converge,revocation); the checker self-test and the invariants always run")
	resources := fs.Int("resources", 1000, "active resources of the convergence run (R28)")
	revocations := fs.Int("revocations", 1000, "principals revoked with reads in flight for the revocation latency (R29)")
	stormResources := fs.Int("storm-resources", 50, "resources of the duplicate-notification storm (R27), each changed --storm-rounds times and notified 100 times per change")
	stormRounds := fs.Int("storm-rounds", 10, "changes of every storm resource, one round each (R27)")
	convergeFor := fs.Duration("converge-for", 60*time.Second, "how long the convergence run (R28) mutates resources, per era")
	logLevel := fs.String("log-level", "warn", "log level of the deployment's component logs")
	logFile := fs.String("log-file", "", "file for the component logs of the deployment (empty: a new file in the temporary directory); the console shows only progress and the table")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *shuffles < 0 || *resources <= 0 || *revocations <= 0 || *stormResources <= 0 || *stormRounds <= 0 || *convergeFor <= 0 {
		fmt.Fprintln(stderr, "usage: mcpsync gate [--shuffles N] [--resources N] [--converge-for D] [--revocations N] [--storm-resources N] [--storm-rounds N] [--only a,b] [--json] [--database URL]")
		return 2
	}
	opts := Options{AdminURL: *database, Progress: stderr, Shuffles: *shuffles, ConvergeResources: *resources, ConvergeFor: *convergeFor, Revocations: *revocations, StormResources: *stormResources, StormRounds: *stormRounds}
	if *only != "" {
		opts.Only = strings.Split(*only, ",")
		for _, s := range opts.Only {
			if !Known(s) {
				fmt.Fprintf(stderr, "mcpsync gate: unknown section %q (have %s)\n", s, strings.Join(Sections(), ", "))
				return 2
			}
		}
	}
	log, path, closeLog, err := fileLogger(*logLevel, *logFile)
	if err != nil {
		fmt.Fprintln(stderr, "mcpsync gate:", err)
		return 2
	}
	defer closeLog()
	opts.Logger = log
	fmt.Fprintf(stderr, "gate: component logs: %s\n", path)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := Run(ctx, opts)
	if err != nil {
		fmt.Fprintln(stderr, "mcpsync gate:", err)
		return 1
	}
	if *asJSON {
		err = res.WriteJSON(stdout)
	} else {
		err = res.WriteTable(stdout)
	}
	if err != nil || !res.Pass {
		return 1
	}
	return 0
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
