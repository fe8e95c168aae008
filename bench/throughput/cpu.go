package throughput

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/mcpsync/mcpsync/internal/harness/benchline"
	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/harness/pgstat"
)

// cpuReading is the CPU time used so far by the machine and by the stack's processes.
type cpuReading struct {
	// busy and total are the whole machine's (/proc/stat): busy CPU time, and busy + idle;
	// kernel is the part of busy spent in the kernel (system, irq, softirq).
	busy, total, kernel time.Duration
	// self is this process: the embedded Temporal server (or the in-memory one), the test MCP
	// server, the mutator and the outbox tail, and for the floor its worker and signaller.
	self time.Duration
	// pg is the PostgreSQL clusters this process started (the ledger's, and Temporal's with
	// the embedded server's postgres persistence), every backend with the ended ones.
	pg time.Duration
	// worker is the mcpsync-worker process and what it started (0 with -worker inprocess,
	// whose CPU is in self).
	worker time.Duration
	// db is each database's statistics on the ledger's cluster (with the embedded server's
	// postgres persistence, Temporal's databases are on it too), by role (dbRole).
	db map[string]pgstat.DB
	// backends is each client backend of that cluster with its database's role and its CPU
	// time so far; dbCPU, set by sub, what each role's backends used (active time counts
	// waits, so only this splits PostgreSQL's CPU between the ledger and Temporal's stores).
	backends map[int]pgstat.Backend
	dbCPU    map[string]time.Duration
}

// readCPU reads the machine's CPU time, the stack's processes' (workerPID 0: none) and the
// statistics of the databases on the cluster of the ledger's pool (nil when unreadable: the
// figures that need them are left out).
func readCPU(ctx context.Context, pool pgstat.Querier, ledgerDB string, workerPID int) cpuReading {
	all := cpustat.All() // one look at /proc for the trees and their times
	r := cpuReading{self: cpustat.Self()}
	if dbs, err := pgstat.Databases(ctx, pool); err == nil {
		r.db = map[string]pgstat.DB{}
		for name, v := range dbs {
			r.db[dbRole(name, ledgerDB)] = v
		}
	}
	if bs, err := pgstat.Backends(ctx, pool); err == nil {
		for pid, b := range bs {
			// Started since the look at /proc: zero now, whole in the next reading.
			bs[pid] = pgstat.Backend{DB: dbRole(b.DB, ledgerDB), CPU: all[pid].Own}
		}
		r.backends = bs
	}
	m, _ := cpustat.Machine()
	r.busy, r.total, r.kernel = m.Busy, m.Total, m.Kernel
	me := os.Getpid()
	for _, p := range cpustat.Descendants(all, me) {
		if all[p].PPID == me && cpustat.Comm(p) == "postgres" {
			r.pg += cpustat.TreeTime(all, p)
		}
	}
	if workerPID > 0 {
		r.worker = cpustat.TreeTime(all, workerPID)
	}
	return r
}

// dbRole names a database of the stack by what it holds, the same in every run (the stack's
// databases have random names): ledger, temporal, temporal-visibility; any other keeps its name.
func dbRole(name, ledgerDB string) string {
	switch {
	case name == ledgerDB:
		return "ledger"
	case strings.HasSuffix(name, "_temporal_visibility"):
		return "temporal-visibility"
	case strings.HasSuffix(name, "_temporal"):
		return "temporal"
	}
	return name
}

// sub is the CPU used between earlier and r.
func (r cpuReading) sub(earlier cpuReading) cpuReading {
	d := cpuReading{
		busy: r.busy - earlier.busy, total: r.total - earlier.total, kernel: r.kernel - earlier.kernel, self: r.self - earlier.self,
		pg: r.pg - earlier.pg, worker: r.worker - earlier.worker,
	}
	if r.db != nil && earlier.db != nil {
		d.db = pgstat.Sub(r.db, earlier.db)
	}
	if r.backends != nil && earlier.backends != nil {
		d.dbCPU = pgstat.CPUByDB(r.backends, earlier.backends)
	}
	return d
}

// idleCPU is the CPU the machine and the stack's processes use in d with nothing offered:
// the stack's background work (timers, pollers, housekeeping).
func idleCPU(ctx context.Context, read func() cpuReading, d time.Duration) (cpuReading, error) {
	r0 := read()
	select {
	case <-ctx.Done():
		return cpuReading{}, ctx.Err()
	case <-time.After(d):
	}
	return read().sub(r0), nil
}

// cores is how many cores v of CPU time keeps busy over the wall time of r (its machine total
// over the number of CPUs).
func (r cpuReading) cores(v time.Duration) float64 {
	wall := float64(r.total) / float64(runtime.NumCPU())
	return float64(v) / max(wall, 1)
}

// cpuCost is the CPU a phase used, the updates it accepted in that time, and the CPU the same
// stack used idle over a span of its own (zero: not measured).
type cpuCost struct {
	used    cpuReading
	updates int
	idle    cpuReading
}

// perUpdate is v per accepted update in milliseconds.
func (c cpuCost) perUpdate(v time.Duration) float64 {
	return float64(v) / float64(time.Millisecond) / float64(max(c.updates, 1))
}

// marginal is the machine's busy time per accepted update in milliseconds beyond what the
// stack uses idle over the same time; the gross figure when idle was not measured.
func (c cpuCost) marginal() float64 {
	idle := 0.0
	if c.idle.total > 0 {
		idle = c.idle.cores(c.idle.busy) * float64(c.used.total) / float64(runtime.NumCPU())
	}
	return (float64(c.used.busy) - idle) / float64(time.Millisecond) / float64(max(c.updates, 1))
}

// coresAt is how many cores rate updates per second keep busy at c's cost: the idle stack's
// cores and the marginal cost of each update.
func (c cpuCost) coresAt(rate float64) float64 {
	idle := 0.0
	if c.idle.total > 0 {
		idle = c.idle.cores(c.idle.busy)
	}
	return idle + c.marginal()*rate/1000
}

// printCPU prints what one accepted update cost the machine, each process and each database
// in e2e (mcpsync at the offered rate), each beside the floor's when fl is set; the stack's
// idle cores and the marginal cost of an update; the share of the machine that was busy and
// the kernel's share of that; and how many cores the offered rate keeps busy at that cost.
func printCPU(out io.Writer, n int, rate float64, e2e cpuCost, fl *cpuCost) {
	// figure is one figure of e2e's named what, and the floor's beside it when there is one.
	figure := func(what, unit string, v func(cpuCost) float64) {
		m := benchline.Figure{Name: fmt.Sprintf("e2e-%s-%d", what, n), Value: v(e2e), Unit: unit}
		if fl == nil {
			benchline.Print(out, m)
			return
		}
		benchline.PrintVs(out, m, benchline.Figure{Name: fmt.Sprintf("floor-%s-%d", what, n), Value: v(*fl), Unit: unit})
	}
	// msPer is the CPU time v picks from a phase's readings, per accepted update.
	msPer := func(v func(cpuReading) time.Duration) func(cpuCost) float64 {
		return func(c cpuCost) float64 { return c.perUpdate(v(c.used)) }
	}
	figure("cpu-per-update", "ms", msPer(func(r cpuReading) time.Duration { return r.busy }))
	figure("cpu-this-process-per-update", "ms", msPer(func(r cpuReading) time.Duration { return r.self }))
	figure("cpu-postgres-per-update", "ms", msPer(func(r cpuReading) time.Duration { return r.pg }))
	if e2e.used.worker > 0 {
		benchline.Print(out, benchline.Figure{Name: fmt.Sprintf("e2e-cpu-worker-per-update-%d", n), Value: e2e.perUpdate(e2e.used.worker), Unit: "ms"})
	}
	// Each of the stack's databases: transactions and active time per update (the floor's
	// beside them only if the floor's phase was read too).
	busy := pgstat.Busy(e2e.used.db, max(e2e.updates, 1), 0.05)
	for _, role := range busy {
		xacts := func(c cpuCost) float64 { return float64(c.used.db[role].Xacts) / float64(max(c.updates, 1)) }
		active := func(c cpuCost) float64 { return c.perUpdate(c.used.db[role].Active) }
		if fl != nil && fl.used.db == nil {
			benchline.Print(out, benchline.Figure{Name: fmt.Sprintf("e2e-pg-xacts-%s-per-update-%d", role, n), Value: xacts(e2e), Unit: "transactions"})
			benchline.Print(out, benchline.Figure{Name: fmt.Sprintf("e2e-pg-active-%s-per-update-%d", role, n), Value: active(e2e), Unit: "ms"})
			continue
		}
		figure("pg-xacts-"+role+"-per-update", "transactions", xacts)
		figure("pg-active-"+role+"-per-update", "ms", active)
	}
	// The CPU of each database's backends per update (the floor's beside it where the floor
	// used that database), when the backends could be read.
	for _, role := range busy {
		if e2e.used.dbCPU == nil {
			break
		}
		cpu := func(c cpuCost) float64 { return c.perUpdate(c.used.dbCPU[role]) }
		if fl != nil {
			if _, ok := fl.used.dbCPU[role]; ok {
				figure("cpu-postgres-"+role+"-per-update", "ms", cpu)
				continue
			}
		}
		benchline.Print(out, benchline.Figure{Name: fmt.Sprintf("e2e-cpu-postgres-%s-per-update-%d", role, n), Value: cpu(e2e), Unit: "ms"})
	}
	if e2e.idle.total > 0 {
		figure("idle-cores", "cores", func(c cpuCost) float64 { return c.idle.cores(c.idle.busy) })
		figure("cpu-marginal-per-update", "ms", cpuCost.marginal)
	}
	figure("machine-busy", "", func(c cpuCost) float64 { return float64(c.used.busy) / float64(max(c.used.total, 1)) })
	// The share of that busy time spent in the kernel: system calls, the loopback network
	// between the stack's processes, disk flushes, scheduling (read beside `mcpsync-bench
	// machine`'s cost of one kernel entry on this machine).
	figure("machine-kernel-share", "", func(c cpuCost) float64 { return float64(c.used.kernel) / float64(max(c.used.busy, 1)) })
	// At this cost, the offered rate keeps this many cores busy: a lower bound on the cores it
	// needs (latency needs idle time beside it).
	cores := benchline.Figure{Name: "machine-cores", Value: float64(runtime.NumCPU()), Unit: "cores"}
	at := func(prefix string, c cpuCost) benchline.Figure {
		return benchline.Figure{Name: fmt.Sprintf("%s-cores-busy-at-%.0f", prefix, rate), Value: c.coresAt(rate), Unit: "cores"}
	}
	benchline.PrintVs(out, at("e2e", e2e), cores)
	if fl != nil {
		benchline.PrintVs(out, at("floor", *fl), cores)
	}
}

// describe says what the readings cover, for the run's log.
func (r cpuReading) describe() string {
	parts := []string{fmt.Sprintf("machine busy %s of %s", r.busy.Round(time.Millisecond), r.total.Round(time.Millisecond)),
		fmt.Sprintf("this process %s", r.self.Round(time.Millisecond)), fmt.Sprintf("PostgreSQL %s", r.pg.Round(time.Millisecond))}
	if r.worker > 0 {
		parts = append(parts, fmt.Sprintf("mcpsync-worker %s", r.worker.Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}
