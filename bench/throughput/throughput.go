// Package throughput measures mcpsync end to end on the deployment `make run` starts (issue 16
// items 1-3): the embedded Temporal server with its persistence and dynamic config (in this
// process, as mcpsync-dev runs it in its own), mcpsync-worker as a separate process, a ledger
// on a PostgreSQL cluster with fsync on, N subscriptions on a fault-injecting MCP server over
// streamable HTTP, resources mutated at a fixed offered rate, and for every mutation the time
// until the ledger accepted a version with exactly that content (notification → signal →
// workflow → read ordinal → resources/read → acceptResourceVersion). In the same run, on the
// same Temporal server, it measures:
//
//   - the floor (internal/harness/floor): the simplest entity workflow per subscription —
//     signal, one no-op local activity, loop — at the same offered rate over N workflows;
//     mcpsync's accepted/s over the floor's is the ratio issue 16 asks ≥ 0.7 of;
//   - with -floor-update, the floor again with each update delivered as a workflow update
//     instead of a signal (floor-update-* beside the floor's figures): what a delivery costs
//     when the server dispatches it in a speculative workflow task, persisted once when the
//     task completes, against a signal, persisted on arrival and again when its task starts;
//   - a raw go-sdk read loop against the same MCP server: what one client can read;
//   - history events and workflow tasks per accepted update, for mcpsync and the floor, from the
//     histories (GetWorkflowHistory) of a sample of their workflows over the measured window;
//   - CPU per accepted update, for mcpsync and the floor: the whole machine's busy time
//     (/proc/stat) and each process's (this one, which holds the embedded server; the
//     PostgreSQL clusters; mcpsync-worker), how busy the machine was, and how many cores the
//     offered rate keeps busy at that cost — what a machine needs at the least to carry it;
//   - what the host's read quieting costs (R13, R27): the latency of lone updates, and the share
//     and latency of updates in a burst of changes of their resource (as the host counts one);
//   - the saturation point: the highest offered rate with p99 ≤ 1 s, by a short step search,
//     and the highest rate tried with p99 within the goal of 250 ms (stepping further down
//     when no rate tried met it, then once between it and the next rate tried above it);
//   - with the embedded server, the in-memory variant (-memory): the same workload at the same
//     rate on a fresh stack with the in-memory test server (temporaltest), printed as memory-*
//     figures beside the embedded default's, labelled as such.
//
// The main figures are printed as soon as they are measured, so that a run stopped later (its
// -budget leaves out saturation steps and the in-memory variant that would not fit; an
// interrupt) keeps them.
//
// Every figure is printed on its own line as `bench: <name> <value> <unit> (baseline ...)`.
// With TEMPORAL_ADDRESS set (namespace TEMPORAL_NAMESPACE, default "default"; TLS and API key
// from the TEMPORAL_TLS_* and TEMPORAL_API_KEY variables), the stack uses that cluster instead
// of the embedded one, floor included; -temporal memory uses the in-memory test server.
//
//	go run ./bench throughput [-subscriptions 1000] [-rate 150] [-duration 30s] [-step 10s] [-memory 20s] [-budget 5m]
package throughput

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/harness/benchline"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/harness/floor"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// saturationP99 is the latency bound of the saturation point.
const saturationP99 = time.Second

// goalP99 is issue 16's latency goal: p99 from mutation to accepted version.
const goalP99 = 250 * time.Millisecond

// goalSteps is how many steps below the saturation search the goal search takes at most.
const goalSteps = 2

type config struct {
	n           int
	rate        float64
	duration    time.Duration
	step        time.Duration
	steps       int
	baseline    time.Duration
	admin       string
	temporal    string
	persistence string
	worker      string
	workerBin   string
	sample      int
	noFloor     bool
	floorUpdate bool
	cpuProfile  string
	memory      time.Duration
	idle        time.Duration
	budget      time.Duration
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench throughput` (bench/main.go) calls it.
func Main() {
	var c config
	flag.IntVar(&c.n, "subscriptions", 1000, "number of subscriptions (one resource each), and of floor workflows")
	flag.Float64Var(&c.rate, "rate", 150, "offered mutations per second during the measurement (mcpsync and floor)")
	flag.DurationVar(&c.duration, "duration", 30*time.Second, "length of the measurement at -rate")
	flag.DurationVar(&c.step, "step", 10*time.Second, "length of each saturation step (0: no saturation search)")
	flag.IntVar(&c.steps, "steps", 3, "at most this many saturation steps")
	flag.DurationVar(&c.baseline, "baseline", 5*time.Second, "length of the raw go-sdk read loop")
	flag.StringVar(&c.admin, "database", os.Getenv("MCPSYNC_BENCH_DATABASE_URL"), "admin URL of a Postgres server for the ledger (empty: start a private cluster, fsync on)")
	flag.StringVar(&c.temporal, "temporal", "", "Temporal server: embedded (make run's default), memory (in-memory temporaltest) or external (TEMPORAL_ADDRESS); default external when TEMPORAL_ADDRESS is set, else embedded")
	flag.StringVar(&c.persistence, "persistence", makeRunPersistence(), "embedded server persistence: sqlite or postgres (default: what make run's mcpsync-dev uses, MCPSYNC_TEMPORAL_PERSISTENCE or devtemporal.DefaultPersistence)")
	flag.StringVar(&c.worker, "worker", "process", "where the mcpsync worker runs: process (a separate mcpsync-worker, as make run) or inprocess")
	flag.StringVar(&c.workerBin, "worker-bin", "", "mcpsync-worker binary for -worker process (empty: go build ./worker into a temporary directory)")
	flag.IntVar(&c.sample, "sample", 100, "workflows whose histories are counted for events per update")
	flag.BoolVar(&c.noFloor, "no-floor", false, "skip the floor")
	flag.BoolVar(&c.floorUpdate, "floor-update", false, "also measure the floor with workflow updates instead of signals, after the floor (printed as floor-update-*)")
	flag.StringVar(&c.cpuProfile, "cpuprofile", "", "write a CPU profile of the mcpsync measurement phase to this file")
	flag.DurationVar(&c.memory, "memory", 20*time.Second, "with the embedded server: also measure the in-memory variant (temporaltest) at -rate for this long on a fresh stack, printed as memory-* beside the embedded figures (0: skip)")
	flag.DurationVar(&c.idle, "idle", 3*time.Second, "how long the stack's idle CPU is measured, before the floor and after the subscribe (0: not measured; the CPU figures are then gross)")
	flag.DurationVar(&c.budget, "budget", 0, "the run's time budget: saturation steps and the in-memory variant are left out (and say so) when they would not fit (0: no limit)")
	flag.Parse()
	if flag.NArg() > 0 || c.n <= 0 || !(c.rate > 0) || math.IsInf(c.rate, 0) || c.duration <= 0 || c.sample < 0 || c.steps < 0 || c.memory < 0 || c.idle < 0 || c.budget < 0 || c.step < 0 || c.baseline <= 0 {
		fmt.Fprintln(os.Stderr, "throughput: bad arguments (see -help): -subscriptions, -rate, -duration, -baseline must be positive (-rate finite), -memory, -idle, -budget, -step, -steps, -sample not negative, no positional arguments")
		os.Exit(2)
	}
	if c.noFloor && c.floorUpdate {
		fmt.Fprintln(os.Stderr, "throughput: -floor-update measures the floor a second way and needs the floor: drop -no-floor")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "throughput:", err)
		os.Exit(1)
	}
}

// makeRunPersistence is the persistence mcpsync-dev gives the embedded server: its
// --temporal-persistence default: MCPSYNC_TEMPORAL_PERSISTENCE, else devtemporal.DefaultPersistence.
func makeRunPersistence() string {
	if v := os.Getenv("MCPSYNC_TEMPORAL_PERSISTENCE"); v != "" {
		return v
	}
	return string(devtemporal.DefaultPersistence)
}

func uriOf(i int) string { return fmt.Sprintf("demo://items/%04d", i) }

func stackOptions(ctx context.Context, c config) (localstack.Options, func(), error) {
	opts := localstack.Options{AdminURL: c.admin}
	kind := c.temporal
	if kind == "" {
		kind = "embedded"
		if os.Getenv("TEMPORAL_ADDRESS") != "" {
			kind = "external"
		}
	}
	switch kind {
	case "embedded":
		opts.Temporal = localstack.TemporalEmbedded
		if c.persistence != "" {
			p, err := devtemporal.ParsePersistence(c.persistence)
			if err != nil {
				return opts, nil, err
			}
			opts.Persistence = p
		}
	case "memory":
		opts.Temporal = localstack.TemporalTest
	case "external":
		opts.Temporal = localstack.TemporalExternal
		opts.TemporalAddress, opts.TemporalNamespace = os.Getenv("TEMPORAL_ADDRESS"), os.Getenv("TEMPORAL_NAMESPACE")
		if opts.TemporalAddress == "" {
			return opts, nil, errors.New("-temporal external needs TEMPORAL_ADDRESS")
		}
	default:
		return opts, nil, fmt.Errorf("-temporal %q: want embedded, memory or external", kind)
	}
	cleanup := func() {}
	switch c.worker {
	case "inprocess":
	case "process":
		bin := c.workerBin
		if bin == "" {
			dir, err := os.MkdirTemp("", "mcpsync-bench-")
			if err != nil {
				return opts, nil, err
			}
			cleanup = func() { os.RemoveAll(dir) }
			bin = filepath.Join(dir, "mcpsync-worker")
			cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/mcpsync/mcpsync/worker")
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			if err := cmd.Run(); err != nil {
				cleanup()
				return opts, nil, fmt.Errorf("build mcpsync-worker (or pass -worker-bin): %w", err)
			}
		}
		opts.WorkerCommand = []string{bin}
	default:
		return opts, nil, fmt.Errorf("-worker %q: want process or inprocess", c.worker)
	}
	return opts, cleanup, nil
}

func run(ctx context.Context, c config) error {
	start := time.Now()
	b := budget{start: start, total: c.budget}
	opts, cleanup, err := stackOptions(ctx, c)
	if err != nil {
		return err
	}
	defer cleanup()
	st, err := localstack.Start(ctx, opts)
	if err != nil {
		return err
	}
	stopped := false
	stopStack := func() {
		if !stopped {
			stopped = true
			st.Stop()
		}
	}
	defer stopStack()
	persistence := ""
	if opts.Temporal == localstack.TemporalEmbedded {
		persistence = "persistence " + string(opts.Persistence)
		if opts.Persistence == "" {
			persistence = "persistence: devtemporal's default"
		}
	}
	fmt.Printf("throughput: Temporal %s %s (%s, namespace %s), worker %s, ledger %s; %d CPUs, load %s\n",
		opts.Temporal, persistence, st.TemporalAddress, st.Namespace, c.worker, ledgerKind(c.admin), runtime.NumCPU(), loadAvg())
	fmt.Printf("throughput: stack up in %s\n", time.Since(start).Round(time.Millisecond))

	// CPU and database readings: the machine, the stack's processes, the cluster's databases.
	ledgerDB := st.Store.Pool().Config().ConnConfig.Database
	read := func() cpuReading { return readCPU(ctx, st.Store.Pool(), ledgerDB, st.WorkerPID()) }

	// The floor first, on the fresh server (a conservative baseline for the ratio).
	var fl floor.Result
	var flCPU cpuCost
	if !c.noFloor {
		if c.idle > 0 {
			if flCPU.idle, err = idleCPU(ctx, read, c.idle); err != nil {
				return err
			}
			fmt.Printf("throughput: CPU of the stack idle, nothing subscribed (%s): %s\n", c.idle, flCPU.idle.describe())
		}
		if fl, flCPU.used, err = runFloor(ctx, st, c, read, "floor", floor.Options{}); err != nil {
			return err
		}
		flCPU.updates = fl.Accepted
		if c.floorUpdate {
			flU, used, err := runFloor(ctx, st, c, read, "floor with workflow updates", floor.Options{Update: true})
			if err != nil {
				return err
			}
			printFloorUpdate(os.Stdout, c.n, fl, flCPU, flU, cpuCost{used: used, updates: flU.Accepted})
		}
	}

	e, err := prepare(ctx, st, c.n, time.Now().Add(min(5*time.Minute, b.left()-c.duration-c.baseline-30*time.Second)))
	if err != nil {
		return err
	}
	defer e.close()
	fmt.Printf("throughput: %d subscriptions ACTIVE with their first version in %s\n", c.n, e.active.Round(time.Millisecond))

	rawRate, rawP50, rawP99, err := rawReadLoop(ctx, e.http.URL, c.n, c.baseline)
	if err != nil {
		return err
	}
	// Measured after the raw read loop, not right after the subscribe, whose tail (visibility
	// and timer work of the starts) is not the subscriptions' steady background.
	var e2eIdle cpuReading
	if c.idle > 0 {
		if e2eIdle, err = idleCPU(ctx, read, c.idle); err != nil {
			return err
		}
		fmt.Printf("throughput: CPU of the stack idle with %d subscriptions (%s): %s\n", c.n, c.idle, e2eIdle.describe())
	}

	if c.cpuProfile != "" {
		f, err := os.Create(c.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	e.m.readCPU = read
	e2e, err := e.m.measure(ctx, st, c.rate, c.duration, max(10*time.Second, min(time.Minute, b.left()-c.duration-20*time.Second)))
	if err != nil {
		return err
	}
	e2eCPU := cpuCost{used: e2e.cpu, updates: e2e.accepted, idle: e2eIdle}
	if c.cpuProfile != "" {
		pprof.StopCPUProfile()
	}
	fmt.Printf("throughput: mcpsync at %.0f/s: %d mutations, %d accepted, %d superseded, %d never accepted\n",
		c.rate, e2e.sent, e2e.accepted, e2e.superseded, e2e.missing)
	fmt.Printf("throughput: CPU from the first mutation until all were accepted (%s): %s\n",
		e2e.end.Sub(e2e.start).Round(time.Millisecond), e2eCPU.used.describe())
	if !c.noFloor {
		fmt.Printf("throughput: CPU of the floor's offered phase (%s): %s\n", fl.Span.Round(time.Millisecond), flCPU.used.describe())
	}

	// The main figures right away: a later phase that runs out of time loses only its own.
	n := c.n
	name := func(s string) string { return fmt.Sprintf("%s-%d", s, n) }
	fig := func(nm string, v float64, unit string) benchline.Figure {
		return benchline.Figure{Name: nm, Value: v, Unit: unit}
	}
	out := os.Stdout
	fmt.Fprintln(out)
	benchline.Print(out, fig(name("e2e-offered"), e2e.offered, "/s"))
	if !c.noFloor {
		benchline.PrintVs(out, fig(name("e2e-accepted"), e2e.perSec, "/s"), fig(name("floor-accepted"), fl.AcceptedPerSec, "/s"))
		benchline.PrintVs(out, fig(name("e2e-p50"), ms(e2e.p50), "ms"), fig(name("floor-p50"), ms(fl.P50All), "ms"))
		benchline.PrintVs(out, fig(name("e2e-p99"), ms(e2e.p99), "ms"), fig(name("floor-p99"), ms(fl.P99All), "ms"))
		benchline.Print(out, fig(name("floor-offered"), fl.Offered, "/s"))
		benchline.Print(out, fig(name("floor-never-accepted"), float64(fl.Missing), "signals"))
		benchline.Print(out, fig(name("floor-signal-errors"), float64(fl.SignalErrors), "signals"))
	} else {
		benchline.Print(out, fig(name("e2e-accepted"), e2e.perSec, "/s"))
		benchline.Print(out, fig(name("e2e-p50"), ms(e2e.p50), "ms"))
		benchline.Print(out, fig(name("e2e-p99"), ms(e2e.p99), "ms"))
	}
	benchline.Print(out, fig(name("e2e-max"), ms(e2e.max), "ms"))
	// What the read quieting costs (R13, R27): a lone update's read waits for its URI to be
	// quiet for the read quiet period; an update in a burst of changes of its resource (as
	// many in a row as make a burst for the host, each within the burst quiet period of the
	// one before) waits for that long a quiet. The burst share bounds the p99 from below by
	// the burst quiet period once it is over 1 %.
	readQuiet, burstQuiet, _ := mcphost.ReadQuieting()
	benchline.Print(out, fig(name("e2e-burst-share"), 100*float64(e2e.burst)/float64(max(e2e.accepted, 1)), "%"))
	benchline.PrintVs(out, fig(name("e2e-p50-burst"), ms(e2e.burstP50), "ms"), fig("burst-quiet", ms(burstQuiet), "ms"))
	benchline.PrintVs(out, fig(name("e2e-p99-burst"), ms(e2e.burstP99), "ms"), fig("burst-quiet", ms(burstQuiet), "ms"))
	benchline.PrintVs(out, fig(name("e2e-p50-lone"), ms(e2e.loneP50), "ms"), fig("read-quiet", ms(readQuiet), "ms"))
	benchline.PrintVs(out, fig(name("e2e-p99-lone"), ms(e2e.loneP99), "ms"), fig(name("e2e-p99"), ms(e2e.p99), "ms"))
	benchline.Print(out, fig(name("e2e-superseded"), float64(e2e.superseded), "mutations"))
	benchline.Print(out, fig(name("e2e-never-accepted"), float64(e2e.missing), "mutations"))
	benchline.Print(out, fig("raw-reads", rawRate, "/s"))
	benchline.Print(out, fig("raw-read-p50", ms(rawP50), "ms"))
	benchline.Print(out, fig("raw-read-p99", ms(rawP99), "ms"))
	benchline.Print(out, fig(name("e2e-subscribe-active"), e.active.Seconds(), "s"))
	if c.noFloor {
		printCPU(out, n, c.rate, e2eCPU, nil)
	} else {
		printCPU(out, n, c.rate, e2eCPU, &flCPU)
	}

	// History events and workflow tasks per accepted update, on a sample of workflows.
	e2eH, e2eUpdates, err := e2eHistory(ctx, st, e.tail, e2e, c.sample)
	if err != nil {
		return err
	}
	var flH floor.History
	flUpdates := 0
	if !c.noFloor {
		flH, flUpdates, err = floorHistory(ctx, st, fl, c.sample)
		if err != nil {
			return err
		}
	}
	var reads int64
	if err := st.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM read_dispatches WHERE reason = 'notification'`).Scan(&reads); err != nil {
		return err
	}
	notes := int64(e.srv.Stats().UpdatesSent)
	evPer := perUpdate(e2eH.Events, e2eUpdates)
	wftPer := perUpdate(e2eH.WorkflowTasks, e2eUpdates)
	if !c.noFloor {
		benchline.PrintVs(out, fig("e2e-history-events-per-update", evPer, "events"), fig("floor-history-events-per-update", perUpdate(flH.Events, flUpdates), "events"))
		benchline.PrintVs(out, fig("e2e-workflow-tasks-per-update", wftPer, "tasks"), fig("floor-workflow-tasks-per-update", perUpdate(flH.WorkflowTasks, flUpdates), "tasks"))
	} else {
		benchline.Print(out, fig("e2e-history-events-per-update", evPer, "events"))
		benchline.Print(out, fig("e2e-workflow-tasks-per-update", wftPer, "tasks"))
	}
	benchline.Print(out, fig("e2e-reads-per-notification", float64(reads)/float64(max(notes, 1)), ""))
	fmt.Printf("throughput: history counted on %d mcpsync workflows (%d accepted updates) and %d floor workflows (%d updates)\n",
		min(c.sample, n), e2eUpdates, min(c.sample, n), flUpdates)
	fmt.Printf("throughput: mcpsync history events per accepted update, by type: %s\n", e2eH.PerUpdate(e2eUpdates))
	if !c.noFloor {
		fmt.Printf("throughput: floor history events per update, by type: %s\n", flH.PerUpdate(flUpdates))
	}

	// The in-memory variant's cost, estimated from this run: a stack, the same subscribe and
	// one measurement with its drain. The saturation search leaves it that much time.
	memoryKind := opts.Temporal == localstack.TemporalEmbedded && c.memory > 0
	var memoryCost time.Duration
	if memoryKind {
		memoryCost = 10*time.Second + e.active + c.memory + 10*time.Second
	}

	// Saturation: the highest offered rate with p99 <= 1 s, stepping by 1.5x from -rate.
	if c.step > 0 && c.steps > 0 {
		measure := func(rate float64) (e2eResult, error) { return e.m.step(ctx, st, rate, c.step) }
		// One more step needs the step and its drain (typically a few seconds, at most 30 s),
		// and, when it must, still leaves the in-memory variant its time.
		room := func(keepMemory bool) bool {
			need := c.step + 30*time.Second
			if keepMemory {
				need += memoryCost
			}
			return b.left() >= need
		}
		// The saturation point is a figure issue 16 asks for and the in-memory variant is
		// optional, so the first two steps do not wait for it; later ones leave it its time.
		sat, err := stepSearch(c.rate, e2e, saturationP99, c.steps, func(step int) bool { return room(step >= 2) }, measure)
		if err != nil {
			return err
		}
		last := sat.tried[len(sat.tried)-1]
		// The latency goal: the highest rate tried with p99 <= 250 ms, or else steps down from
		// the lowest rate tried; then one step between. Optional like the in-memory variant,
		// so every step leaves it its time.
		goal, err := goalSearch(sat, func(int) bool { return room(true) }, measure)
		if err != nil {
			return err
		}
		// Every rate measured counts for the saturation point too: the goal's step between
		// two rates may have met p99 <= 1 s above the saturation search's point.
		sat = sat.with(goal.tried)
		satFig := fig(name("e2e-saturation"), sat.best, "/s")
		benchline.Print(out, satFig)
		switch {
		case sat.best == 0:
			fmt.Printf("throughput: e2e-saturation 0: no rate tried had p99 <= %s\n", saturationP99)
		case !sat.searchedDown && last.ok():
			fmt.Printf("throughput: e2e-saturation is a lower bound: every rate tried had p99 <= %s (more -steps or a higher -rate would find the point)\n", saturationP99)
		}
		fmt.Printf("throughput: saturation (p99 <= %s) steps: %s%s\n", saturationP99, sat.describe(), sat.skipped)
		// What the offered rate would need, from the cost of an update at the saturation point:
		// past it, every update costs more work (workflow tasks go through the matching
		// service's task table instead of straight to a waiting poller; a superseded change
		// still costs a signal), so the cost measured there would overstate what the rate
		// needs.
		if ok, found := sat.bestResult(); found && ok.accepted > 0 {
			below := cpuCost{used: ok.cpu, updates: ok.accepted, idle: e2eIdle}
			benchline.PrintVs(out, fig(name(fmt.Sprintf("e2e-cpu-marginal-per-update-at-%.0f", ok.offered)), below.marginal(), "ms"),
				fig(name("e2e-cpu-marginal-per-update"), e2eCPU.marginal(), "ms"))
			benchline.PrintVs(out, fig(fmt.Sprintf("e2e-cores-busy-at-%.0f-from-%.0f", c.rate, ok.offered), below.coresAt(c.rate), "cores"),
				fig("machine-cores", float64(runtime.NumCPU()), "cores"))
		}

		benchline.PrintVs(out, fig(name("e2e-p99-goal-rate"), goal.best, "/s"), satFig)
		if goal.best == 0 {
			fmt.Printf("throughput: e2e-p99-goal-rate 0: no rate tried had p99 <= %s\n", goalP99)
		}
		fmt.Printf("throughput: p99 <= %s steps: %s%s\n", goalP99, goal.describe(), goal.skipped)
	}
	fmt.Printf("throughput: goal: e2e-accepted >= 150/s at offered 150/s, p99 <= 250 ms, ratio to floor >= 0.7, 1 workflow task per update\n")

	// The in-memory variant (temporaltest, in-memory SQLite; not durable): the same workload at
	// the same rate on a fresh stack, printed beside the embedded default's figures.
	if memoryKind {
		if left := b.left(); left < memoryCost {
			fmt.Printf("throughput: the in-memory variant is not measured: %s of the budget left, it needs about %s\n", left.Round(time.Second), memoryCost.Round(time.Second))
			return nil
		}
		e.close()
		stopStack()
		mem, memActive, err := memoryVariant(ctx, c, opts, b.left())
		if err != nil {
			return fmt.Errorf("in-memory variant: %w", err)
		}
		fmt.Printf("throughput: in-memory variant at %.0f/s: %d mutations, %d accepted, %d superseded, %d never accepted; %d subscriptions ACTIVE in %s\n",
			c.rate, mem.sent, mem.accepted, mem.superseded, mem.missing, n, memActive.Round(time.Millisecond))
		fmt.Fprintln(out)
		benchline.Print(out, fig(name("memory-e2e-offered"), mem.offered, "/s"))
		benchline.PrintVs(out, fig(name("memory-e2e-accepted"), mem.perSec, "/s"), fig(name("e2e-accepted"), e2e.perSec, "/s"))
		benchline.PrintVs(out, fig(name("memory-e2e-p50"), ms(mem.p50), "ms"), fig(name("e2e-p50"), ms(e2e.p50), "ms"))
		benchline.PrintVs(out, fig(name("memory-e2e-p99"), ms(mem.p99), "ms"), fig(name("e2e-p99"), ms(e2e.p99), "ms"))
		benchline.Print(out, fig(name("memory-e2e-never-accepted"), float64(mem.missing), "mutations"))
		fmt.Printf("throughput: memory-* is the in-memory Temporal test server (temporaltest, in-memory SQLite, not durable; ledger fsync off), measured for %s; its baseline is the embedded default above\n", c.memory)
	}
	return nil
}

// runFloor runs the floor with opts at c's rate over c.n entities and returns it with the CPU
// its offered phase used (the phase is known only afterwards: its CPU comes from readings
// taken all along). It says what it measured at once, so that a later phase that fails does
// not take the floor's figures with it.
func runFloor(ctx context.Context, st *localstack.Stack, c config, read func() cpuReading, label string, opts floor.Options) (floor.Result, cpuReading, error) {
	t := time.Now()
	queue := fmt.Sprintf("floor-bench-%d", os.Getpid())
	if opts.Update {
		queue += "-update"
	}
	samples := cpustat.Sample(200*time.Millisecond, read)
	fl, err := floor.RunWithOptions(ctx, st.Client, queue, c.n, c.rate, c.duration, opts)
	samples.Stop()
	if err != nil {
		return floor.Result{}, cpuReading{}, err
	}
	used := samples.At(fl.Start.Add(fl.Span)).sub(samples.At(fl.Start))
	fmt.Printf("throughput: %s done in %s: %d sent, %d local activities, %d repeated, %d calls failed %q, %d workflows left unterminated\n",
		label, time.Since(t).Round(time.Millisecond), fl.Sent, fl.Accepted, fl.Repeated, fl.SignalErrors, fl.SignalErrorSample, fl.Unterminated)
	fmt.Printf("throughput: %s at %.0f/s offered: %.1f accepted/s, p50 %.0f ms, p99 %.0f ms (never accepted counted as infinitely late)\n",
		label, fl.Offered, fl.AcceptedPerSec, ms(fl.P50All), ms(fl.P99All))
	return fl, used, nil
}

// printFloorUpdate prints the floor with workflow updates (flU, its cost cu) beside the floor
// with signals (fl, its cost cf).
func printFloorUpdate(out io.Writer, n int, fl floor.Result, cf cpuCost, flU floor.Result, cu cpuCost) {
	fig := func(what string, v float64, unit string) benchline.Figure {
		return benchline.Figure{Name: fmt.Sprintf("%s-%d", what, n), Value: v, Unit: unit}
	}
	vs := func(what string, u, s float64, unit string) {
		benchline.PrintVs(out, fig("floor-update-"+what, u, unit), fig("floor-"+what, s, unit))
	}
	vs("accepted", flU.AcceptedPerSec, fl.AcceptedPerSec, "/s")
	vs("p50", ms(flU.P50All), ms(fl.P50All), "ms")
	vs("p99", ms(flU.P99All), ms(fl.P99All), "ms")
	vs("cpu-per-update", cu.perUpdate(cu.used.busy), cf.perUpdate(cf.used.busy), "ms")
	vs("cpu-this-process-per-update", cu.perUpdate(cu.used.self), cf.perUpdate(cf.used.self), "ms")
	vs("cpu-postgres-per-update", cu.perUpdate(cu.used.pg), cf.perUpdate(cf.used.pg), "ms")
	benchline.Print(out, fig("floor-update-offered", flU.Offered, "/s"))
	benchline.Print(out, fig("floor-update-errors", float64(flU.SignalErrors), "updates"))
}

// budget is the time the whole run may take (total 0: no limit).
type budget struct {
	start time.Time
	total time.Duration
}

// left is the time left of the budget (a very long time without one).
func (b budget) left() time.Duration {
	if b.total == 0 {
		return 1 << 62
	}
	return b.total - time.Since(b.start)
}

func loadAvg() string {
	load, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(load))
	return strings.Join(f[:min(3, len(f))], " ")
}

// e2eSetup is an MCP server with n resources, subscribed through a stack, and the outbox tail
// that sees their acceptances.
type e2eSetup struct {
	srv    *chaosmcp.Server
	http   *chaosmcp.HTTPServer
	tail   *tail
	m      *mutator
	active time.Duration // from the first subscribe call until all n were ACTIVE with a version
	stop   func()
}

func (e *e2eSetup) close() {
	if e.stop != nil {
		e.stop()
		e.stop = nil
	}
}

// prepare starts the fault-injecting MCP server with n resources, registers it as source
// "bench", subscribes all n, waits until they are ACTIVE with their first version (at most
// until deadline) and starts following the outbox.
func prepare(ctx context.Context, st *localstack.Stack, n int, deadline time.Time) (*e2eSetup, error) {
	srv := chaosmcp.New(chaosmcp.Options{Name: "bench", Version: "1"})
	for i := 0; i < n; i++ {
		srv.Set(uriOf(i), "r0", "text/plain")
	}
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, err
	}
	tailCtx, stopTail := context.WithCancel(ctx)
	e := &e2eSetup{srv: srv, http: h, tail: newTail(), stop: func() { stopTail(); h.Close(); srv.Close() }}
	fail := func(err error) (*e2eSetup, error) { e.close(); return nil, err }
	if _, err := st.MustCLI(ctx, "source", "add", "bench", "--url", h.URL, "--backstop", "10m"); err != nil {
		return fail(err)
	}
	t0 := time.Now()
	if err := subscribeAll(ctx, st, n); err != nil {
		return fail(err)
	}
	if err := waitActive(ctx, st, n, deadline); err != nil {
		return fail(err)
	}
	e.active = time.Since(t0)
	head, err := st.Store.OutboxHead(ctx)
	if err != nil {
		return fail(err)
	}
	go e.tail.run(tailCtx, st.Store, head)
	e.m = &mutator{srv: srv, tail: e.tail, n: n, rng: rand.New(rand.NewPCG(1, 2))}
	return e, nil
}

// memoryVariant measures the same workload on a fresh stack with the in-memory Temporal test
// server (the worker as the embedded run had it): -rate for -memory, subscribing within left.
func memoryVariant(ctx context.Context, c config, embedded localstack.Options, left time.Duration) (e2eResult, time.Duration, error) {
	opts := localstack.Options{AdminURL: c.admin, Temporal: localstack.TemporalTest, WorkerCommand: embedded.WorkerCommand}
	st, err := localstack.Start(ctx, opts)
	if err != nil {
		return e2eResult{}, 0, err
	}
	defer st.Stop()
	e, err := prepare(ctx, st, c.n, time.Now().Add(min(5*time.Minute, left-c.memory-20*time.Second)))
	if err != nil {
		return e2eResult{}, 0, err
	}
	defer e.close()
	r, err := e.m.measure(ctx, st, c.rate, c.memory, 30*time.Second)
	return r, e.active, err
}

func ledgerKind(admin string) string {
	if admin == "" {
		return "private PostgreSQL cluster (fsync on)"
	}
	return "given PostgreSQL server"
}

func ms(d time.Duration) float64 {
	if d == infinite {
		return math.Inf(1)
	}
	return float64(d) / float64(time.Millisecond)
}

func perUpdate(count, updates int) float64 {
	if updates == 0 {
		return math.NaN()
	}
	return float64(count) / float64(updates)
}

// subscribeAll subscribes uriOf(0..n-1) with one bulk `mcpsync subscribe --uris-file` call
// (32 workflow starts in flight), not waiting for ACTIVE (waitActive does).
func subscribeAll(ctx context.Context, st *localstack.Stack, n int) error {
	f, err := os.CreateTemp("", "mcpsync-bench-uris-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(uriOf(i) + "\n")
	}
	if _, err := f.WriteString(b.String()); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = st.MustCLI(ctx, "subscribe", "bench", "--uris-file", f.Name(), "--parallel", "32", "--wait", "0")
	return err
}

// waitActive waits until all n subscriptions are ACTIVE with a version, at most until
// deadline; past it, the error says how many were.
func waitActive(ctx context.Context, st *localstack.Stack, n int, deadline time.Time) error {
	began := time.Now()
	active := 0
	for time.Now().Before(deadline) {
		if err := st.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM subscriptions WHERE state = 'ACTIVE' AND last_accepted_ordinal > 0`).Scan(&active); err != nil {
			return err
		}
		if active == n {
			return nil
		}
		if exited, log := st.WorkerExited(); exited {
			return fmt.Errorf("the worker process exited; its log: %s", log)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("only %d of %d subscriptions ACTIVE with a version after %s (%.1f/s)", active, n, time.Since(began).Round(time.Second), float64(active)/time.Since(began).Seconds())
}

// key is one mutation: a resource and the digest of the body it was set to.
type key struct{ uri, digest string }

// tail follows the outbox and records when each (uri, digest) was accepted (the outbox row's
// timestamp).
type tail struct {
	mu       sync.Mutex
	accepted map[key]time.Time
}

func newTail() *tail { return &tail{accepted: map[key]time.Time{}} }

func (t *tail) run(ctx context.Context, st *ledger.Store, cur ledger.OutboxCursor) {
	// As a consumer would: a batch on each outbox notification (LISTEN), not a poll every
	// few milliseconds whose queries would count as the ledger's work per update; polling
	// every 20 ms only if listening fails.
	l, err := st.ListenOutbox(ctx, fmt.Sprintf("throughput-bench-%d", os.Getpid()))
	if err != nil {
		l = nil
	}
	defer func() {
		if l != nil {
			l.Close()
		}
	}()
	for {
		rows, _, err := st.OutboxBatch(ctx, cur, 1000)
		if err != nil {
			return
		}
		t.mu.Lock()
		for _, r := range rows {
			cur = r.Cursor
			if r.Kind == "version" {
				t.accepted[key{r.URI, r.Digest}] = r.CreatedAt
			}
		}
		t.mu.Unlock()
		if len(rows) == 1000 {
			continue
		}
		if l != nil {
			if _, err := l.Wait(ctx, time.Second); err == nil {
				continue
			}
			l.Close()
			l = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (t *tail) at(k key) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.accepted[k]
	return at, ok
}

// infinite stands for the latency of a mutation never accepted.
const infinite = floor.Never

// e2eResult is one measurement of mcpsync at an offered rate.
type e2eResult struct {
	rate                          float64
	sent                          int
	offered                       float64
	accepted, superseded, missing int
	perSec                        float64
	p50, p99, max                 time.Duration
	start, end                    time.Time
	converged                     bool
	acceptedInWindow              map[string]int // per URI
	// The accepted mutations in a burst of mutations of their resource, as the host counts a
	// burst (their read waits for the burst quiet period, R13), their share, and the latency
	// percentiles of the others (lone) and of them (burst).
	burst              int
	loneP50, loneP99   time.Duration
	burstP50, burstP99 time.Duration
	// cpu is the CPU used from the first mutation until the last was accepted (or the drain
	// ended), when the mutator reads it.
	cpu cpuReading
}

// meets reports whether every update of r was accepted with p99 within bound.
func (r e2eResult) meets(bound time.Duration) bool { return r.converged && r.p99 <= bound }

// ok reports whether r meets the saturation point's bound.
func (r e2eResult) ok() bool { return r.meets(saturationP99) }

type mutator struct {
	srv   *chaosmcp.Server
	tail  *tail
	n     int
	rng   *rand.Rand
	count int
	// latest is each resource's last mutation (kept across measurements).
	latest map[string]key
	// readCPU reads the CPU counters around each measurement (nil: not read).
	readCPU func() cpuReading
}

// measure mutates random resources at rate for d, then waits at most drain until every
// resource's last content is accepted. A mutation never accepted counts as infinite latency; one
// a later mutation of the same resource replaced before acceptance counts as superseded.
func (m *mutator) measure(ctx context.Context, st *localstack.Stack, rate float64, d, drain time.Duration) (e2eResult, error) {
	if m.latest == nil {
		m.latest = map[string]key{}
	}
	mutated := map[key]time.Time{}
	// inBurst: the mutation is in a burst of its resource's mutations: at least burstPulses
	// in a row (run), each within the burst quiet period of the one before.
	inBurst := map[key]bool{}
	lastAt, run := map[string]time.Time{}, map[string]int{}
	_, burstQuiet, burstPulses := mcphost.ReadQuieting()
	interval := time.Duration(float64(time.Second) / rate)
	var cpu0 cpuReading
	if m.readCPU != nil {
		cpu0 = m.readCPU()
	}
	res := e2eResult{rate: rate, start: time.Now()}
	next := res.start
	for time.Since(res.start) < d && ctx.Err() == nil {
		i := m.rng.IntN(m.n)
		body := fmt.Sprintf("update %d of %s", m.count, uriOf(i))
		k := key{uriOf(i), ledger.Digest([]byte(body))}
		now := time.Now()
		if prev, ok := lastAt[k.uri]; ok && now.Sub(prev) <= burstQuiet {
			run[k.uri]++
		} else {
			run[k.uri] = 1
		}
		inBurst[k] = run[k.uri] >= burstPulses
		lastAt[k.uri] = now
		mutated[k] = now
		m.latest[k.uri] = k
		m.srv.Set(k.uri, body, "text/plain")
		m.count++
		res.sent++
		next = next.Add(interval)
		if w := time.Until(next); w > 0 {
			time.Sleep(w)
		}
	}
	phase := time.Since(res.start)
	res.offered = float64(res.sent) / phase.Seconds()
	if err := ctx.Err(); err != nil {
		return res, err
	}
	var err error
	if res.converged, err = m.settle(ctx, st, drain); err != nil {
		return res, err
	}
	res.end = time.Now()
	if m.readCPU != nil {
		res.cpu = m.readCPU().sub(cpu0)
	}
	var lat, lone, burst []time.Duration
	last := res.start
	res.acceptedInWindow = map[string]int{}
	for k, at := range mutated {
		acc, ok := m.tail.at(k)
		switch {
		case ok:
			lat = append(lat, acc.Sub(at))
			if inBurst[k] {
				burst = append(burst, acc.Sub(at))
			} else {
				lone = append(lone, acc.Sub(at))
			}
			res.accepted++
			res.acceptedInWindow[k.uri]++
			if acc.After(last) {
				last = acc
			}
		case m.latest[k.uri] != k:
			res.superseded++ // a later mutation of the same resource was accepted instead (coalesced)
		default:
			res.missing++
			lat = append(lat, infinite)
		}
	}
	res.perSec = float64(res.accepted) / max(phase, last.Sub(res.start)).Seconds()
	res.p50, res.p99, res.max = floor.Percentile(lat, 0.5), floor.Percentile(lat, 0.99), floor.Percentile(lat, 1)
	res.burst = len(burst)
	res.loneP50, res.loneP99 = floor.Percentile(lone, 0.5), floor.Percentile(lone, 0.99)
	res.burstP50, res.burstP99 = floor.Percentile(burst, 0.5), floor.Percentile(burst, 0.99)
	return res, nil
}

// settle waits at most d until every resource's last content is accepted and reports whether
// it was.
func (m *mutator) settle(ctx context.Context, st *localstack.Stack, d time.Duration) (bool, error) {
	deadline := time.Now().Add(d)
	for {
		done := true
		for _, k := range m.latest {
			if _, ok := m.tail.at(k); !ok {
				done = false
				break
			}
		}
		if done {
			return true, nil
		}
		if exited, log := st.WorkerExited(); exited {
			return false, fmt.Errorf("the worker process exited; its log: %s", log)
		}
		if time.Now().After(deadline) {
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// saturation is a step search's outcome against one latency bound.
type saturation struct {
	bound        time.Duration // the p99 a rate must meet (with every update accepted)
	best         float64       // highest offered rate that met the bound (0: none did)
	tried        []e2eResult
	searchedDown bool   // the search stepped down from -rate
	skipped      string // why the search stopped before it found the point, if it did
}

// bestResult is the measurement at the saturation point (false when no rate met the bound).
func (s saturation) bestResult() (e2eResult, bool) {
	for _, r := range s.tried {
		if r.meets(s.bound) && r.offered == s.best {
			return r, true
		}
	}
	return e2eResult{}, false
}

// within is s's measurements judged against another bound, without new steps: best is the
// highest rate tried that met it.
func (s saturation) within(bound time.Duration) saturation {
	w := saturation{bound: bound, tried: s.tried}
	for _, r := range s.tried {
		if r.meets(bound) {
			w.best = max(w.best, r.offered)
		}
	}
	return w
}

// with is s judged again over every measurement in tried (which holds s's own): its point is
// the highest rate in tried that met s's bound.
func (s saturation) with(tried []e2eResult) saturation {
	w := saturation{tried: tried}.within(s.bound)
	w.searchedDown, w.skipped = s.searchedDown, s.skipped
	return w
}

// lowest is the measurement at the lowest rate tried.
func (s saturation) lowest() e2eResult {
	low := s.tried[0]
	for _, r := range s.tried[1:] {
		if r.rate < low.rate {
			low = r
		}
	}
	return low
}

func (s saturation) describe() string {
	var parts []string
	for _, r := range s.tried {
		verdict := "ok"
		if !r.meets(s.bound) {
			verdict = "over"
		}
		p99 := fmt.Sprint(r.p99.Round(time.Millisecond))
		if r.p99 == infinite {
			p99 = "inf (not all accepted)"
		}
		parts = append(parts, fmt.Sprintf("%.0f/s → accepted %.0f/s p99 %s %s", r.offered, r.perSec, p99, verdict))
	}
	return strings.Join(parts, "; ")
}

// stepSearch steps the offered rate up by 1.5x from rate while the p99 meets bound (down by
// 1.5x while it does not); first is the measurement at rate, measure takes one step's
// measurement, at most steps steps, and step i (from 0) only when more(i) says there is time
// for it.
func stepSearch(rate float64, first e2eResult, bound time.Duration, steps int, more func(step int) bool, measure func(rate float64) (e2eResult, error)) (saturation, error) {
	s := saturation{bound: bound, tried: []e2eResult{first}}
	up := first.meets(bound)
	if up {
		s.best = first.offered
	}
	s.searchedDown = !up
	cur := rate
	for i := range steps {
		if !more(i) {
			s.skipped = fmt.Sprintf(" (stopped after %d of at most %d steps: the budget)", i, steps)
			break
		}
		if up {
			cur *= 1.5
		} else {
			cur /= 1.5
		}
		r, err := measure(cur)
		if err != nil {
			return s, err
		}
		s.tried = append(s.tried, r)
		if r.meets(bound) {
			s.best = max(s.best, r.offered)
			if !up {
				break
			}
		} else if up {
			break
		}
	}
	return s, nil
}

// goalSearch judges sat's measurements against the latency goal (goalP99) and, when none met
// it, steps down from the lowest rate sat tried, at most goalSteps steps; then, when a rate met
// it, refine tries once between that rate and the next one tried above it. The result's tried
// holds sat's measurements and its own; more(i) says whether there is time for its step i.
func goalSearch(sat saturation, more func(step int) bool, measure func(rate float64) (e2eResult, error)) (saturation, error) {
	goal := sat.within(goalP99)
	taken := 0
	if goal.best == 0 {
		lowest := sat.lowest()
		down, err := stepSearch(lowest.rate, lowest, goalP99, goalSteps, more, measure)
		down.tried = append(sat.tried[:len(sat.tried):len(sat.tried)], down.tried[1:]...)
		if err != nil || down.best == 0 {
			return down, err
		}
		goal, taken = down, len(down.tried)-len(sat.tried)
	}
	return goal.refine(func(int) bool { return more(taken) }, measure)
}

// refine measures once more at the geometric mean of s's point (the highest rate tried that met
// the bound) and the lowest rate tried above it that did not, when the two are more than ×1.25
// apart and more(0) leaves time: the ×1.5 steps bracket the point to within ×1.22 instead.
func (s saturation) refine(more func(step int) bool, measure func(rate float64) (e2eResult, error)) (saturation, error) {
	if s.best == 0 {
		return s, nil
	}
	above := math.Inf(1)
	for _, r := range s.tried {
		if r.offered > s.best && !r.meets(s.bound) {
			above = min(above, r.offered)
		}
	}
	if math.IsInf(above, 1) || above <= 1.25*s.best {
		return s, nil
	}
	if !more(0) {
		s.skipped += fmt.Sprintf(" (no time to try between %.0f and %.0f/s: the budget)", s.best, above)
		return s, nil
	}
	r, err := measure(math.Sqrt(s.best * above))
	if err != nil {
		return s, err
	}
	s.tried = append(s.tried[:len(s.tried):len(s.tried)], r)
	if r.meets(s.bound) {
		s.best = max(s.best, r.offered)
	}
	return s, nil
}

// step is one step of a search: rate offered for d, then, when not every update was accepted,
// a wait until the backlog clears so that it does not spoil what comes next.
func (m *mutator) step(ctx context.Context, st *localstack.Stack, rate float64, d time.Duration) (e2eResult, error) {
	r, err := m.measure(ctx, st, rate, d, 30*time.Second)
	if err != nil {
		return r, err
	}
	fmt.Printf("throughput: step at %.0f/s: accepted %.0f/s, p99 %s; CPU: %s\n", r.offered, r.perSec, r.p99.Round(time.Millisecond), r.cpu.describe())
	if !r.converged {
		if _, err := m.settle(ctx, st, time.Minute); err != nil {
			return r, err
		}
	}
	return r, nil
}

// e2eHistory counts the history of a sample of subscription workflows over r's window and the
// updates accepted for them in it.
func e2eHistory(ctx context.Context, st *localstack.Stack, tl *tail, r e2eResult, sample int) (floor.History, int, error) {
	rows, err := st.Store.Pool().Query(ctx, `SELECT uri, workflow_id FROM subscriptions WHERE state = 'ACTIVE' ORDER BY uri`)
	if err != nil {
		return floor.History{}, 0, err
	}
	type sub struct{ uri, wf string }
	var subs []sub
	for rows.Next() {
		var s sub
		if err := rows.Scan(&s.uri, &s.wf); err != nil {
			return floor.History{}, 0, err
		}
		subs = append(subs, s)
	}
	if err := rows.Err(); err != nil {
		return floor.History{}, 0, err
	}
	rand.New(rand.NewPCG(3, 4)).Shuffle(len(subs), func(i, j int) { subs[i], subs[j] = subs[j], subs[i] })
	subs = subs[:min(sample, len(subs))]
	var total floor.History
	updates := 0
	for _, s := range subs {
		h, err := floor.CountHistory(ctx, st.Client, s.wf, r.start, r.end)
		if err != nil {
			return floor.History{}, 0, err
		}
		total = total.Add(h)
		updates += r.acceptedInWindow[s.uri]
	}
	return total, updates, nil
}

// floorHistory counts the history of a sample of the floor's workflows over its window.
func floorHistory(ctx context.Context, st *localstack.Stack, r floor.Result, sample int) (floor.History, int, error) {
	idx := rand.New(rand.NewPCG(5, 6)).Perm(len(r.WorkflowIDs))[:min(sample, len(r.WorkflowIDs))]
	var total floor.History
	updates := 0
	for _, i := range idx {
		h, err := floor.CountHistory(ctx, st.Client, r.WorkflowIDs[i], r.Start, r.Start.Add(r.Span))
		if err != nil {
			return floor.History{}, 0, err
		}
		total = total.Add(h)
		updates += r.PerWorkflow[i]
	}
	return total, updates, nil
}

// rawReadLoop reads resources sequentially with one go-sdk client session for d.
func rawReadLoop(ctx context.Context, endpoint string, n int, d time.Duration) (perSec float64, p50, p99 time.Duration, err error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "raw", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint}, &mcp.ClientSessionOptions{ProtocolVersion: mcpsync.ProtocolVersion20251125})
	if err != nil {
		return 0, 0, 0, err
	}
	defer cs.Close()
	var lat []time.Duration
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		t := time.Now()
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uriOf(i % n)}); err != nil {
			return 0, 0, 0, err
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	return float64(len(lat)) / time.Since(start).Seconds(), lat[len(lat)/2], lat[len(lat)*99/100], nil
}
