// Command mcpsync-gate is mcpsync's release gate: it brings up a whole deployment in this
// process (Temporal, a Postgres ledger, workers, fault-injecting MCP servers), runs the seed's
// release measurements — 100,000 shuffled interleavings, discovery chaos, a duplicate
// notification storm, convergence with dropped notifications, revocation latency — and the
// R24 invariants, then prints the release table: metric, seed threshold, measured, pass/fail.
// It exits 0 if every row passes, 1 if any fails, 2 on bad flags. `mcpsync gate` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/mcpsync/mcpsync/internal/harness/gate"
	"github.com/mcpsync/mcpsync/internal/logging"
)

func main() {
	fs := flag.NewFlagSet("mcpsync gate", flag.ContinueOnError)
	shuffles := fs.Int("shuffles", 100000, "shuffled interleavings (R26)")
	asJSON := fs.Bool("json", false, "print the table as JSON")
	database := fs.String("database", os.Getenv("MCPSYNC_GATE_DATABASE_URL"), "admin URL of a Postgres server to use (empty: start a private one)")
	only := fs.String("only", "", "comma-separated sections to run (shuffles,discovery,storm,converge,revocation); the invariants always run")
	resources := fs.Int("resources", 1000, "active resources of the convergence run (R28)")
	logLevel := fs.String("log-level", "error", "log level of the deployment")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if fs.NArg() > 0 || *shuffles < 0 || *resources <= 0 {
		fmt.Fprintln(os.Stderr, "usage: mcpsync gate [--shuffles N] [--resources N] [--only a,b] [--json] [--database URL]")
		os.Exit(2)
	}
	log, err := logging.New(*logLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpsync gate:", err)
		os.Exit(2)
	}
	opts := gate.Options{AdminURL: *database, Progress: os.Stderr, Logger: log, Shuffles: *shuffles, ConvergeResources: *resources}
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
		os.Exit(1)
	}
	if *asJSON {
		err = res.WriteJSON(os.Stdout)
	} else {
		err = res.WriteTable(os.Stdout)
	}
	if err != nil || !res.Pass {
		os.Exit(1)
	}
}
