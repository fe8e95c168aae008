// Package dbschema holds the ledger's SQL migrations, embedded in the binary, and applies them
// in order. Applying is idempotent: each migration runs once, in its own transaction, and is
// recorded in schema_migrations; concurrent starters serialize on an advisory lock.
package dbschema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var files embed.FS

// advisoryLockKey serializes concurrent Apply calls across processes.
const advisoryLockKey = 0x6d637073796e63 // "mcpsync"

// Migration is one embedded SQL file, identified by the number that starts its name.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// Migrations returns the embedded migrations in ascending version order. It fails if a file
// name does not start with a number or two files share a number.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, "migrations")
	if err != nil {
		return nil, fmt.Errorf("dbschema: read embedded migrations: %w", err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		if !ok {
			return nil, fmt.Errorf("dbschema: migration %q: name must be NNNN_description.sql", name)
		}
		v, err := strconv.Atoi(num)
		if err != nil {
			return nil, fmt.Errorf("dbschema: migration %q: bad version: %w", name, err)
		}
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("dbschema: migrations %q and %q share version %d", prev, name, v)
		}
		seen[v] = name
		body, err := fs.ReadFile(files, "migrations/"+name)
		if err != nil {
			return nil, fmt.Errorf("dbschema: read %q: %w", name, err)
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Apply runs every embedded migration that the database has not recorded yet, in version
// order, each in its own transaction together with its schema_migrations row. It returns the
// versions it applied (empty when the schema was current).
func Apply(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	migs, err := Migrations()
	if err != nil {
		return nil, err
	}
	return apply(ctx, pool, migs)
}

// apply is Apply over the migrations migs, in version order.
func apply(ctx context.Context, pool *pgxpool.Pool, migs []Migration) ([]int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("dbschema: acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, advisoryLockKey); err != nil {
		return nil, fmt.Errorf("dbschema: advisory lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, advisoryLockKey) //nolint:errcheck
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("dbschema: create schema_migrations: %w", err)
	}
	var applied []int
	for _, m := range migs {
		err := pgx.BeginFunc(ctx, conn.Conn(), func(tx pgx.Tx) error {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, m.Version).Scan(&exists); err != nil {
				return err
			}
			if exists {
				return nil
			}
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name); err != nil {
				return err
			}
			applied = append(applied, m.Version)
			return nil
		})
		if err != nil {
			return applied, fmt.Errorf("dbschema: apply %s: %w", m.Name, err)
		}
	}
	return applied, nil
}

// Latest returns the version of the newest embedded migration: the schema version this build
// of mcpsync needs.
func Latest() (int, error) {
	migs, err := Migrations()
	if err != nil {
		return 0, err
	}
	if len(migs) == 0 {
		return 0, nil
	}
	return migs[len(migs)-1].Version, nil
}

// Version returns the newest migration recorded in the database (0 for a database without
// mcpsync's schema).
func Version(ctx context.Context, pool *pgxpool.Pool) (int, error) {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("dbschema: version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := pool.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("dbschema: version: %w", err)
	}
	return v, nil
}
