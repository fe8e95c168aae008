// Package persistence measures the embedded Temporal server (internal/devenv/devtemporal) on
// each persistence it offers, with the floor workload (internal/harness/floor: one entity
// workflow per subscription, signal → no-op local activity → loop) at the same offered rate,
// in one run (issue 16 item 2): the SQLite file (durable: rollback journal, synchronous
// writes) and PostgreSQL (durable: a private cluster started as `make run` starts it, fsync
// and synchronous_commit on; Temporal's two databases on it). The in-memory SQLite server the
// tests use (temporaltest) is measured beside them as a labelled reference: it keeps nothing
// over a restart, so it is never a candidate default. With -extra, PostgreSQL with
// synchronous_commit=off on Temporal's databases (a commit may be lost in a crash, the
// database stays consistent) is measured as a labelled extra.
//
// Every figure is printed as
//
//	bench: persistence-<name>-<figure> <value> <unit> (baseline persistence-memory-<figure> <value> <unit>, ratio <r>)
//
// go run ./bench persistence [-workflows 1000] [-rate 150] [-duration 20s] [-runs 1] [-extra] [-only sqlite,postgres]
// [-database postgres://...admin URL of a server to use instead of a private cluster]
package persistence

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/temporaltest"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/harness/floor"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench persistence` (bench/main.go) calls it.
func Main() {
	n := flag.Int("workflows", 1000, "entity workflows (subscriptions)")
	rate := flag.Float64("rate", 150, "offered signals per second")
	d := flag.Duration("duration", 20*time.Second, "length of each offered phase")
	drain := flag.Duration("drain", time.Minute, "after each offered phase, how long signals not yet handled are waited for (then they count as never accepted)")
	runs := flag.Int("runs", 1, "measurements of each persistence, interleaved (the median is reported)")
	extra := flag.Bool("extra", false, "also measure PostgreSQL with synchronous_commit=off (labelled; not durable)")
	only := flag.String("only", "", "comma-separated persistences to measure (default: all; memory is the baseline and always runs)")
	admin := flag.String("database", os.Getenv("MCPSYNC_BENCH_TEMPORAL_DATABASE_URL"), "admin URL of a PostgreSQL server for Temporal's databases (empty: start a private durable cluster, as make run does)")
	flag.Parse()
	if *n <= 0 || !(*rate > 0) || math.IsInf(*rate, 0) || *d <= 0 || *runs <= 0 || *drain <= 0 {
		fmt.Fprintln(os.Stderr, "persistence bench: -workflows, -rate, -duration, -drain and -runs must be positive, -rate finite")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *n, *rate, *d, *drain, *runs, *extra, *only, *admin); err != nil {
		fmt.Fprintln(os.Stderr, "persistence bench:", redact.Text(err.Error()))
		os.Exit(1)
	}
}

// variant is one persistence under test.
type variant struct {
	name  string
	label string
	// start brings a server up and returns a client on its namespace and a stop function.
	start func(ctx context.Context) (client.Client, func(), error)
}

func run(ctx context.Context, n int, rate float64, d, drain time.Duration, runs int, extra bool, only, admin string) error {
	tmp, err := os.MkdirTemp("", "mcpsync-persistence-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	log := zap.NewNop()
	pgPID := 0 // the private cluster's postmaster, whose CPU time (with its backends') is counted
	if admin == "" {
		if err := pgcluster.EnsureInstalled(ctx, log); err != nil {
			return err
		}
		// As mcpsync-dev starts it: durable (fsync, synchronous_commit on), password auth.
		password, err := pgcluster.NewPassword()
		if err != nil {
			return err
		}
		cl, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: tmp + "/pg", Password: password, Logger: log,
			Settings: map[string]string{"max_connections": "200"}})
		if err != nil {
			return fmt.Errorf("private PostgreSQL: %w", err)
		}
		defer func() {
			if err := cl.Stop(context.WithoutCancel(ctx)); err == nil {
				_ = cl.RemoveData() // the data may live in a private directory outside tmp
			}
		}()
		admin = cl.AdminURL()
		pgPID = cl.PID()
	}
	if err := describeServer(ctx, admin); err != nil {
		return err
	}

	seq := 0
	devStart := func(p devtemporal.Persistence, pg *devtemporal.Postgres) func(ctx context.Context) (client.Client, func(), error) {
		return func(ctx context.Context) (client.Client, func(), error) {
			seq++
			s, err := devtemporal.Start(ctx, devtemporal.Options{
				DataDir: fmt.Sprintf("%s/temporal-%d", tmp, seq), DisableUI: true, Persistence: p, Postgres: pg,
			})
			if err != nil {
				return nil, nil, err
			}
			c, err := client.DialContext(ctx, client.Options{HostPort: s.FrontendAddress(), Namespace: s.Namespace(), Logger: devtemporal.SDKLogger(log)})
			if err != nil {
				s.Stop()
				return nil, nil, err
			}
			return c, func() { c.Close(); s.Stop() }, nil
		}
	}
	pgOpts := func(suffix string) *devtemporal.Postgres {
		db := "bench_temporal_" + suffix
		return &devtemporal.Postgres{URL: admin, Database: db, VisibilityDatabase: db + "_visibility"}
	}
	variants := []variant{
		{"memory", "in-memory SQLite (temporaltest; reference, not durable)", func(ctx context.Context) (client.Client, func(), error) {
			dc := dynamicconfig.StaticClient{}
			for k, v := range map[dynamicconfig.Key]any{
				dynamicconfig.TransferProcessorMaxPollRPS.Key():         1000,
				dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  1,
				dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): 1,
			} {
				dc[k] = v
			}
			s := temporaltest.NewServer(temporaltest.WithBaseServerOptions(temporal.WithDynamicConfigClient(dc)))
			c := s.NewClientWithOptions(client.Options{Namespace: s.GetDefaultNamespace(), Logger: devtemporal.SDKLogger(log)})
			return c, func() { c.Close(); s.Stop() }, nil
		}},
		{"sqlite", "SQLite file (durable)", devStart(devtemporal.PersistenceSQLite, nil)},
		{"postgres", "PostgreSQL, synchronous_commit on (durable)", devStart(devtemporal.PersistencePostgres, pgOpts("sync"))},
	}
	dbs := []string{"bench_temporal_sync"}
	if extra {
		async := pgOpts("async")
		variants = append(variants, variant{"postgres-async", "PostgreSQL, synchronous_commit=off (NOT durable: recent commits may be lost in a crash)", func(ctx context.Context) (client.Client, func(), error) {
			for _, db := range []string{async.Database, async.VisibilityDatabase} {
				if err := exec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil && !strings.Contains(err.Error(), "already exists") {
					return nil, nil, err
				}
				if err := exec(ctx, admin, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET synchronous_commit = off"); err != nil {
					return nil, nil, err
				}
			}
			return devStart(devtemporal.PersistencePostgres, async)(ctx)
		}})
		dbs = append(dbs, "bench_temporal_async")
	}
	defer func() {
		for _, db := range dbs {
			for _, name := range []string{db, db + "_visibility"} {
				_ = exec(context.WithoutCancel(ctx), admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			}
		}
	}()

	if only != "" {
		keep := strings.Split(only+",memory", ",")
		variants = slices.DeleteFunc(variants, func(v variant) bool { return !slices.Contains(keep, v.name) })
	}
	fmt.Printf("floor workload: %d entity workflows, offered %.0f signals/s for %s, %d run(s) per persistence, interleaved\n", n, rate, d, runs)
	results := map[string][]result{}
	for r := range runs {
		for _, v := range variants {
			res, err := measure(ctx, v, n, rate, d, drain, r, pgPID)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				// A persistence that cannot keep up (signals time out) is a result, not the
				// end of the bench: the others are still measured.
				msg, _, _ := strings.Cut(redact.Text(err.Error()), "\n") // joined errors: the first
				fmt.Printf("  %-15s run %d: FAILED: %s  [%s]\n", v.name, r+1, msg, v.label)
				continue
			}
			fmt.Printf("  %-15s run %d: offered %.1f/s, accepted %d of %d (%.1f/s), p50 %s, p99 %s, max %s, CPU per update %.2fms (this process) + %.2fms (PostgreSQL)  [%s]\n", v.name, r+1,
				res.Offered, res.Accepted, res.Sent, res.AcceptedPerSec, ms(res.P50), ms(res.P99), ms(res.Max), res.cpuSelf, res.cpuPG, v.label)
			results[v.name] = append(results[v.name], res)
		}
	}
	if len(results["memory"]) == 0 {
		return errors.New("the in-memory baseline failed every run")
	}
	base := median(results["memory"])
	for _, v := range variants {
		if len(results[v.name]) == 0 {
			fmt.Printf("bench: persistence-%s-accepted-%d FAILED (every run failed; see above)\n", v.name, n)
			continue
		}
		m := median(results[v.name])
		line := func(fig string, val, baseVal float64, unit string) {
			fmt.Printf("bench: persistence-%s-%s-%d %.1f %s (baseline persistence-memory-%s-%d %.1f %s, ratio %.2f)\n",
				v.name, fig, n, val, unit, fig, n, baseVal, unit, val/baseVal)
		}
		line("accepted", m.AcceptedPerSec, base.AcceptedPerSec, "/s")
		line("p50", msf(m.P50), msf(base.P50), "ms")
		line("p99", msf(m.P99), msf(base.P99), "ms")
		// CPU per accepted update, Temporal server and worker (this process) plus PostgreSQL's
		// server processes: less sensitive than latency to a machine loaded by others.
		line("cpu-per-update", m.cpuSelf+m.cpuPG, base.cpuSelf+base.cpuPG, "ms")
	}
	return nil
}

// result is a floor result with the CPU time spent per accepted update (ms), in this process
// (Temporal server, worker, driver) and in the PostgreSQL cluster's processes, over the
// offered phase (from the floor's Start over its Span; the entity workflows' start-up and
// termination are outside it).
type result struct {
	floor.Result
	cpuSelf, cpuPG float64
}

// cpuSample is the CPU time used so far: this process's and the PostgreSQL cluster's.
type cpuSample struct{ self, pg time.Duration }

// measure starts v's server, runs the floor on it while sampling CPU time, and stops the
// server.
func measure(ctx context.Context, v variant, n int, rate float64, d, drain time.Duration, r, pgPID int) (result, error) {
	c, stop, err := v.start(ctx)
	if err != nil {
		return result{}, err
	}
	defer stop()
	samples := cpustat.Sample(200*time.Millisecond, func() cpuSample {
		return cpuSample{cpustat.Self(), clusterCPU(pgPID)}
	})
	res, err := floor.RunWithOptions(ctx, c, fmt.Sprintf("floor-%s-%d", v.name, r), n, rate, d, floor.Options{Drain: drain})
	samples.Stop()
	if err != nil {
		return result{}, err
	}
	out := result{Result: res}
	a, b := samples.At(res.Start), samples.At(res.Start.Add(res.Span))
	if res.Accepted > 0 {
		out.cpuSelf = msf(b.self-a.self) / float64(res.Accepted)
		out.cpuPG = msf(b.pg-a.pg) / float64(res.Accepted)
	}
	return out, nil
}

// median returns the run with the median accepted rate, its other figures with it.
func median(rs []result) result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b result) int { return cmp.Compare(a.AcceptedPerSec, b.AcceptedPerSec) })
	return s[len(s)/2]
}

// clusterCPU is the CPU time of the postmaster pid and the processes below it, live or
// reaped (from /proc; 0 when pid is 0 or /proc is unreadable).
func clusterCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	return cpustat.TreeTime(cpustat.All(), pid)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", msf(d)) }

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func exec(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// describeServer prints the durability settings of the PostgreSQL server under test.
func describeServer(ctx context.Context, admin string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var fsync, syncCommit, version string
	if err := conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('server_version')`).Scan(&fsync, &syncCommit, &version); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL %s: fsync=%s synchronous_commit=%s\n", version, fsync, syncCommit)
	return nil
}
