package dbschema_test

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func openPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctxFor(t), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func allVersions(t *testing.T) []int {
	t.Helper()
	migs, err := dbschema.Migrations()
	if err != nil {
		t.Fatalf("Migrations: %v", err)
	}
	var vs []int
	for _, m := range migs {
		vs = append(vs, m.Version)
	}
	return vs
}

type migrationRow struct {
	Version int
	Name    string
}

func TestMigrationsAreWellFormed(t *testing.T) {
	migs, err := dbschema.Migrations()
	if err != nil {
		t.Fatalf("Migrations: %v", err)
	}
	if len(migs) == 0 {
		t.Fatal("no embedded migrations")
	}
	name := regexp.MustCompile(`^\d{4}_[a-z0-9_]+\.sql$`)
	for i, m := range migs {
		if !name.MatchString(m.Name) {
			t.Errorf("migration file %q is not named NNNN_description.sql", m.Name)
		}
		if i > 0 && m.Version <= migs[i-1].Version {
			t.Errorf("migration %s (version %d) is not after %s (version %d)", m.Name, m.Version, migs[i-1].Name, migs[i-1].Version)
		}
		if strings.TrimSpace(m.SQL) == "" {
			t.Errorf("migration %s is empty", m.Name)
		}
	}
}

func TestApplyIsIdempotent(t *testing.T) {
	ctx := ctxFor(t)
	pool := openPool(t, pgtest.NewEmptyDB(t))
	want := allVersions(t)

	first, err := dbschema.Apply(ctx, pool)
	if err != nil {
		t.Fatalf("first Apply: %v", err)
	}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("first Apply on an empty database applied (-want +got):\n%s", diff)
	}
	second, err := dbschema.Apply(ctx, pool)
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if len(second) != 0 {
		t.Errorf("second Apply applied %v, want nothing", second)
	}

	migs, err := dbschema.Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var wantRows []migrationRow
	for _, m := range migs {
		wantRows = append(wantRows, migrationRow{m.Version, m.Name})
	}
	rows, err := pool.Query(ctx, `SELECT version, name FROM schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	gotRows, err := pgx.CollectRows(rows, pgx.RowToStructByPos[migrationRow])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantRows, gotRows); diff != "" {
		t.Errorf("schema_migrations (-want +got):\n%s", diff)
	}
}

func TestConcurrentApplyRunsEachMigrationOnce(t *testing.T) {
	ctx := ctxFor(t)
	url := pgtest.NewEmptyDB(t)
	const starters = 4
	pools := make([]*pgxpool.Pool, starters)
	for i := range pools {
		pools[i] = openPool(t, url)
	}
	applied := make([][]int, starters)
	errs := make([]error, starters)
	var wg sync.WaitGroup
	for i := range starters {
		wg.Go(func() { applied[i], errs[i] = dbschema.Apply(ctx, pools[i]) })
	}
	wg.Wait()
	var all []int
	for i := range starters {
		if errs[i] != nil {
			t.Errorf("starter %d: %v", i, errs[i])
		}
		all = append(all, applied[i]...)
	}
	slices.Sort(all)
	if diff := cmp.Diff(allVersions(t), all); diff != "" {
		t.Errorf("migrations applied across concurrent starters (-want +got):\n%s", diff)
	}
}

// Migration 0018 moves the stored entries of every earlier round into chunks: a ledger
// upgraded from 0017 reads back the same entries, in the same order, as before the upgrade.
func TestEntryChunksMigrationKeepsEntries(t *testing.T) {
	ctx := ctxFor(t)
	pool := openPool(t, pgtest.NewEmptyDB(t))
	if _, err := dbschema.ApplyBelow(ctx, pool, 18); err != nil {
		t.Fatal(err)
	}
	// Two rounds' entries as 0002 stored them (the rounds' own rows are not what is migrated:
	// the foreign key to them is not checked in this session).
	err := pool.AcquireFunc(ctx, func(conn *pgxpool.Conn) error {
		if _, err := conn.Exec(ctx, `SET session_replication_role = replica`); err != nil {
			return err
		}
		_, err := conn.Exec(ctx, `INSERT INTO catalog_entry_batches (scan_id, batch, kind, server_uris, uris, names, mime_types) VALUES
		(7, 0, 'resource', '{DEMO://a,demo://b}', '{demo://a,demo://b}', '{A,B}', '{text/plain,""}'),
		(7, 1, 'template', ARRAY['demo://t/{x}'], NULL, '{T}', '{""}'),
		(9, 0, 'resource', '{demo://c}', NULL, '{C}', '{text/html}')`)
		if err == nil {
			_, err = conn.Exec(ctx, `RESET session_replication_role`)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	const entries = `SELECT scan_id || ' ' || kind || ' ' || uri || ' ' || server_uri || ' ' || name || ' ' || mime_type
		FROM catalog_entries ORDER BY scan_id, batch, ord`
	read := func() []string {
		rows, err := pool.Query(ctx, entries)
		if err != nil {
			t.Fatal(err)
		}
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	before := read()
	applied, err := dbschema.Apply(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(applied) == 0 || applied[0] != 18 {
		t.Fatalf("applied %v, want 18 first", applied)
	}
	want := []string{
		"7 resource demo://a DEMO://a A text/plain",
		"7 resource demo://b demo://b B ",
		"7 template demo://t/{x} demo://t/{x} T ",
		"9 resource demo://c demo://c C text/html",
	}
	if diff := cmp.Diff(want, before); diff != "" {
		t.Fatalf("entries before the upgrade (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, read()); diff != "" {
		t.Errorf("entries after the upgrade (-want +got):\n%s", diff)
	}
}
