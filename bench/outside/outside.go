// Package outside measures what a user of `make run` sees, from outside the processes, the
// way issue 16 first measured it: bin/mcpsync-dev and bin/mcpsync-worker as make run starts
// them (the gateway on, as there), N subscriptions on an MCP server of their own over stdio
// (bin/mcpsync-demo-server, whose resources this benchmark changes through its loopback
// --control endpoint), resources changed at a fixed offered rate, and every accepted version
// seen as a line of `mcpsync watch --json`, a CLI process of its own. For every change it
// takes the time from the change to the line that shows its version, and reports per rate:
//
//   - p50 and p99 of that latency next to the same changes' latency to their acceptance in the
//     ledger (the outbox row's time, which the line carries): what the watch adds;
//   - accepted versions per second next to the offered rate; the share of changes superseded
//     (a later change of the same resource accepted first: coalesced, not lost) and missing
//     (no version after the drain: counted as infinitely late);
//   - the CPU of mcpsync-dev (with its PostgreSQL), of the worker (with the stdio server) and
//     how busy the machine was.
//
// A last phase repeats the highest rate on a busier stack, as the third measurement
// did: -idle more subscriptions on the same server that never change, and the demo source
// make run registers (demo://notes/1 and demo://clock/now, the demo server ticking every
// 3 s); its figures are printed next to the same rate on the quieter stack.
//
// Build first: `make build-run`. Every figure is a line
// `bench: <name> <value> <unit> (baseline <name> <value> <unit>, ratio <r>)`.
//
//	go run ./bench outside [-bin bin] [-subscriptions 100] [-rates 10,30] [-duration 20s] [-idle 100]
package outside

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mcpsync/mcpsync/bench/devstack"
	"github.com/mcpsync/mcpsync/internal/harness/cpustat"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// config is the command line.
type config struct {
	bin           string
	subscriptions int
	rates         []float64
	duration      time.Duration
	drain         time.Duration
	idle          int
	loaded        bool
	keep          bool
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits the
// process when it fails; `mcpsync-bench outside` (bench/main.go) calls it.
func Main() {
	c := config{}
	var rates string
	flag.StringVar(&c.bin, "bin", "bin", "directory of the mcpsync binaries (make build-run)")
	flag.IntVar(&c.subscriptions, "subscriptions", 100, "subscriptions whose resources change")
	flag.StringVar(&rates, "rates", "10,30", "comma-separated offered rates (changes per second), one phase each")
	flag.DurationVar(&c.duration, "duration", 20*time.Second, "how long each phase changes resources")
	flag.DurationVar(&c.drain, "drain", 15*time.Second, "how long a phase waits at most for the last changes' versions")
	flag.IntVar(&c.idle, "idle", 100, "subscriptions that never change, added with the demo source for the last phase")
	flag.BoolVar(&c.loaded, "loaded", true, "run the last phase: the highest rate again with -idle more subscriptions and the demo source")
	flag.BoolVar(&c.keep, "keep", false, "keep the data directory and the logs")
	flag.Parse()
	var err error
	if c.rates, err = parseRates(rates); err == nil && (c.subscriptions < 1 || c.idle < 0 || c.duration <= 0 || c.drain <= 0) {
		err = errors.New("-subscriptions must be at least 1, -idle not negative, -duration and -drain positive")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "outside bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "outside bench:", err)
		os.Exit(1)
	}
}

// parseRates reads -rates: positive numbers, comma-separated.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || !(r > 0) || math.IsInf(r, 0) {
			return nil, fmt.Errorf("-rates %q: %q is not a positive number", s, f)
		}
		out = append(out, r)
	}
	return out, nil
}

func run(ctx context.Context, c config) error {
	bin, err := devstack.Binaries(c.bin)
	if err != nil {
		return err
	}
	dir, cleanup, err := devstack.Workdir("outside", c.keep)
	if err != nil {
		return err
	}
	defer cleanup() // after the processes have stopped (deferred later)
	self := strconv.Itoa(os.Getpid())
	baseEnv := devstack.Environ("MCPSYNC_")
	began := time.Now()
	dev, devEnv, err := devstack.StartDev(devstack.DevOptions{Dir: dir, Name: "dev", Env: baseEnv, Bin: bin, ParentPID: self, Prefix: "outside"})
	if err != nil {
		return err
	}
	ports, err := devstack.FreePorts(2)
	if err != nil {
		devstack.StopProcs(dev)
		return err
	}
	// As make run: the gateway on (it turns on the outbox notifications of versions that
	// watch wakes on), metrics on; on free ports.
	env := append(slices.Clone(baseEnv), devEnv...)
	env = append(env, "MCPSYNC_GATEWAY_ADDR=127.0.0.1:"+ports[0], "MCPSYNC_METRICS_ADDR=127.0.0.1:"+ports[1])
	worker, err := devstack.StartProc(dir, "worker", env, filepath.Join(bin, "mcpsync-worker"), "--parent-pid", self)
	if err != nil {
		devstack.StopProcs(dev)
		return err
	}
	procs := []*exec.Cmd{worker, dev}
	defer func() { devstack.StopProcs(procs...) }()
	cli := func(ctx context.Context, args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "mcpsync"), args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("mcpsync %s: %w: %s", strings.Join(args[:min(2, len(args))], " "), err, strings.TrimSpace(devstack.LastLines(string(out), 5)))
		}
		return nil
	}

	n, total := c.subscriptions, c.subscriptions
	if c.loaded {
		total += c.idle
	}
	controlFile := filepath.Join(dir, "control.url")
	server := fmt.Sprintf("%s --resources %d --interval 1h --control 127.0.0.1:0 --control-file %s", filepath.Join(bin, "mcpsync-demo-server"), total, controlFile)
	if err := devstack.Retry(2*time.Minute, func() error { return cli(ctx, "source", "add", "outside", "--stdio", server) }); err != nil {
		return err
	}
	if err := subscribe(ctx, cli, dir, "active", 1, n); err != nil {
		return err
	}
	fmt.Printf("outside: stack up and %d subscriptions ACTIVE on a stdio source in %.1f s (mcpsync-dev pid %d, worker pid %d)\n",
		n, time.Since(began).Seconds(), dev.Process.Pid, worker.Process.Pid)

	w, err := startWatch(ctx, dir, env, bin)
	if err != nil {
		return err
	}
	defer w.stop()
	m := &mutator{controlFile: controlFile, watch: w, n: n, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 16))}
	if err := m.warmUp(ctx); err != nil {
		return err
	}

	byRate := map[float64]result{}
	for _, rate := range c.rates {
		r, err := m.phase(ctx, rate, c.duration, c.drain, dev.Process.Pid, worker.Process.Pid)
		if err != nil {
			return err
		}
		r.print(os.Stdout, "outside", nil)
		byRate[rate] = r
	}
	if !c.loaded {
		return nil
	}
	rate := slices.Max(c.rates)
	if err := subscribe(ctx, cli, dir, "idle", n+1, c.idle); err != nil {
		return err
	}
	// The demo source exactly as scripts/run.sh registers it, with its two subscriptions.
	demo := filepath.Join(bin, "mcpsync-demo-server") + " --interval 3s --eras both"
	if err := cli(ctx, "source", "add", "demo", "--stdio", demo, "--protocol", "auto", "--poll", "10s"); err != nil {
		return err
	}
	for _, uri := range []string{"demo://notes/1", "demo://clock/now"} {
		if err := cli(ctx, "subscribe", "demo", uri, "--wait", "60s"); err != nil {
			return err
		}
	}
	fmt.Printf("outside: loaded: %d more subscriptions that never change and the demo source with its 2 subscriptions\n", c.idle)
	r, err := m.phase(ctx, rate, c.duration, c.drain, dev.Process.Pid, worker.Process.Pid)
	if err != nil {
		return err
	}
	base := byRate[rate]
	r.print(os.Stdout, "outside-loaded", &base)
	return nil
}

// itemURI is the URI of the demo server's numbered resource i (1-based).
func itemURI(i int) string { return fmt.Sprintf("demo://items/%04d", i) }

// subscribe subscribes the numbered resources from .. from+k-1 in one bulk call and waits
// until all are ACTIVE with a version.
func subscribe(ctx context.Context, cli func(context.Context, ...string) error, dir, name string, from, k int) error {
	if k == 0 {
		return nil
	}
	var b strings.Builder
	for i := from; i < from+k; i++ {
		b.WriteString(itemURI(i) + "\n")
	}
	file := filepath.Join(dir, name+".uris")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return cli(ctx, "subscribe", "outside", "--uris-file", file, "--wait", "3m")
}

// key is one change: a resource and the digest of the text it was set to.
type key struct{ uri, digest string }

// seenVersion is when a version's watch line arrived, and the acceptance time it carries.
type seenVersion struct{ arrived, accepted time.Time }

// watcher runs `mcpsync watch outside --json` and notes when each version's line arrives.
type watcher struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	seen map[key]seenVersion
	done chan struct{}
	err  error
}

func startWatch(ctx context.Context, dir string, env []string, bin string) (*watcher, error) {
	w := &watcher{seen: map[key]seenVersion{}, done: make(chan struct{})}
	w.cmd = exec.CommandContext(ctx, filepath.Join(bin, "mcpsync"), "watch", "outside", "--json")
	w.cmd.Env = env
	stderr, err := os.Create(filepath.Join(dir, "watch.log"))
	if err != nil {
		return nil, err
	}
	w.cmd.Stderr = stderr
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		stderr.Close()
		return nil, err
	}
	if err := w.cmd.Start(); err != nil {
		stderr.Close()
		return nil, err
	}
	go func() {
		defer close(w.done)
		defer stderr.Close()
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			now := time.Now()
			var j struct {
				Time        time.Time
				Kind        string
				URI, Digest string
			}
			if err := json.Unmarshal(sc.Bytes(), &j); err != nil {
				w.fail(fmt.Errorf("watch printed a line that is not JSON: %q: %w", sc.Text(), err))
				continue
			}
			if j.Kind == "version" {
				w.mu.Lock()
				w.seen[key{j.URI, j.Digest}] = seenVersion{arrived: now, accepted: j.Time}
				w.mu.Unlock()
			}
		}
		w.fail(fmt.Errorf("mcpsync watch ended: %v (its stderr: %s)", w.cmd.Wait(), filepath.Join(dir, "watch.log")))
	}()
	return w, nil
}

func (w *watcher) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// at reports when k's line arrived.
func (w *watcher) at(k key) (seenVersion, bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v, ok := w.seen[k]
	return v, ok, w.err
}

func (w *watcher) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		_ = w.cmd.Process.Kill()
	}
}

// mutator changes the server's resources through its control endpoint.
type mutator struct {
	controlFile string
	control     string
	watch       *watcher
	n           int
	rng         *rand.Rand
	seq         int
	client      http.Client
}

// set changes uri to text; the control URL is read again when a call fails (the worker may
// have started the server anew).
func (m *mutator) set(ctx context.Context, uri, text string) error {
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if m.control == "" || attempt > 0 {
			b, rerr := os.ReadFile(m.controlFile)
			if rerr != nil {
				return fmt.Errorf("the server's control endpoint: %w", rerr)
			}
			m.control = strings.TrimSpace(string(b))
		}
		var req *http.Request
		req, err = http.NewRequestWithContext(ctx, http.MethodPost, m.control+"/resources",
			strings.NewReader(url.Values{"uri": {uri}, "text": {text}}.Encode()))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		var resp *http.Response
		if resp, err = m.client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
			err = fmt.Errorf("the server's control endpoint answered %s", resp.Status)
		}
	}
	return err
}

// change sets a random changing resource to a new text and returns the change.
func (m *mutator) change(ctx context.Context) (key, time.Time, error) {
	uri := itemURI(1 + m.rng.IntN(m.n))
	text := fmt.Sprintf("outside change %d of %s", m.seq, uri)
	m.seq++
	k := key{uri, ledger.Digest([]byte(text))}
	at := time.Now()
	return k, at, m.set(ctx, uri, text)
}

// warmUp changes one resource and waits for its line: the watch is up and listening.
func (m *mutator) warmUp(ctx context.Context) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		k, _, err := m.change(ctx)
		if err != nil {
			return err
		}
		for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait); {
			_, ok, err := m.watch.at(k)
			if err != nil {
				return err
			}
			if ok {
				return nil
			}
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return err
			}
		}
	}
	return errors.New("no change was seen by mcpsync watch within a minute")
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// change made in a phase, and when.
type made struct {
	k  key
	at time.Time
}

// phase changes random resources at rate for d, waits at most drain for the last change of
// every resource, and summarises.
func (m *mutator) phase(ctx context.Context, rate float64, d, drain time.Duration, devPID, workerPID int) (result, error) {
	var changes []made
	latest := map[string]key{}
	interval := time.Duration(float64(time.Second) / rate)
	cpu0, mach0 := cpustat.All(), machine()
	start := time.Now()
	next := start
	for time.Since(start) < d {
		k, at, err := m.change(ctx)
		if err != nil {
			return result{}, err
		}
		changes = append(changes, made{k, at})
		latest[k.uri] = k
		next = next.Add(interval)
		if err := sleep(ctx, time.Until(next)); err != nil {
			return result{}, err
		}
	}
	offeredFor := time.Since(start)
	for end := time.Now().Add(drain); ; {
		all := true
		for _, k := range latest {
			_, ok, err := m.watch.at(k)
			if err != nil {
				return result{}, err
			}
			all = all && ok
		}
		if all || time.Now().After(end) {
			break
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return result{}, err
		}
	}
	cpu1, mach1 := cpustat.All(), machine()
	seen := map[key]seenVersion{}
	for _, c := range changes {
		if v, ok, _ := m.watch.at(c.k); ok {
			seen[c.k] = v
		}
	}
	r := summarize(rate, changes, latest, seen, offeredFor)
	r.elapsed = time.Since(start)
	r.wall = mach1.Total - mach0.Total
	r.machineBusy = mach1.Busy - mach0.Busy
	r.devCPU = cpustat.TreeTime(cpu1, devPID) - cpustat.TreeTime(cpu0, devPID)
	r.workerCPU = cpustat.TreeTime(cpu1, workerPID) - cpustat.TreeTime(cpu0, workerPID)
	return r, nil
}

func machine() cpustat.MachineTime {
	t, _ := cpustat.Machine()
	return t
}
