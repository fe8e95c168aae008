package scale

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/harness/pgstat"
)

// cpuSet is the CPU time (user + system) used so far by the stack's processes: the worker
// with its children (the stdio MCP server), what starts the workflows (the bulk `mcpsync
// subscribe`; for the floor, this process, which is also the floor's worker), mcpsync-dev (the
// embedded Temporal server) and its PostgreSQL cluster (every backend, the ended ones through
// the postmaster's children times), each database's active time (pg_stat_database: time
// spent running statements, waits included) and the CPU time of each client backend with
// the database it serves (what splits PostgreSQL's CPU between the ledger, Temporal's store
// and its visibility store: active time is no measure of that, since it counts waits).
type cpuSet struct {
	worker, starter, dev, pg time.Duration
	db                       map[string]pgstat.DB
	backends                 map[int]pgstat.Backend
	dbCPU                    map[string]time.Duration // set by sub
}

// readCPU reads the CPU times of worker (0: none, e.g. the floor's worker in this process)
// and dev, and conn's cluster's per-database statistics (conn nil: none).
func readCPU(ctx context.Context, conn *pgx.Conn, worker, dev int) (cpuSet, error) {
	all := cpustat.All() // one look at /proc for the trees and their times
	withReaped := func(p int) time.Duration { return all[p].Own + all[p].Reaped }
	s := cpuSet{dev: all[dev].Own}
	if worker > 0 {
		s.worker = cpustat.TreeTime(all, worker)
	}
	for _, p := range cpustat.Descendants(all, dev) {
		if strings.HasPrefix(cpustat.Comm(p), "postgres") {
			s.pg += withReaped(p)
		}
	}
	if conn == nil {
		return s, nil
	}
	var err error
	if s.db, err = pgstat.Databases(ctx, conn); err != nil {
		return s, err
	}
	if s.backends, err = pgstat.Backends(ctx, conn); err != nil {
		return s, err
	}
	for pid, b := range s.backends {
		b.CPU = all[pid].Own // started since the look at /proc: zero now, whole in the next reading
		s.backends[pid] = b
	}
	return s, nil
}

// sub is the CPU used between earlier and s.
func (s cpuSet) sub(earlier cpuSet) cpuSet {
	return cpuSet{
		worker: s.worker - earlier.worker, starter: s.starter - earlier.starter, dev: s.dev - earlier.dev, pg: s.pg - earlier.pg,
		db: pgstat.Sub(s.db, earlier.db), dbCPU: pgstat.CPUByDB(s.backends, earlier.backends),
	}
}

// printCPU prints what n starts cost (d: the CPU used while they ran) as bench lines named
// after prefix, each beside base's figure for baseN starts when base is set (the floor).
func printCPU(prefix string, n int, d cpuSet, baseN int, base *cpuSet) {
	per := func(v time.Duration, n int) float64 { return float64(v) / float64(time.Millisecond) / float64(n) }
	line := func(name string, v time.Duration, b time.Duration, withBase bool) {
		if !withBase || b <= 0 {
			fmt.Printf("bench: %s-%s-per-start %.2f ms\n", prefix, name, per(v, n))
			return
		}
		fmt.Printf("bench: %s-%s-per-start %.2f ms (baseline floor-%s-per-start %.2f ms, ratio %.2f)\n",
			prefix, name, per(v, n), name, per(b, baseN), per(v, n)/per(b, baseN))
	}
	var b cpuSet
	if base != nil {
		b = *base
	}
	line("cpu", d.worker+d.starter+d.dev+d.pg, b.worker+b.starter+b.dev+b.pg, base != nil)
	line("cpu-server", d.dev+d.pg, b.dev+b.pg, base != nil)
	line("cpu-devtemporal", d.dev, b.dev, base != nil)
	line("cpu-postgres", d.pg, b.pg, base != nil)
	line("cpu-worker-and-starter", d.worker+d.starter, b.worker+b.starter, base != nil)
	if d.worker > 0 { // the floor's worker is this process, counted as its starter
		line("cpu-worker", d.worker, 0, false)
	}
	// The databases of the stack, not the few transactions of its housekeeping: the CPU of
	// their backends, then their active time (waits included) and transactions.
	busy := pgstat.Busy(d.db, n, 0.05)
	baseBusy := pgstat.Busy(b.db, baseN, 0.05) // the floor's cluster has an idle ledger database
	var inDBs time.Duration
	for _, name := range busy {
		line("cpu-postgres-"+name, d.dbCPU[name], b.dbCPU[name], slices.Contains(baseBusy, name))
		inDBs += d.dbCPU[name]
	}
	if len(busy) > 0 {
		// Background processes (WAL writer, checkpointer, autovacuum), the other databases
		// and backends that ended while the starts ran.
		line("cpu-postgres-other", d.pg-inDBs, 0, false)
	}
	for _, name := range busy {
		v := d.db[name]
		fmt.Printf("bench: %s-pg-active-%s-per-start %.2f ms, %.1f transactions\n", prefix, name, per(v.Active, n), float64(v.Xacts)/float64(n))
	}
}
