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

// Backend is one client backend of a cluster: the database it is connected to and the CPU
// time (user + system) it has used so far.
type Backend struct {
	DB  string
	CPU time.Duration
}

// Backends reads which database each client backend of q's cluster serves, by process ID,
// the reader's own included (a pool reads through a different one each time, and a backend
// left out of one reading would count whole in the next). The CPU times are the caller's to
// fill in (cpustat), since PostgreSQL does not report them.
func Backends(ctx context.Context, q Querier) (map[int]Backend, error) {
	rows, err := q.Query(ctx, `SELECT pid, datname FROM pg_stat_activity
		WHERE datname IS NOT NULL AND backend_type = 'client backend'`)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_activity: %w", err)
	}
	defer rows.Close()
	out := map[int]Backend{}
	for rows.Next() {
		var pid int
		var name string
		if err := rows.Scan(&pid, &name); err != nil {
			return nil, err
		}
		out[pid] = Backend{DB: name}
	}
	return out, rows.Err()
}

// CPUByDB is the CPU each database's backends used between two readings of Backends: a
// backend in both counts what it used since earlier, one new in later (or whose process ID
// now serves another database) counts whole, and one that ended in between is not counted —
// its time is only in the cluster's total, so the sum of the result is a lower bound of the
// backends' CPU, exact when no backend ended.
func CPUByDB(later, earlier map[int]Backend) map[string]time.Duration {
	out := map[string]time.Duration{}
	for pid, b := range later {
		used := b.CPU
		if e, ok := earlier[pid]; ok && e.DB == b.DB && e.CPU <= b.CPU {
			used -= e.CPU
		}
		out[b.DB] += used
	}
	return out
}
