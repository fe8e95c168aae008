package pgstat_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/harness/pgstat"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestSubAndBusy(t *testing.T) {
	earlier := map[string]pgstat.DB{"app": {Active: time.Second, Xacts: 100}, "postgres": {Xacts: 7}}
	later := map[string]pgstat.DB{
		"app": {Active: 3 * time.Second, Xacts: 300}, "postgres": {Xacts: 8}, "new": {Active: time.Millisecond, Xacts: 50},
	}
	d := pgstat.Sub(later, earlier)
	want := map[string]pgstat.DB{"app": {Active: 2 * time.Second, Xacts: 200}, "postgres": {Xacts: 1}, "new": {Active: time.Millisecond, Xacts: 50}}
	if diff := cmp.Diff(want, d); diff != "" {
		t.Errorf("Sub (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"app", "new"}, pgstat.Busy(d, 100, 0.05)); diff != "" {
		t.Errorf("Busy (-want +got):\n%s", diff)
	}
	if got := pgstat.Busy(d, 0, 0.05); len(got) != 0 {
		t.Errorf("Busy of no units = %v", got)
	}
}

// The real pg_stat_database: transactions on a fresh database show in its row, once the
// backend has flushed its statistics.
func TestDatabases(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	name := conn.Config().Database
	before, err := pgstat.Databases(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	for range n {
		if _, err := conn.Exec(ctx, "SELECT pg_sleep(0.001)"); err != nil {
			t.Fatal(err)
		}
	}
	// A backend flushes its statistics when it ends (an idle one may hold them back for up
	// to 10 s); another backend reads them.
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, err := pgstat.Databases(ctx, admin)
		if err != nil {
			t.Fatal(err)
		}
		d := pgstat.Sub(after, before)[name]
		if d.Xacts >= n && d.Active >= n*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("database %s: %+v after %d transactions of 1 ms", name, d, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestCPUByDB(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	earlier := map[int]pgstat.Backend{
		10: {DB: "ledger", CPU: ms(100)},
		11: {DB: "ledger", CPU: ms(50)},
		12: {DB: "temporal", CPU: ms(70)}, // ended before later
		13: {DB: "temporal", CPU: ms(900)},
	}
	later := map[int]pgstat.Backend{
		10: {DB: "ledger", CPU: ms(160)},   // 60 since earlier
		11: {DB: "ledger", CPU: ms(50)},    // idle
		13: {DB: "visibility", CPU: ms(5)}, // the process ID reused by a new backend: whole
		14: {DB: "temporal", CPU: ms(30)},  // new: whole
	}
	want := map[string]time.Duration{"ledger": ms(60), "temporal": ms(30), "visibility": ms(5)}
	if diff := cmp.Diff(want, pgstat.CPUByDB(later, earlier)); diff != "" {
		t.Errorf("CPUByDB (-want +got):\n%s", diff)
	}
}

// The real pg_stat_activity: each connection's backend is listed under its database, the
// reader's own too.
func TestBackends(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewEmptyDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	admin, err := pgx.Connect(ctx, pgtest.AdminURL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	pid := func(c *pgx.Conn) int {
		var pid int
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			t.Fatal(err)
		}
		return pid
	}
	connPID, adminPID := pid(conn), pid(admin)
	bs, err := pgstat.Backends(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int]pgstat.Backend{connPID: {DB: conn.Config().Database}, adminPID: {DB: admin.Config().Database}}
	got := map[int]pgstat.Backend{connPID: bs[connPID], adminPID: bs[adminPID]}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("backends (-want +got):\n%s", diff)
	}
}
