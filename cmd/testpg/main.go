// Command testpg runs one PostgreSQL cluster for a whole test run, so that every test binary
// uses it (through MCPSYNC_TEST_DATABASE_URL) instead of starting its own.
//
//	testpg start --dir D --port-file F [--port N]
//	    Starts a cluster with its data in D, on port N (default: a free port), writes its admin
//	    URL to F once it accepts connections, and runs until SIGINT or SIGTERM; then it stops
//	    the cluster and removes F.
//	testpg run --dir D [--port N] -- COMMAND [ARG...]
//	    Starts the cluster, runs COMMAND with MCPSYNC_TEST_DATABASE_URL set to its admin URL,
//	    stops the cluster and exits with COMMAND's exit code.
//
// Test databases left behind by crashed test binaries (named t_*) are dropped at start. The
// cluster runs without fsync: it is for tests only. When the postgres OS user cannot reach D
// (running as root under a mode-0700 directory), the data lives in a private directory under
// /tmp instead and is removed when testpg exits. Exit codes: 0 success, 1 failure, 2 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

const usage = `usage:
  testpg start --dir D --port-file F [--port N]
  testpg run --dir D [--port N] -- COMMAND [ARG...]
`

func main() {
	os.Exit(realMain(os.Args[1:]))
}

func realMain(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("testpg "+sub, flag.ContinueOnError)
	dir := fs.String("dir", "", "data directory of the cluster (required)")
	port := fs.Int("port", 0, "TCP port on 127.0.0.1 (0: a free port)")
	portFile := fs.String("port-file", "", "file to write the admin URL to once ready (start)")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var level zap.AtomicLevel
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "testpg: bad --log-level %q\n", *logLevel)
		return 2
	}
	switch {
	case *dir == "":
		fmt.Fprint(os.Stderr, "testpg: --dir is required\n"+usage)
		return 2
	case sub == "start" && *portFile == "":
		fmt.Fprint(os.Stderr, "testpg: start needs --port-file\n"+usage)
		return 2
	case sub == "run" && fs.NArg() == 0:
		fmt.Fprint(os.Stderr, "testpg: run needs a command after --\n"+usage)
		return 2
	case sub != "start" && sub != "run":
		fmt.Fprintf(os.Stderr, "testpg: unknown command %q\n%s", sub, usage)
		return 2
	}
	cfg := zap.NewDevelopmentConfig()
	cfg.Level = level
	cfg.DisableStacktrace = true
	cfg.DisableCaller = true
	log, err := cfg.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testpg:", err)
		return 1
	}
	defer log.Sync() //nolint:errcheck

	// Signals end the run; they are caught before the cluster starts so none is lost.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)

	c, err := startCluster(log, *dir, *port)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testpg:", err)
		return 1
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "testpg:", err)
		}
		// Data moved to /tmp (the postgres user could not reach --dir) would outlive whoever
		// removes --dir; a test cluster is disposable, so remove it here.
		if c.Relocated() {
			<-c.Done()
			if err := c.RemoveData(); err != nil {
				fmt.Fprintln(os.Stderr, "testpg:", err)
			}
		}
	}()

	if sub == "run" {
		fmt.Fprintf(os.Stderr, "testpg: ready: %s (pid %d, data %s)\n", c.AdminURL(), c.PID(), c.DataDir())
		return runCommand(c, sigs, fs.Args())
	}
	if err := writeFileAtomic(*portFile, c.AdminURL()+"\n"); err != nil {
		fmt.Fprintln(os.Stderr, "testpg:", err)
		return 1
	}
	defer os.Remove(*portFile)
	fmt.Fprintf(os.Stderr, "testpg: ready: %s (pid %d, data %s)\n", c.AdminURL(), c.PID(), c.DataDir())
	select {
	case <-sigs:
		return 0
	case <-c.Done():
		fmt.Fprintf(os.Stderr, "testpg: postgres exited unexpectedly: %v\n", c.ExitError())
		return 1
	}
}

func startCluster(log *zap.Logger, dir string, port int) (*pgcluster.Cluster, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := pgcluster.EnsureInstalled(ctx, log); err != nil {
		return nil, err
	}
	c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Port: port, Logger: log, NoFsync: true, Settings: pgtest.ClusterSettings()})
	if err != nil {
		return nil, err
	}
	if err := dropTestDatabases(ctx, c.AdminURL()); err != nil {
		_ = c.Stop(ctx)
		return nil, err
	}
	return c, nil
}

// dropTestDatabases removes databases left by test binaries that died before their cleanup.
func dropTestDatabases(ctx context.Context, adminURL string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE 't\_%'`)
	if err != nil {
		return fmt.Errorf("list test databases: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("list test databases: %w", err)
	}
	for _, name := range names {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop leftover test database %s: %w", name, err)
		}
	}
	return nil
}

// runCommand runs argv with the cluster's admin URL in its environment, passing on SIGINT and
// SIGTERM, and returns its exit code.
func runCommand(c *pgcluster.Cluster, sigs <-chan os.Signal, argv []string) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), pgtest.EnvDatabaseURL+"="+c.AdminURL())
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "testpg:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				return max(exit.ExitCode(), 1)
			} else if err != nil {
				fmt.Fprintln(os.Stderr, "testpg:", err)
				return 1
			}
			return 0
		}
	}
}

func writeFileAtomic(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".testpg-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
