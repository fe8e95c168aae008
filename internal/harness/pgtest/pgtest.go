// Package pgtest gives tests real PostgreSQL databases. A package's TestMain calls Main; each
// test then calls NewDB (or NewPool) for a brand-new database with the project's schema
// applied, dropped when the test ends.
//
// The server is the one named by MCPSYNC_TEST_DATABASE_URL (an admin URL whose database is
// `postgres`, e.g. from `testpg start`) or, when that is unset, a private cluster that Main
// starts for the test binary from the machine's PostgreSQL binaries and stops when the tests
// end. A test that needs a database and cannot get one fails with the reason; it never skips.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
)

// EnvDatabaseURL names the environment variable holding the admin URL of a PostgreSQL server
// to use instead of starting a private cluster.
const EnvDatabaseURL = "MCPSYNC_TEST_DATABASE_URL"

// ClusterSettings returns the server parameters of every test cluster: the private ones Main
// starts and the shared one of `testpg` (make test). The packages' tests share that one server,
// two test binaries at a time, and an embedded Temporal server on PostgreSQL alone keeps pools
// per service and store; at PostgreSQL's default max_connections (100) a new connection could
// be refused mid-test, and a Temporal server that cannot read its namespaces at start ends the
// whole test binary.
func ClusterSettings() map[string]string {
	return map[string]string{"max_connections": "500"}
}

// dirPrefix names the temporary directories of private test clusters under /tmp.
const dirPrefix = "mcpsync-pgtest-"

// errNoMain is the reason NewDB fails when neither Main ran nor the environment names a server.
var errNoMain = errors.New("pgtest.Main was not called: add `func TestMain(m *testing.M) { pgtest.Main(m) }` to the package's tests")

var (
	mainRan  bool
	adminURL string
	setupErr error
)

// server returns the admin URL to use, or why there is none.
func server() (string, error) {
	if mainRan {
		return adminURL, setupErr
	}
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		return u, nil
	}
	return "", errNoMain
}

// Main runs the package's tests (call it from TestMain) against the server named by
// MCPSYNC_TEST_DATABASE_URL or, when that is unset, against a private cluster it starts in a
// temporary directory on a free port and stops, removing its data, when m.Run returns. It
// installs PostgreSQL first when the binaries are missing and the process is root. If no
// server is available the tests still run and every NewDB call fails with the reason. Main
// exits the process with m.Run's exit code.
//
// If the test binary dies without returning from m.Run (a panic in a test, a timeout), the
// cluster receives SIGINT from the kernel and shuts down; the next Main removes the temporary
// directories left by test binaries that are gone.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main without the exit: it returns m.Run's code, for a TestMain that has its own
// clean-up to do after the tests and the private cluster are done.
func Run(m *testing.M) int {
	mainRan = true
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		adminURL = u
		return m.Run()
	}
	stop, err := startPrivate()
	if err != nil {
		setupErr = fmt.Errorf("no PostgreSQL for tests: set %s to an admin URL, or let pgtest start a private cluster: %w", EnvDatabaseURL, err)
		fmt.Fprintln(os.Stderr, "pgtest:", setupErr)
		return m.Run()
	}
	defer stop()
	return m.Run()
}

// startPrivate starts a cluster for this test binary and returns the function that stops it.
func startPrivate() (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	log := stderrLogger()
	removeAbandoned()
	if err := pgcluster.EnsureInstalled(ctx, log); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("/tmp", dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("create cluster directory: %w", err)
	}
	// The cluster's OS user (postgres, when we are root) must traverse this directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("chmod %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("write owner.pid: %w", err)
	}
	var c *pgcluster.Cluster
	for attempt := 0; ; attempt++ {
		c, err = pgcluster.Start(ctx, pgcluster.Options{
			DataDir:   filepath.Join(dir, "data"),
			SocketDir: filepath.Join(dir, "sock"),
			Logger:    log,
			NoFsync:   true,
			Settings:  ClusterSettings(),
		})
		var inUse *pgcluster.PortInUseError
		if err == nil || !errors.As(err, &inUse) || attempt == 2 {
			break // a free port picked by Start can be taken by a parallel binary: retry then
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	adminURL = c.AdminURL()
	return func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Stop(stopCtx); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: stop cluster:", err)
		}
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: remove cluster directory:", err)
		}
	}, nil
}

// removeAbandoned deletes cluster directories of test binaries that died without cleaning up.
func removeAbandoned() {
	dirs, _ := filepath.Glob(filepath.Join("/tmp", dirPrefix+"*"))
	for _, dir := range dirs {
		if !pidFileDead(filepath.Join(dir, "owner.pid")) || !pidFileDead(filepath.Join(dir, "data", "postmaster.pid")) {
			continue // its test binary, or its server, is still running
		}
		_ = os.RemoveAll(dir)
	}
}

// pidFileDead reports whether the PID on the first line of file names no live process (true
// when the file does not exist; false when it cannot be read or parsed).
func pidFileDead(file string) bool {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return true
	} else if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func stderrLogger() *zap.Logger {
	cfg := zap.NewDevelopmentConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.DisableStacktrace = true
	cfg.DisableCaller = true
	log, err := cfg.Build()
	if err != nil {
		return zap.NewNop()
	}
	return log
}

// AdminURL is the URL of the test server's `postgres` database, or "" when no server is
// available (Main could not start one, or Main did not run and MCPSYNC_TEST_DATABASE_URL is
// unset).
func AdminURL() string {
	u, _ := server()
	return u
}

// NewEmptyDB creates a brand-new, empty database (no schema) named t_<random> and returns its
// URL. The database is dropped, disconnecting any sessions still open, when the test ends. It
// fails the test when no server is available.
func NewEmptyDB(t testing.TB) string {
	t.Helper()
	base, err := server()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	admin, err := url.Parse(base)
	if err != nil || (admin.Scheme != "postgres" && admin.Scheme != "postgresql") {
		t.Fatalf("pgtest: %s must be a postgres:// URL, got %q (parse error: %v)", EnvDatabaseURL, base, err)
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatalf("pgtest: random database name: %v", err)
	}
	name := "t_" + hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := adminExec(ctx, base, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := adminExec(ctx, base, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	dbURL := *admin
	dbURL.Path = "/" + name
	dbURL.RawPath = ""
	return dbURL.String()
}

// NewDB creates a brand-new database like NewEmptyDB, applies the project's schema to it with
// dbschema.Apply, and returns its URL.
func NewDB(t testing.TB) string {
	t.Helper()
	dbURL := NewEmptyDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("pgtest: open %s: %v", dbURL, err)
	}
	defer pool.Close()
	if _, err := dbschema.Apply(ctx, pool); err != nil {
		t.Fatalf("pgtest: apply schema: %v", err)
	}
	return dbURL
}

// NewPool returns a connection pool on a database made by NewDB; the pool is closed before the
// database is dropped at the end of the test.
func NewPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	dbURL := NewDB(t)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatalf("pgtest: open %s: %v", dbURL, err)
	}
	t.Cleanup(pool.Close) // cleanups run last-in first-out: before the drop
	return pool
}

func adminExec(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", admin, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return err
	}
	return nil
}
