package pgcluster_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func testLogger(t *testing.T) *zap.Logger {
	return zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
}

// start starts a cluster and registers its stop and data removal with t.
func start(t *testing.T, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.Start(testContext(t), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		_ = c.Stop(context.Background())
		<-c.Done()
		if err := c.RemoveData(); err != nil {
			t.Errorf("RemoveData: %v", err)
		}
	})
	return c
}

func queryInt(t *testing.T, url, sql string) int {
	t.Helper()
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func exec(t *testing.T, url, sql string) {
	t.Helper()
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// processGone reports whether no process with pid exists any more.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// worldTraversableDir returns a fresh directory that every user can traverse (mode 0755 under
// /tmp), removed at the end of the test.
func worldTraversableDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/tmp", "pgcluster-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestStartStopRestartKeepsData(t *testing.T) {
	root := os.Geteuid() == 0
	tests := []struct {
		name string
		dir  func(t *testing.T) string
		// relocated: the data is expected in a private directory under /tmp, not in dir.
		relocated bool
	}{
		{name: "traversable parent", dir: func(t *testing.T) string { return filepath.Join(worldTraversableDir(t), "pg") }},
		// t.TempDir's parent is mode 0700: as root, the postgres user cannot reach it.
		{name: "private parent", dir: func(t *testing.T) string { return filepath.Join(t.TempDir(), "pg") }, relocated: root},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			opts := pgcluster.Options{DataDir: dir, Logger: testLogger(t), Database: "app"}
			c := start(t, opts)

			if got := c.DataDir() != dir; got != tt.relocated {
				t.Errorf("data dir %s for requested %s: relocated=%v, want %v", c.DataDir(), dir, got, tt.relocated)
			}
			if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); err != nil {
				t.Errorf("no PG_VERSION in %s: %v", c.DataDir(), err)
			}
			wantURL := "postgres://postgres@127.0.0.1:" + strconv.Itoa(c.Port()) + "/app?sslmode=disable"
			if c.URL() != wantURL {
				t.Errorf("URL() = %q, want %q", c.URL(), wantURL)
			}
			if got := queryInt(t, c.URL(), `SELECT count(*) FROM pg_database WHERE datname = current_database() AND datname = 'app'`); got != 1 {
				t.Fatalf("URL() does not reach database app")
			}
			exec(t, c.URL(), `CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)`)

			pid := c.PID()
			if err := c.Stop(testContext(t)); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			select {
			case <-c.Done():
			default:
				t.Fatal("Done not closed after Stop returned")
			}
			if !processGone(pid) {
				t.Fatalf("postgres PID %d still exists after Stop", pid)
			}
			if _, err := os.Stat(filepath.Join(c.DataDir(), "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("postmaster.pid after a clean stop: %v", err)
			}

			opts.Port = c.Port()
			again := start(t, opts)
			if again.DataDir() != c.DataDir() {
				t.Errorf("restart used %s, first run %s", again.DataDir(), c.DataDir())
			}
			if got := queryInt(t, again.URL(), `SELECT x FROM kept`); got != 42 {
				t.Errorf("after restart kept.x = %d, want 42", got)
			}
		})
	}
}

func TestPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := filepath.Join(worldTraversableDir(t), "pg")

	c, err := pgcluster.Start(testContext(t), pgcluster.Options{DataDir: dir, Port: port, Logger: testLogger(t)})
	if err == nil {
		_ = c.Stop(context.Background())
		t.Fatalf("Start on a taken port succeeded")
	}
	var pe *pgcluster.PortInUseError
	if !errors.As(err, &pe) || pe.Port != port {
		t.Fatalf("Start error = %v, want *PortInUseError for port %d", err, port)
	}
	if !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("error %q does not name port %d", err, port)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed Start created %s (stat: %v)", dir, err)
	}
}

func TestRestartAfterKill(t *testing.T) {
	dir := filepath.Join(worldTraversableDir(t), "pg")
	// Durable settings: a committed row must survive the crash through WAL recovery.
	opts := pgcluster.Options{DataDir: dir, Logger: testLogger(t)}
	c := start(t, opts)
	exec(t, c.URL(), `CREATE TABLE kept (x int); INSERT INTO kept VALUES (7)`)

	if err := syscall.Kill(c.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-c.Done()
	if _, err := os.Stat(filepath.Join(c.DataDir(), "postmaster.pid")); err != nil {
		t.Fatalf("a killed server should leave postmaster.pid behind: %v", err)
	}
	if err := c.Stop(testContext(t)); err == nil {
		t.Errorf("Stop of a server that died on its own returned nil")
	}

	again := start(t, opts)
	if got := queryInt(t, again.URL(), `SELECT x FROM kept`); got != 7 {
		t.Errorf("after kill and restart kept.x = %d, want 7", got)
	}
}

func TestDataDirInUse(t *testing.T) {
	dir := filepath.Join(worldTraversableDir(t), "pg")
	opts := pgcluster.Options{DataDir: dir, Logger: testLogger(t), NoFsync: true}
	first := start(t, opts)

	second, err := pgcluster.Start(testContext(t), opts)
	if err == nil {
		_ = second.Stop(context.Background())
		t.Fatal("a second cluster started on a data directory in use")
	}
	if !errors.Is(err, pgcluster.ErrDataDirInUse) {
		t.Fatalf("second Start error = %v, want ErrDataDirInUse", err)
	}
	if !strings.Contains(err.Error(), strconv.Itoa(first.PID())) {
		t.Errorf("error %q does not name the running server's PID %d", err, first.PID())
	}
	if got := queryInt(t, first.URL(), `SELECT 1`); got != 1 {
		t.Errorf("first cluster stopped answering")
	}
}

func TestBinariesMissing(t *testing.T) {
	t.Setenv("PG_BIN", t.TempDir())

	_, err := pgcluster.FindBinaries()
	if !errors.Is(err, pgcluster.ErrBinariesMissing) {
		t.Fatalf("FindBinaries with an empty PG_BIN: %v, want ErrBinariesMissing", err)
	}
	_, err = pgcluster.Start(testContext(t), pgcluster.Options{DataDir: filepath.Join(t.TempDir(), "pg")})
	if !errors.Is(err, pgcluster.ErrBinariesMissing) {
		t.Fatalf("Start with an empty PG_BIN: %v, want ErrBinariesMissing", err)
	}
	if !strings.Contains(err.Error(), "apt-get install -y postgresql") {
		t.Errorf("error %q does not say what to install", err)
	}
	// With PG_BIN set, installing a package cannot help: EnsureInstalled reports, never installs.
	if err := pgcluster.EnsureInstalled(testContext(t), zap.NewNop()); !errors.Is(err, pgcluster.ErrBinariesMissing) {
		t.Errorf("EnsureInstalled with an empty PG_BIN: %v, want ErrBinariesMissing", err)
	}
}

func TestFindBinaries(t *testing.T) {
	b, err := pgcluster.FindBinaries()
	if err != nil {
		t.Fatalf("FindBinaries: %v (these tests need PostgreSQL: %s)", err, pgcluster.InstallHint)
	}
	for _, p := range []string{b.Initdb, b.Postgres} {
		if filepath.Dir(p) != b.Dir || !filepath.IsAbs(p) {
			t.Errorf("binary %s not an absolute path in %s", p, b.Dir)
		}
	}
	t.Setenv("PG_BIN", b.Dir)
	viaEnv, err := pgcluster.FindBinaries()
	if err != nil || viaEnv != b {
		t.Errorf("FindBinaries with PG_BIN=%s = %+v, %v; want %+v", b.Dir, viaEnv, err, b)
	}
	if err := pgcluster.EnsureInstalled(testContext(t), zap.NewNop()); err != nil {
		t.Errorf("EnsureInstalled with binaries present: %v", err)
	}
}

// A postmaster.pid naming a live process that is not this cluster's server (its PID was reused)
// must not block a restart.
func TestStartIgnoresPIDFileOfUnrelatedProcess(t *testing.T) {
	dir := filepath.Join(worldTraversableDir(t), "pg")
	opts := pgcluster.Options{DataDir: dir, Logger: testLogger(t), NoFsync: true}
	c := start(t, opts)
	if err := c.Stop(testContext(t)); err != nil {
		t.Fatal(err)
	}
	// This test process is alive, and its working directory is not the data directory.
	pidFile := filepath.Join(c.DataDir(), "postmaster.pid")
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"+c.DataDir()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	again := start(t, opts)
	if got := queryInt(t, again.URL(), `SELECT 1`); got != 1 {
		t.Errorf("restarted cluster does not answer")
	}
}

// RemoveRelocated deletes the data that Start kept outside the requested directory (as root,
// when the postgres user cannot reach it), once the cluster stopped; data that lives in the
// requested directory itself is not touched.
func TestRemoveRelocated(t *testing.T) {
	root := os.Geteuid() == 0
	tests := []struct {
		name     string
		dir      func(t *testing.T) string
		wantGone bool
	}{
		{name: "traversable parent", dir: func(t *testing.T) string { return filepath.Join(worldTraversableDir(t), "pg") }},
		{name: "private parent", dir: func(t *testing.T) string { return filepath.Join(t.TempDir(), "pg") }, wantGone: root},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir(t)
			c := start(t, pgcluster.Options{DataDir: dir, Logger: testLogger(t)})
			if err := c.Stop(testContext(t)); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if err := pgcluster.RemoveRelocated(dir); err != nil {
				t.Fatal(err)
			}
			_, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION"))
			if gone := errors.Is(err, os.ErrNotExist); gone != tt.wantGone {
				t.Errorf("data in %s (requested %s) gone after RemoveRelocated: %v (stat: %v), want %v", c.DataDir(), dir, gone, err, tt.wantGone)
			}
			if tt.wantGone {
				if _, err := os.Stat(filepath.Dir(c.DataDir())); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("private directory %s left: %v", filepath.Dir(c.DataDir()), err)
				}
			}
		})
	}
}
