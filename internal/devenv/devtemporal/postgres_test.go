package devtemporal_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// freshPostgres names two databases that do not exist yet on the test server (Start creates
// them) and drops them when the test ends.
func freshPostgres(t *testing.T) *devtemporal.Postgres {
	t.Helper()
	admin := pgtest.AdminURL()
	if admin == "" {
		t.Fatalf("no PostgreSQL server for the test (%s, or PostgreSQL binaries for a private one)", pgtest.EnvDatabaseURL)
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	p := &devtemporal.Postgres{URL: admin, Database: "t_tmp_" + hex.EncodeToString(rnd[:])}
	p.VisibilityDatabase = p.Database + "_vis"
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop test databases: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, db := range []string{p.Database, p.VisibilityDatabase} {
			if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
				t.Errorf("drop %s: %v", db, err)
			}
		}
	})
	return p
}

// databaseURL is the server URL admin with its database replaced by db.
func databaseURL(t *testing.T, admin, db string) string {
	t.Helper()
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatal(err)
	}
	u.Path, u.RawPath = "/"+db, ""
	return u.String()
}

// Releasing the server lock (what Stop does) frees it before it returns, so a server started on
// the same database right after finds it free. Closing the lock's connection alone returned
// before the server's backend had dropped the lock; a restart under load then failed with
// ErrDatabaseInUse. Each round probes from a connection opened beforehand, at once.
func TestServerLockFreeWhenReleased(t *testing.T) {
	pg := freshPostgres(t)
	ctx := ctxFor(t)
	admin, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{pg.Database}.Sanitize())
	admin.Close(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dbURL := databaseURL(t, pg.URL, pg.Database)
	probe, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close(ctx)

	const rounds = 200
	for i := range rounds {
		held, err := devtemporal.LockDatabase(ctx, dbURL)
		if err != nil {
			t.Fatalf("round %d: lock: %v", i, err)
		}
		devtemporal.UnlockDatabase(held)
		var free bool
		if err := probe.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(devtemporal.ServerLockKey)).Scan(&free); err != nil {
			t.Fatal(err)
		}
		if !free {
			t.Fatalf("round %d of %d: server lock still held after it was released", i+1, rounds)
		}
		if _, err := probe.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(devtemporal.ServerLockKey)); err != nil {
			t.Fatal(err)
		}
	}
}

// On PostgreSQL the server creates both databases and their schemas, runs workflows, refuses a
// second server on the same database, and keeps every workflow and its search attributes over
// a restart in another data directory (the schema is not applied twice).
func TestPostgresPersistenceSurvivesRestart(t *testing.T) {
	pg := freshPostgres(t)
	opts := devtemporal.Options{DataDir: t.TempDir(), DisableUI: true, Persistence: devtemporal.PersistencePostgres, Postgres: pg}
	s := start(t, opts)
	c := dial(t, s)
	ctx := ctxFor(t)

	w := startGreeter(t, c)
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID:        "greet-pg",
		TaskQueue: taskQueue,
		TypedSearchAttributes: temporal.NewSearchAttributes(
			temporal.NewSearchAttributeKeyKeyword("McpsyncSource").ValueSet("demo-pg"),
		),
	}, Greet, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	var out string
	if err := run.Get(ctx, &out); err != nil {
		t.Fatalf("workflow: %v", err)
	}
	w.Stop()
	if want := "hello postgres from " + taskQueue; out != want {
		t.Errorf("workflow result %q, want %q", out, want)
	}

	t.Run("second server on the same database is refused", func(t *testing.T) {
		second := opts
		second.DataDir = t.TempDir() // another data directory: only the database lock can refuse
		_, err := devtemporal.Start(ctxFor(t), second)
		if !errors.Is(err, devtemporal.ErrDatabaseInUse) {
			t.Errorf("second Start on %s: %v, want ErrDatabaseInUse", pg.Database, err)
		}
	})

	c.Close()
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}

	// A new data directory: whatever the restarted server knows comes from PostgreSQL.
	if _, err := os.Stat(filepath.Join(opts.DataDir, devtemporal.DatabaseFileName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("PostgreSQL persistence left %s in the data directory (stat: %v)", devtemporal.DatabaseFileName, err)
	}
	opts.DataDir = t.TempDir()
	again := start(t, opts)
	c = dial(t, again)
	desc, err := c.DescribeWorkflowExecution(ctx, "greet-pg", "")
	if err != nil {
		t.Fatalf("describe greet-pg after restart: %v", err)
	}
	if st := desc.GetWorkflowExecutionInfo().GetStatus(); st != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
		t.Errorf("greet-pg after restart: status %s, want COMPLETED", st)
	}
	list, err := c.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Query: `McpsyncSource = "demo-pg"`})
	if err != nil {
		t.Fatalf("list by search attribute: %v", err)
	}
	var ids []string
	for _, e := range list.GetExecutions() {
		ids = append(ids, e.GetExecution().GetWorkflowId())
	}
	if diff := cmp.Diff([]string{"greet-pg"}, ids); diff != "" {
		t.Errorf("workflows with McpsyncSource=demo-pg after restart (-want +got):\n%s", diff)
	}
}

func TestPersistenceOptionsRejected(t *testing.T) {
	tests := []struct {
		name string
		opts devtemporal.Options
	}{
		{"unknown persistence", devtemporal.Options{Persistence: "cassandra"}},
		{"postgres without URL", devtemporal.Options{Persistence: devtemporal.PersistencePostgres}},
		{"not a postgres URL", devtemporal.Options{Persistence: devtemporal.PersistencePostgres, Postgres: &devtemporal.Postgres{URL: "mysql://u:secret@h/db"}}},
		{"same database twice", devtemporal.Options{Persistence: devtemporal.PersistencePostgres, Postgres: &devtemporal.Postgres{URL: "postgres://u:secret@127.0.0.1:1/db", Database: "x", VisibilityDatabase: "x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.opts.DataDir, tt.opts.DisableUI = t.TempDir(), true
			s, err := devtemporal.Start(ctxFor(t), tt.opts)
			if err == nil {
				s.Stop()
				t.Fatal("Start succeeded")
			}
			if msg := err.Error(); msg == "" || strings.Contains(msg, "secret") {
				t.Errorf("error %q is empty or shows the password", msg)
			}
		})
	}
}

func TestParsePersistence(t *testing.T) {
	tests := []struct {
		in   string
		want devtemporal.Persistence
		ok   bool
	}{
		{"sqlite", devtemporal.PersistenceSQLite, true},
		{"postgres", devtemporal.PersistencePostgres, true},
		{" PostgreSQL ", devtemporal.PersistencePostgres, true},
		{"memory", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		got, err := devtemporal.ParsePersistence(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("ParsePersistence(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}
