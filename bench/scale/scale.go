// Package scale measures how many live subscriptions one worker holds on the embedded default
// that `make run` starts (issue 16 item 4): it runs bin/mcpsync-dev (embedded Temporal with
// its SQLite file, Web UI, private PostgreSQL) and bin/mcpsync-worker as processes of their
// own, exactly as scripts/run.sh does, registers one stdio source (bin/mcpsync-demo-server
// with --resources), subscribes N URIs in one bulk `mcpsync subscribe --uris-file` call and
// reports:
//   - the time until all N are ACTIVE with their first accepted version, and the start rate
//     next to the floor's: first, on a fresh mcpsync-dev of its own (stopped before mcpsync's
//     starts), -floor entity workflows of internal/harness/floor, the cheapest workflow that
//     starts and runs one local activity in its first workflow task, started -parallel at a
//     time under a worker with mcpsync-worker's pollers;
//   - what one start costs: the CPU time (user + system, from /proc and getrusage) of
//     mcpsync-dev, of its PostgreSQL cluster, of the worker with its stdio server and of the bulk
//     subscribe while the N started, per subscription, beside the same per floor workflow (the
//     floor's worker and starter are this process, counted together); and each database's
//     active time and transactions per start (pg_stat_database: Temporal's store and
//     visibility, the ledger);
//   - the RSS (VmRSS and peak VmHWM) of the worker, of mcpsync-dev (Temporal server + UI) and
//     of its PostgreSQL processes at N;
//   - after a session change (the stdio server process is killed; the worker restarts it), the
//     time until every subscription has re-read on the new session;
//   - the latency of live updates meanwhile (demo://clock/now carries its change time), next
//     to the same latency measured before the storm;
//   - the worker's sticky workflow cache (its Temporal SDK metrics, scraped from /metrics):
//     the most executions it held (the cache size N subscriptions need,
//     MCPSYNC_WORKFLOW_CACHE_SIZE), forced evictions, hits and misses (each miss replays a
//     whole history) and workflow tasks, at N and during the re-read storm; -cache-size runs
//     the worker with another size to show the effect of a smaller one.
//
// With -budget the whole run stops in time: a phase still running when the budget ends stops
// there, and its figures say how far it got (how many were ACTIVE, at what rate) instead of a
// time to completion; that is not an error. Other failures (a process that dies, a query that
// fails) are.
//
// Build first: `make build-run`. Every figure is a line
// `bench: <name> <value> <unit> (baseline <name> <value> <unit>, ratio <r>)`.
package scale

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/bench/devstack"
	mcpconfig "github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/harness/floor"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench scale` (bench/main.go) calls it.
func Main() {
	n := flag.Int("n", 10000, "subscriptions: demo://clock/now and N-1 numbered items")
	bin := flag.String("bin", "bin", "directory of the built commands (make build-run)")
	parallel := flag.Int("parallel", 32, "workflow starts in flight in the bulk subscribe")
	timeout := flag.Duration("timeout", 20*time.Minute, "give up on a phase after this long")
	interval := flag.Duration("interval", time.Second, "demo server change interval (the clock and one item change per tick)")
	probe := flag.Duration("probe", 20*time.Second, "how long live-update latency is sampled before the storm")
	backstop := flag.Duration("backstop", 15*time.Minute, "the source's --backstop: every subscription re-reads once per period (the default 30s is 333 reads/s at 10,000)")
	keep := flag.Bool("keep", false, "keep the data directory and logs")
	persistence := flag.String("persistence", "", "mcpsync-dev --temporal-persistence (empty: its default, the one make run uses)")
	budget := flag.Duration("budget", 0, "stop every phase when this much time has passed since the start and report how far it got (0: only -timeout per phase)")
	floorN := flag.Int("floor", -1, "floor entity workflows started first on a fresh server of their own (-1: N; 0: no floor)")
	cacheSize := flag.Int("cache-size", 0, "run the worker with this sticky workflow cache size ("+workerapp.EnvWorkflowCacheSize+"; 0: the worker's default or the variable's value)")
	flag.Parse()
	if *floorN == -1 {
		*floorN = *n
	}
	if *n < 2 || *parallel < 1 || *timeout <= 0 || *interval <= 0 || *budget < 0 || *cacheSize < 0 || *probe < 0 || *floorN < 0 || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "scale: -n must be ≥ 2, -parallel ≥ 1, -timeout and -interval positive, -budget, -probe, -cache-size and -floor (but -1) not negative, no positional arguments")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := config{n: *n, floor: *floorN, bin: *bin, parallel: *parallel, timeout: *timeout, interval: *interval, probe: *probe, backstop: *backstop,
		keep: *keep, persistence: *persistence, cacheSize: *cacheSize, started: time.Now()}
	if *budget > 0 {
		c.deadline = c.started.Add(*budget)
	}
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	n, parallel, cacheSize, floor      int
	bin, persistence                   string
	timeout, interval, probe, backstop time.Duration
	keep                               bool
	started, deadline                  time.Time // deadline: zero without -budget
}

// goalStartRate is issue 16's start goal as a rate: 10,000 subscriptions ACTIVE with their
// first version in 2 minutes.
const goalStartRate = 10000.0 / 120

// phaseDeadline is when a phase that may take timeout must stop: timeout after began, or
// earlier at the budget's end less reserve for the phases after it (at most 40 % of the budget
// still left, so that a small budget still gives this phase most of it).
func (c config) phaseDeadline(began time.Time, reserve time.Duration) time.Time {
	d := began.Add(c.timeout)
	if c.deadline.IsZero() {
		return d
	}
	r := max(0, min(reserve, c.deadline.Sub(began)*2/5)) // none once the budget is spent
	if end := c.deadline.Add(-r); end.Before(d) {
		d = end
	}
	return d
}

func run(ctx context.Context, c config) error {
	n, parallel, timeout, interval, probe, backstop, keep, persistence := c.n, c.parallel, c.timeout, c.interval, c.probe, c.backstop, c.keep, c.persistence
	bin, err := devstack.Binaries(c.bin)
	if err != nil {
		return err
	}
	dir, cleanup, err := devstack.Workdir("scale", keep)
	if err != nil {
		return err
	}
	// mcpsync-dev has stopped by then (stopProcs, deferred later).
	defer cleanup()
	self := strconv.Itoa(os.Getpid())

	baseEnv := devstack.Environ()
	if persistence == "" {
		persistence = "mcpsync-dev default"
	}
	fmt.Printf("scale: backstop %s (%.1f refresh reads/s at %d)\n", backstop, float64(n)/backstop.Seconds(), n)

	// Phase 0: the floor, on a fresh mcpsync-dev of its own that is stopped before mcpsync's.
	var fl floor.StartResult
	var flCPU *cpuSet
	if c.floor > 0 {
		if fl, flCPU, err = runFloor(ctx, c, dir, baseEnv, bin, self); err != nil {
			return err
		}
	}

	fmt.Printf("scale: %d subscriptions on one stdio source; embedded Temporal (bin/mcpsync-dev, persistence: %s) and bin/mcpsync-worker as processes\n", n, persistence)
	stackBegan := time.Now()
	dev, devEnv, err := devstack.StartDev(devstack.DevOptions{Dir: dir, Name: "dev", Env: baseEnv, Bin: bin, Persistence: c.persistence, ParentPID: self, Prefix: "scale"})
	if err != nil {
		return err
	}
	devStopped := false
	defer func() {
		if !devStopped {
			devstack.StopProcs(dev)
		}
	}()
	env := append(slices.Clone(baseEnv), devEnv...)
	metricsPort, err := devstack.FreePorts(1)
	if err != nil {
		return err
	}
	env = append(env, "MCPSYNC_GATEWAY_ADDR=off", "MCPSYNC_METRICS_ADDR=127.0.0.1:"+metricsPort[0])
	workerEnv := slices.Clone(env)
	if c.cacheSize > 0 {
		workerEnv = append(workerEnv, fmt.Sprintf("%s=%d", workerapp.EnvWorkflowCacheSize, c.cacheSize))
	}
	capacity, err := workerapp.WorkflowCacheSize(func(k string) string { return devstack.EnvValue(workerEnv, k) })
	if err != nil {
		return err
	}
	worker, err := devstack.StartProc(dir, "worker", workerEnv, filepath.Join(bin, "mcpsync-worker"), "--parent-pid", self, "--log-level", "warn")
	if err != nil {
		return err
	}
	devStopped = true
	defer devstack.StopProcs(worker, dev)
	cache := &stickyCache{url: "http://127.0.0.1:" + metricsPort[0] + "/metrics", capacity: capacity}
	fmt.Printf("scale: worker sticky workflow cache: %d executions\n", capacity)
	var dbURL string
	for _, kv := range devEnv {
		if v, ok := strings.CutPrefix(kv, "DATABASE_URL="); ok {
			dbURL = v
		}
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// cliCPU runs the CLI and also returns the CPU time it used.
	cliCPU := func(ctx context.Context, args ...string) (string, time.Duration, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "mcpsync"), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		var used time.Duration
		if ps := cmd.ProcessState; ps != nil {
			used = ps.UserTime() + ps.SystemTime()
		}
		if err != nil {
			return string(out), used, fmt.Errorf("mcpsync %s: %w: %s", args[0], err, strings.TrimSpace(devstack.LastLines(string(out), 5)))
		}
		return string(out), used, nil
	}
	cli := func(ctx context.Context, args ...string) (string, error) {
		out, _, err := cliCPU(ctx, args...)
		return out, err
	}
	demo := fmt.Sprintf("%s --resources %d --interval %s --item-updates 1", filepath.Join(bin, "mcpsync-demo-server"), n-1, interval)
	if err := devstack.Retry(2*time.Minute, func() error {
		_, err := cli(ctx, "source", "add", "scale", "--stdio", demo, "--backstop", backstop.String())
		return err
	}); err != nil {
		return err
	}
	idle := readRSS(worker.Process.Pid, dev.Process.Pid)
	fmt.Printf("scale: stack up in %.1f s (mcpsync-dev pid %d, worker pid %d); idle RSS worker %s, mcpsync-dev %s; postgres PSS %s\n",
		time.Since(stackBegan).Seconds(), dev.Process.Pid, worker.Process.Pid, mib(idle.worker.rss), mib(idle.dev.rss), mib(idle.pg.rss))

	uris := []string{"demo://clock/now"}
	for i := range n - 1 {
		uris = append(uris, fmt.Sprintf("demo://items/%04d", i+1))
	}
	uriFile := filepath.Join(dir, "uris.txt")
	if err := os.WriteFile(uriFile, []byte(strings.Join(uris, "\n")+"\n"), 0o600); err != nil {
		return err
	}

	// Phase 1: bulk subscribe; all ACTIVE with a first version.
	statConn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer statConn.Close(context.Background())
	cpuBegan, err := readCPU(ctx, statConn, worker.Process.Pid, dev.Process.Pid)
	if err != nil {
		return err
	}
	began := time.Now()
	cliCtx, stopCLI := context.WithCancel(ctx)
	defer stopCLI()
	cliDone := make(chan error, 1)
	var cliTook, cliUsed time.Duration
	go func() {
		out, used, err := cliCPU(cliCtx, "subscribe", "scale", "--uris-file", uriFile, "--parallel", strconv.Itoa(parallel), "--wait", timeout.String())
		cliTook, cliUsed = time.Since(began), used
		if strings.TrimSpace(out) != "" {
			fmt.Print("scale: ", devstack.LastLines(out, 3))
		}
		cliDone <- err
	}()
	var peak rssSet
	var nextPrint, nextScrape time.Duration
	var lastActive int
	// The bulk subscribe (10,000 ACTIVE, and the RSS and cache at 10,000: the headline
	// figures) may use -budget up to the quiet probe and stopReserve; the re-read storm gets
	// what is left, and says how far it got when that is not enough.
	phase1End := c.phaseDeadline(began, c.stopReserve()+probe)
	tActive, done, err := poll(ctx, phase1End, func(el time.Duration) (bool, error) {
		peak = peak.max(readRSS(worker.Process.Pid, dev.Process.Pid))
		if el >= nextScrape {
			nextScrape += 5 * time.Second
			cache.sample()
		}
		var active int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM subscriptions WHERE state = 'ACTIVE' AND last_accepted_ordinal > 0`).Scan(&active)
		lastActive = max(lastActive, active)
		if el >= nextPrint {
			nextPrint += 10 * time.Second
			fmt.Printf("scale: %5.0fs %d/%d ACTIVE with a version; worker %s, mcpsync-dev %s\n", el.Seconds(), active, n, mib(peak.worker.rss), mib(peak.dev.rss))
		}
		return active >= n, err
	}, began)
	if err != nil {
		return err
	}
	if !done {
		// Stopped at the budget (or -timeout): how far it got, never a time to completion.
		cpuNow, err := readCPU(ctx, statConn, worker.Process.Pid, dev.Process.Pid)
		if err != nil {
			return err
		}
		stopCLI()
		<-cliDone
		cpuNow.starter = cliUsed
		r := readRSS(worker.Process.Pid, dev.Process.Pid)
		cache.sample()
		why := stopReason(c, phase1End, began)
		fmt.Printf("scale: stopped the bulk subscribe after %.0f s: %s with %d of %d ACTIVE with a version; the re-read storm is not measured\n",
			tActive.Seconds(), why, lastActive, n)
		rate := float64(lastActive) / tActive.Seconds()
		fmt.Printf("bench: scale-active-reached-%d %d subscriptions (baseline scale-goal-%d %d subscriptions, ratio %.2f)\n", n, lastActive, n, n, float64(lastActive)/float64(n))
		fmt.Printf("bench: scale-active-after-%d %.1f s\n", n, tActive.Seconds())
		fmt.Printf("bench: scale-start-rate-%d %.1f /s (baseline goal-start-rate %.1f /s, ratio %.2f)\n", n, rate, goalStartRate, rate/goalStartRate)
		printVsFloor(n, rate, fl)
		printCPU("scale", max(1, lastActive), cpuNow.sub(cpuBegan), fl.Up, flCPU)
		if rate > 0 {
			fmt.Printf("bench: scale-active-projected-%d %.0f s (baseline goal-active-%d 120 s, ratio %.2f)\n", n, float64(n)/rate, n, float64(n)/rate/120)
		}
		fmt.Printf("bench: worker-rss-at-%d %s (baseline worker-rss-idle %s, ratio %.1f)\n", lastActive, mib(r.worker.rss), mib(idle.worker.rss), ratio(r.worker.rss, idle.worker.rss))
		fmt.Printf("bench: devtemporal-rss-at-%d %s (baseline devtemporal-rss-idle %s, ratio %.1f)\n", lastActive, mib(r.dev.rss), mib(idle.dev.rss), ratio(r.dev.rss, idle.dev.rss))
		fmt.Printf("bench: postgres-pss-at-%d %s (baseline postgres-pss-idle %s, ratio %.1f)\n", lastActive, mib(r.pg.rss), mib(idle.pg.rss), ratio(r.pg.rss, idle.pg.rss))
		cache.print(n, lastActive)
		if why != "the budget (-budget) ended" {
			return fmt.Errorf("%d of %d ACTIVE after -timeout %s", lastActive, n, timeout)
		}
		return nil
	}
	if err := <-cliDone; err != nil {
		return err
	}
	cpuAtN, err := readCPU(ctx, statConn, worker.Process.Pid, dev.Process.Pid)
	if err != nil {
		return err
	}
	cpuAtN.starter = cliUsed
	atN := readRSS(worker.Process.Pid, dev.Process.Pid)
	peak = peak.max(atN)
	cache.sample()
	fmt.Printf("bench: scale-active-%d %.1f s (baseline goal-active-%d 120 s, ratio %.2f)\n", n, tActive.Seconds(), n, tActive.Seconds()/120)
	fmt.Printf("bench: scale-subscribe-cli-%d %.1f s\n", n, cliTook.Seconds())
	rate := float64(n) / tActive.Seconds()
	fmt.Printf("bench: scale-start-rate-%d %.1f /s (baseline goal-start-rate %.1f /s, ratio %.2f)\n", n, rate, goalStartRate, rate/goalStartRate)
	printVsFloor(n, rate, fl)
	printCPU("scale", n, cpuAtN.sub(cpuBegan), fl.Up, flCPU)
	fmt.Printf("bench: worker-rss-%d %s (baseline worker-rss-idle %s, ratio %.1f)\n", n, mib(atN.worker.rss), mib(idle.worker.rss), ratio(atN.worker.rss, idle.worker.rss))
	fmt.Printf("bench: devtemporal-rss-%d %s (baseline devtemporal-rss-idle %s, ratio %.1f)\n", n, mib(atN.dev.rss), mib(idle.dev.rss), ratio(atN.dev.rss, idle.dev.rss))
	fmt.Printf("bench: postgres-pss-%d %s (baseline postgres-pss-idle %s, ratio %.1f)\n", n, mib(atN.pg.rss), mib(idle.pg.rss), ratio(atN.pg.rss, idle.pg.rss))
	cache.print(n, n)

	// Live-update latency before the storm (baseline).
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(probe):
	}
	quiet, _, err := clockStaleness(ctx, pool, time.Now().Add(-probe), time.Now())
	if err != nil {
		return err
	}

	// Phase 2: session change. Kill the stdio server; the worker starts a new one.
	demoPID, err := childNamed(worker.Process.Pid, "mcpsync-demo-server")
	if err != nil {
		return err
	}
	var oldGen int64
	if err := pool.QueryRow(ctx, `SELECT max(generation) FROM sessions`).Scan(&oldGen); err != nil {
		return err
	}
	killed := time.Now()
	nextPrint, nextScrape = 0, 0
	if err := syscall.Kill(demoPID, syscall.SIGKILL); err != nil {
		return err
	}
	var lastReread int
	phase2End := c.stormDeadline(killed)
	tReread, done, err := poll(ctx, phase2End, func(el time.Duration) (bool, error) {
		peak = peak.max(readRSS(worker.Process.Pid, dev.Process.Pid))
		if el >= nextScrape {
			nextScrape += 5 * time.Second
			cache.sample()
		}
		var reread int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM subscriptions s
			WHERE s.state = 'ACTIVE' AND s.session_generation > $1
			  AND greatest(s.last_accepted_at, s.last_verified_at) > $2`, oldGen, killed).Scan(&reread)
		lastReread = max(lastReread, reread)
		if el >= nextPrint {
			nextPrint += 10 * time.Second
			fmt.Printf("scale: %5.0fs after the kill %d/%d re-read on the new session\n", el.Seconds(), reread, n)
		}
		return reread >= n, err
	}, killed)
	if err != nil {
		return err
	}
	storm, stormVersions, err := clockStaleness(ctx, pool, killed, killed.Add(tReread))
	if err != nil {
		return err
	}
	final := readRSS(worker.Process.Pid, dev.Process.Pid)
	peak = peak.max(final)
	cache.sample()

	fmt.Printf("bench: worker-hwm-%d %s\n", n, mib(peak.worker.hwm))
	fmt.Printf("bench: devtemporal-hwm-%d %s\n", n, mib(peak.dev.hwm))
	if done {
		fmt.Printf("bench: reread-all-%d %.1f s (baseline scale-active-%d %.1f s, ratio %.2f)\n", n, tReread.Seconds(), n, tActive.Seconds(), tReread.Seconds()/tActive.Seconds())
	} else {
		fmt.Printf("scale: stopped waiting for the re-read storm after %.0f s (%s): %d of %d re-read\n", tReread.Seconds(), stopReason(c, phase2End, killed), lastReread, n)
		fmt.Printf("bench: reread-reached-%d %d subscriptions (baseline scale-goal-%d %d subscriptions, ratio %.2f)\n", n, lastReread, n, n, float64(lastReread)/float64(n))
		fmt.Printf("bench: reread-after-%d %.1f s\n", n, tReread.Seconds())
	}
	fmt.Printf("bench: reread-rate-%d %.1f /s\n", n, float64(lastReread)/tReread.Seconds())
	fmt.Printf("bench: live-staleness-p50-during-reread-%d %s (baseline live-staleness-p50-quiet-%d %s, ratio %.1f)\n", n, ms(pct(storm, 50)), n, ms(pct(quiet, 50)), ratio(pct(storm, 50), pct(quiet, 50)))
	fmt.Printf("bench: live-staleness-max-during-reread-%d %s (baseline live-staleness-max-quiet-%d %s, ratio %.1f)\n", n, ms(pct(storm, 100)), n, ms(pct(quiet, 100)), ratio(pct(storm, 100), pct(quiet, 100)))
	fmt.Printf("bench: live-versions-during-reread-%d %d versions (baseline reread-window %.0f ticks)\n", n, stormVersions, tReread.Seconds()/interval.Seconds())
	cache.printAfterStorm(n)
	if !done && stopReason(c, phase2End, killed) != "the budget (-budget) ended" {
		return fmt.Errorf("%d of %d re-read after -timeout %s", lastReread, n, timeout)
	}
	return nil
}

// stormDeadline is when the re-read storm that began at killed must stop: -timeout after it,
// or earlier where the stop's whole reserve begins.
func (c config) stormDeadline(killed time.Time) time.Time {
	end := killed.Add(c.timeout)
	if r := c.stopReserve(); !c.deadline.IsZero() && c.deadline.Add(-r).Before(end) {
		end = c.deadline.Add(-r)
	}
	return end
}

// stopReserve is the part of -budget kept for stopping the worker and mcpsync-dev: 40 s
// (devstack.StopProcs waits 30 s before it kills, then the data is removed), or a fifth of a
// budget under 200 s. A small run (`make bench-quick`: 200 subscriptions, -budget 70s) stops
// in seconds, and the whole 40 s would leave its re-read storm no time at all: it was cut
// at 0 s and printed 0 of 200 re-read.
func (c config) stopReserve() time.Duration {
	const full = 40 * time.Second
	if c.deadline.IsZero() {
		return full
	}
	return min(full, c.deadline.Sub(c.started)/5)
}

// stopReason says why a phase that began at began stopped at end.
func stopReason(c config, end, began time.Time) string {
	if c.deadline.IsZero() || end.Equal(began.Add(c.timeout)) {
		return fmt.Sprintf("-timeout %s passed", c.timeout)
	}
	return "the budget (-budget) ended"
}

// clockStaleness measures how stale the accepted view of demo://clock/now was in [from, to]:
// the server changes it every tick and its body is the change time, so for each version
// accepted there, the time from the change that the previously accepted version carried to
// this acceptance is how old the newest accepted content was just before (one tick plus the
// delay; reads coalesce, so a starved subscription shows as long gaps, not as many late
// versions). It also returns how many versions were accepted.
func clockStaleness(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) ([]time.Duration, int, error) {
	rows, err := pool.Query(ctx, `SELECT v.accepted_at, convert_from(b.body, 'UTF8')
		FROM resource_versions v JOIN subscriptions s ON s.id = v.subscription_id JOIN content_blobs b ON b.digest = v.digest
		WHERE s.uri = 'demo://clock/now' AND v.accepted_at <= $2
		  AND v.accepted_at >= (SELECT coalesce(max(v2.accepted_at), $1) FROM resource_versions v2 WHERE v2.subscription_id = s.id AND v2.accepted_at < $1)
		ORDER BY v.accepted_at`, from, to)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var out []time.Duration
	var prevChanged time.Time
	n := 0
	for rows.Next() {
		var at time.Time
		var body string
		if err := rows.Scan(&at, &body); err != nil {
			return nil, 0, err
		}
		changed, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(body))
		if err != nil {
			return nil, 0, fmt.Errorf("clock body %q: %w", body, err)
		}
		if !prevChanged.IsZero() && !at.Before(from) {
			out = append(out, at.Sub(prevChanged))
			n++
		}
		prevChanged = changed
	}
	slices.Sort(out)
	return out, n, rows.Err()
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := (len(d) - 1) * p / 100
	return d[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

func ratio[T ~int64](a, b T) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// poll calls check every second until it says done or deadline passes; it returns the time
// since began and whether check said done.
func poll(ctx context.Context, deadline time.Time, check func(time.Duration) (bool, error), began time.Time) (time.Duration, bool, error) {
	for {
		done, err := check(time.Since(began))
		if err != nil {
			return time.Since(began), false, err
		}
		if done {
			return time.Since(began), true, nil
		}
		if !time.Now().Before(deadline) {
			return time.Since(began), false, nil
		}
		select {
		case <-ctx.Done():
			return time.Since(began), false, ctx.Err()
		case <-time.After(min(time.Second, time.Until(deadline)+time.Millisecond)):
		}
	}
}

// runFloor measures the floor of the start phase: on a fresh mcpsync-dev of its own (same
// persistence), c.floor of the cheapest entity workflow (internal/harness/floor: started with
// c.parallel calls in flight, up once its first workflow task has run one local activity)
// under a worker in this process with mcpsync-worker's pollers. It gets at most 30 % of
// -budget. That mcpsync-dev is stopped and its data removed (kept with -keep) before it
// returns.
func runFloor(ctx context.Context, c config, dir string, baseEnv []string, bin, self string) (floor.StartResult, *cpuSet, error) {
	fmt.Printf("scale: floor: %d entity workflows on a fresh bin/mcpsync-dev of their own, %d starts in flight\n", c.floor, c.parallel)
	dev, env, err := devstack.StartDev(devstack.DevOptions{Dir: dir, Name: "floor-dev", Env: baseEnv, Bin: bin, Persistence: c.persistence, ParentPID: self, Prefix: "scale"})
	if err != nil {
		return floor.StartResult{}, nil, err
	}
	defer func() {
		devstack.StopProcs(dev)
		if !c.keep {
			if err := pgcluster.RemoveRelocated(filepath.Join(devstack.DataDir(dir, "floor-dev"), "pg")); err != nil {
				fmt.Fprintln(os.Stderr, "scale:", err)
			}
			_ = os.RemoveAll(devstack.DataDir(dir, "floor-dev"))
		}
	}()
	tc, err := mcpconfig.TemporalConn{}.Dial(ctx, devstack.EnvValue(env, "TEMPORAL_ADDRESS"), devstack.EnvValue(env, "TEMPORAL_NAMESPACE"),
		client.Options{Logger: devtemporal.SDKLogger(zap.NewNop())})
	if err != nil {
		return floor.StartResult{}, nil, err
	}
	defer tc.Close()
	statConn, err := pgx.Connect(ctx, devstack.EnvValue(env, "DATABASE_URL"))
	if err != nil {
		return floor.StartResult{}, nil, err
	}
	defer statConn.Close(context.Background())
	cpuBegan, err := readCPU(ctx, statConn, 0, dev.Process.Pid)
	if err != nil {
		return floor.StartResult{}, nil, err
	}
	cpuBegan.starter = cpustat.Self()
	began := time.Now()
	end := began.Add(c.timeout)
	if !c.deadline.IsZero() {
		if share := began.Add(c.deadline.Sub(began) * 3 / 10); share.Before(end) {
			end = share
		}
	}
	fl, err := floor.Starts(ctx, tc, "scale-floor", c.floor, floor.StartOptions{Parallel: c.parallel, Deadline: end,
		Worker: workerapp.WorkerOptions()})
	if err != nil {
		return fl, nil, err
	}
	cpuNow, err := readCPU(ctx, statConn, 0, dev.Process.Pid)
	if err != nil {
		return fl, nil, err
	}
	cpuNow.starter = cpustat.Self()
	used := cpuNow.sub(cpuBegan)
	fmt.Printf("scale: floor: %d of %d up (%d started) in %.1f s\n", fl.Up, fl.Workflows, fl.Started, fl.Elapsed.Seconds())
	if fl.Up == fl.Workflows {
		fmt.Printf("bench: floor-active-%d %.1f s (baseline goal-active-%d 120 s, ratio %.2f)\n", fl.Workflows, fl.Elapsed.Seconds(), fl.Workflows, fl.Elapsed.Seconds()/120)
	} else {
		fmt.Printf("bench: floor-active-reached-%d %d workflows in %.1f s (the floor's share of -budget)\n", fl.Workflows, fl.Up, fl.Elapsed.Seconds())
	}
	fmt.Printf("bench: floor-start-rate-%d %.1f /s (baseline goal-start-rate %.1f /s, ratio %.2f)\n", fl.Workflows, fl.PerSec, goalStartRate, fl.PerSec/goalStartRate)
	printCPU("floor", max(1, fl.Up), used, 0, nil)
	return fl, &used, nil
}

// printVsFloor prints mcpsync's start rate against the floor's, when the floor ran.
func printVsFloor(n int, rate float64, fl floor.StartResult) {
	if fl.Workflows == 0 || fl.PerSec <= 0 {
		return
	}
	fmt.Printf("bench: scale-start-rate-of-floor-%d %.1f /s (baseline floor-start-rate-%d %.1f /s, ratio %.2f)\n", n, rate, fl.Workflows, fl.PerSec, rate/fl.PerSec)
}

// rss is one process tree's resident set: now and its peak (bytes).
type rss struct{ rss, hwm int64 }

// rssSet is the RSS of the worker and of mcpsync-dev, and the summed PSS of mcpsync-dev's
// PostgreSQL processes.
type rssSet struct{ worker, dev, pg rss }

func (a rssSet) max(b rssSet) rssSet {
	m := func(x, y rss) rss { return rss{max(x.rss, y.rss), max(x.hwm, y.hwm)} }
	return rssSet{m(a.worker, b.worker), m(a.dev, b.dev), m(a.pg, b.pg)}
}

func readRSS(worker, dev int) rssSet {
	var s rssSet
	s.worker = procRSS(worker)
	s.dev = procRSS(dev)
	for _, pid := range cpustat.Descendants(cpustat.All(), dev) {
		if strings.HasPrefix(cpustat.Comm(pid), "postgres") {
			// Proportional set size: the backends share their buffers, which RSS would count
			// once per process.
			s.pg.rss += procPSS(pid)
		}
	}
	return s
}

func procRSS(pid int) rss {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return rss{}
	}
	defer f.Close()
	var r rss
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		kb, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			r.rss = kb << 10
		case "VmHWM":
			r.hwm = kb << 10
		}
	}
	return r
}

// procPSS is the proportional set size of pid (bytes), 0 if unknown.
func procPSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// childNamed returns the PID of the descendant of pid whose command name starts with name.
func childNamed(pid int, name string) (int, error) {
	for _, c := range cpustat.Descendants(cpustat.All(), pid) {
		if strings.HasPrefix(name, cpustat.Comm(c)) && cpustat.Comm(c) != "" {
			return c, nil
		}
	}
	return 0, fmt.Errorf("no %s process below pid %d", name, pid)
}

func mib(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}
