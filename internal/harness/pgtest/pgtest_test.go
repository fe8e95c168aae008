package pgtest_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctxFor(t), url)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func databaseExists(t *testing.T, name string) bool {
	t.Helper()
	var exists bool
	err := connect(t, pgtest.AdminURL()).QueryRow(ctxFor(t),
		`SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists)
	if err != nil {
		t.Fatal(err)
	}
	return exists
}

func TestNewDBHasSchemaAndIsIsolated(t *testing.T) {
	a, b := pgtest.NewDB(t), pgtest.NewDB(t)
	if a == b {
		t.Fatalf("two NewDB calls returned the same URL %s", a)
	}
	migs, err := dbschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var want []int
	for _, m := range migs {
		want = append(want, m.Version)
	}
	for _, url := range []string{a, b} {
		rows, err := connect(t, url).Query(ctxFor(t), `SELECT version FROM schema_migrations ORDER BY version`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: schema_migrations versions (-want +got):\n%s", url, diff)
		}
	}
	if _, err := connect(t, a).Exec(ctxFor(t), `CREATE TABLE only_in_a (x int)`); err != nil {
		t.Fatal(err)
	}
	var visible bool
	if err := connect(t, b).QueryRow(ctxFor(t), `SELECT to_regclass('only_in_a') IS NOT NULL`).Scan(&visible); err != nil {
		t.Fatal(err)
	}
	if visible {
		t.Errorf("a table created in one test database is visible in another")
	}
}

func TestDatabaseDroppedAtCleanupEvenWithOpenSessions(t *testing.T) {
	var name string
	t.Run("user", func(t *testing.T) {
		pool := pgtest.NewPool(t)
		if err := pool.QueryRow(ctxFor(t), `SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
		// A session the test forgets to close must not keep the database alive.
		leaked, err := pgx.Connect(ctxFor(t), pool.Config().ConnString())
		if err != nil {
			t.Fatal(err)
		}
		_ = leaked
	})
	if !strings.HasPrefix(name, "t_") {
		t.Fatalf("database name %q does not start with t_", name)
	}
	if databaseExists(t, name) {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestNewEmptyDBHasNoSchema(t *testing.T) {
	var present bool
	err := connect(t, pgtest.NewEmptyDB(t)).QueryRow(ctxFor(t), `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&present)
	if err != nil {
		t.Fatal(err)
	}
	if present {
		t.Errorf("NewEmptyDB returned a database with schema_migrations")
	}
}

// TestNoServerFails runs this test binary again without a usable server and checks that a test
// asking for a database fails, naming the reason, instead of skipping or passing.
func TestNoServerFails(t *testing.T) {
	tests := []struct {
		name string
		env  []string
		want string
	}{
		{
			name: "unreachable server in the environment",
			env:  []string{pgtest.EnvDatabaseURL + "=postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=5"},
			want: "pgtest: create database",
		},
		{
			name: "no binaries for a private cluster",
			env:  []string{pgtest.EnvDatabaseURL + "=", "PG_BIN=" + t.TempDir()},
			want: "apt-get install -y postgresql",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.CommandContext(ctxFor(t), os.Args[0], "-test.run=^TestHelperNeedsDatabase$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), append(tt.env, "PGTEST_HELPER=1")...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("test binary without a server: err=%v, want a non-zero exit; output:\n%s", err, out)
			}
			for _, want := range []string{"--- FAIL: TestHelperNeedsDatabase", tt.want} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}

// TestHelperNeedsDatabase is run by TestNoServerFails in a child process.
func TestHelperNeedsDatabase(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") != "1" {
		t.Skip("runs only as TestNoServerFails' child process")
	}
	pgtest.NewDB(t)
}

// TestCrashedBinaryLeavesNothing checks the panic path: a test binary that dies inside a test
// takes its private cluster down with it, and the next test binary removes its directory.
func TestCrashedBinaryLeavesNothing(t *testing.T) {
	child := exec.CommandContext(ctxFor(t), os.Args[0], "-test.run=^TestHelperPanics$", "-test.count=1", "-test.v")
	child.Env = append(os.Environ(), pgtest.EnvDatabaseURL+"=", "PGTEST_HELPER=panic")
	stdin, err := child.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = child.Stdout
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	// While the child lives, its directory cannot be swept by anybody: find it now.
	var admin string
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
		if u, ok := strings.CutPrefix(sc.Text(), "ADMIN_URL="); ok {
			admin = u
			break
		}
	}
	if admin == "" {
		_ = child.Wait()
		t.Fatalf("helper printed no admin URL:\n%s", out.String())
	}
	dirs := ownedBy(t, child.Process.Pid)
	if len(dirs) != 1 {
		t.Fatalf("cluster directories of the helper: %v, want exactly one", dirs)
	}
	stdin.Close() // the helper panics now
	for sc.Scan() {
		out.WriteString(sc.Text() + "\n")
	}
	if err := child.Wait(); err == nil || !strings.Contains(out.String(), "panic: deliberate") {
		t.Fatalf("helper did not panic: %v\n%s", err, out.String())
	}

	// The kernel sends the orphaned server SIGINT; wait until it has shut down, which is when
	// it removes its postmaster.pid.
	ctx := ctxFor(t)
	pidFile := filepath.Join(dirs[0], "data", "postmaster.pid")
	for {
		if _, err := os.Stat(pidFile); errors.Is(err, os.ErrNotExist) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the crashed binary's server (%s) is still running", pidFile)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if conn, err := pgx.Connect(ctx, admin); err == nil {
		conn.Close(ctx)
		t.Fatalf("the crashed binary's server at %s still answers", admin)
	}

	next := exec.CommandContext(ctxFor(t), os.Args[0], "-test.run=^$")
	next.Env = append(os.Environ(), pgtest.EnvDatabaseURL+"=")
	if out, err := next.CombinedOutput(); err != nil {
		t.Fatalf("next test binary: %v\n%s", err, out)
	}
	if left := ownedBy(t, child.Process.Pid); len(left) != 0 {
		t.Errorf("directories of the crashed binary left after the next run: %v", left)
	}
}

// ownedBy lists private cluster directories whose owner.pid names pid.
func ownedBy(t *testing.T, pid int) []string {
	t.Helper()
	all, err := filepath.Glob("/tmp/mcpsync-pgtest-*/owner.pid")
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, f := range all {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(pid) {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	return dirs
}

// TestHelperPanics is run by TestCrashedBinaryLeavesNothing in a child process.
func TestHelperPanics(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") != "panic" {
		t.Skip("runs only as TestCrashedBinaryLeavesNothing's child process")
	}
	pgtest.NewDB(t)
	fmt.Printf("ADMIN_URL=%s\n", pgtest.AdminURL())
	_, _ = io.Copy(io.Discard, os.Stdin) // until the parent closes stdin
	panic("deliberate")
}
