// Package pgstat reads PostgreSQL's cumulative per-database statistics (pg_stat_database), for
// the benchmarks' figures per unit of work: how many transactions, and how much time running
// statements, each database of a cluster spent on one update or one start.
package pgstat

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// DB is one database's statistics so far.
type DB struct {
	// Active is the time its backends spent running statements, waits included.
	Active time.Duration
	// Xacts is its committed and rolled-back transactions.
	Xacts int64
}

// Querier is what Databases queries through: a *pgx.Conn or a *pgxpool.Pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Databases reads every database's statistics on q's cluster. Each backend flushes its
// statistics at most about once a second, so a reading can lag by that much.
func Databases(ctx context.Context, q Querier) (map[string]DB, error) {
	rows, err := q.Query(ctx, `SELECT datname, coalesce(active_time, 0), xact_commit + xact_rollback
		FROM pg_stat_database WHERE datname IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_database: %w", err)
	}
	defer rows.Close()
	out := map[string]DB{}
	for rows.Next() {
		var name string
		var ms float64
		var x int64
		if err := rows.Scan(&name, &ms, &x); err != nil {
			return nil, err
		}
		out[name] = DB{Active: time.Duration(ms * float64(time.Millisecond)), Xacts: x}
	}
	return out, rows.Err()
}

// Sub is what each database of later did since earlier (a database new in later counts
// whole).
func Sub(later, earlier map[string]DB) map[string]DB {
	out := make(map[string]DB, len(later))
	for name, v := range later {
		e := earlier[name]
		out[name] = DB{Active: v.Active - e.Active, Xacts: v.Xacts - e.Xacts}
	}
	return out
}

// Busy names, sorted, the databases of d with at least minPer transactions per unit of n
// units: the databases a workload used, not the housekeeping of postgres and template1.
func Busy(d map[string]DB, n int, minPer float64) []string {
	var names []string
	for name, v := range d {
		if n > 0 && float64(v.Xacts)/float64(n) >= minPer {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
