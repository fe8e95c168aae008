// Package cli is the mcpsync command line. Run executes one command and returns its exit
// code: 0 success, 1 failure (a service unreachable, an operation that did not complete), 2
// bad input (one clear line on stderr), 3 nothing found, 4 refused (a catalog the purpose may
// not have, see ExitRefused), 5 denied (no standing grant, ExitDenied), 6 the output guard
// rejected the content (ExitGuardRejected). Commands that report state accept --json.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Exit codes.
const (
	ExitOK       = 0
	ExitFailure  = 1
	ExitUsage    = 2
	ExitNotFound = 3
)

// exitError carries an exit code with its message.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &exitError{ExitUsage, fmt.Errorf(format, args...)}
}

func notFoundErr(format string, args ...any) error {
	return &exitError{ExitNotFound, fmt.Errorf(format, args...)}
}

// Env is what a command runs with. Zero fields are filled from the environment.
type Env struct {
	Stdout, Stderr io.Writer
	Config         config.Env
	// Store and Temporal, if set, are used instead of connecting (tests).
	Store    *ledger.Store
	Temporal client.Client
}

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, e *runEnv, args []string) error
}

var commands []command

func register(c command) { commands = append(commands, c) }

// runEnv carries lazily opened connections.
type runEnv struct {
	Env
	pool       *pgxpool.Pool
	ownsClient bool
}

func (e *runEnv) store(ctx context.Context) (*ledger.Store, error) {
	if e.Store != nil {
		return e.Store, nil
	}
	pool, err := pgxpool.New(ctx, e.Config.DatabaseURL)
	if err != nil {
		return nil, usageErr("DATABASE_URL %q: %v", e.Config.DatabaseURL, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("ledger database unreachable (%v); is mcpsync-dev running? (make run) or set DATABASE_URL", err)
	}
	// The schema must be exactly the one this build speaks: mcpsync-worker applies migrations
	// at start, and a CLI racing it (or older or newer than it) must not half-work.
	have, err := dbschema.Version(ctx, pool)
	if err == nil {
		var want int
		if want, err = dbschema.Latest(); err == nil && have != want {
			switch {
			case have == 0:
				err = fmt.Errorf("ledger database has no mcpsync schema; start mcpsync-worker once to apply migrations")
			case have < want:
				err = fmt.Errorf("ledger schema is at version %d, this mcpsync needs %d; start mcpsync-worker to apply migrations", have, want)
			default:
				err = fmt.Errorf("ledger schema is at version %d, newer than this mcpsync (%d); upgrade mcpsync", have, want)
			}
		}
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	e.pool = pool
	e.Store = ledger.New(pool)
	return e.Store, nil
}

func (e *runEnv) temporal(ctx context.Context) (client.Client, error) {
	if e.Temporal != nil {
		return e.Temporal, nil
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.DialContext(dctx, client.Options{
		HostPort: e.Config.TemporalAddress, Namespace: e.Config.Namespace, Logger: quietLogger{},
	})
	if err != nil {
		return nil, fmt.Errorf("temporal at %s unreachable (%v); is mcpsync-dev running? (make run) or set TEMPORAL_ADDRESS", e.Config.TemporalAddress, err)
	}
	e.Temporal, e.ownsClient = c, true
	return c, nil
}

func (e *runEnv) close() {
	if e.ownsClient {
		e.Temporal.Close()
	}
	if e.pool != nil {
		e.pool.Close()
	}
}

// sourceNamed returns the source called name, or a not-found error (exit 3) that says how to
// list the sources.
func sourceNamed(ctx context.Context, st *ledger.Store, name string) (ledger.Source, error) {
	src, err := st.SourceByName(ctx, name)
	if errors.Is(err, ledger.ErrNotFound) {
		return ledger.Source{}, notFoundErr("unknown source %q (see mcpsync source list)", name)
	}
	return src, err
}

// Run executes the command in args (without the program name) and returns the exit code.
func Run(ctx context.Context, env Env, args []string) int {
	if env.Config == (config.Env{}) {
		env.Config = config.FromEnv()
	}
	e := &runEnv{Env: env}
	defer e.close()
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		printUsage(env.Stdout)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	var cmd *command
	name := args[0]
	rest := args[1:]
	if name == "source" || name == "outbox" {
		if len(rest) == 0 {
			fmt.Fprintf(env.Stderr, "mcpsync %s: missing subcommand (see mcpsync help)\n", name)
			return ExitUsage
		}
		name, rest = name+" "+rest[0], rest[1:]
	}
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(env.Stderr, "mcpsync: unknown command %q (see mcpsync help)\n", name)
		return ExitUsage
	}
	err := cmd.run(ctx, e, rest)
	if err == nil {
		return ExitOK
	}
	fmt.Fprintf(env.Stderr, "mcpsync %s: %s\n", name, oneLine(err.Error()))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if errors.Is(err, ledger.ErrNotFound) {
		return ExitNotFound
	}
	if errors.Is(err, ledger.ErrInvalid) || errors.Is(err, ledger.ErrSourceExists) {
		return ExitUsage
	}
	return ExitFailure
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: mcpsync <command> [flags] [args]")
	fmt.Fprintln(w)
	sorted := append([]command(nil), commands...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range sorted {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "environment: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, DATABASE_URL (defaults match mcpsync-dev)")
	fmt.Fprintln(w, "exit codes: 0 ok, 1 failure, 2 bad input, 3 nothing found, 4 refused (catalog short of the purpose's proof level),")
	fmt.Fprintln(w, "            5 denied (no standing grant), 6 rejected by the output guard")
}

// parse parses flags that may appear before or after positional arguments, and checks the
// positional count is within [min, max] (max < 0: unbounded).
func parse(fs *flag.FlagSet, args []string, min, max int, usage string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, usageErr("usage: %s", usage)
			}
			return nil, usageErr("%v (usage: %s)", err, usage)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) < min || (max >= 0 && len(pos) > max) {
		return nil, usageErr("usage: %s", usage)
	}
	return pos, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// quietLogger silences the Temporal client's own logging in the CLI.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}
