package scaleout_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

// The test binary, re-executed with these variables set, runs one session host instead of
// the tests.
const (
	envQueue = "MCPSYNC_SCALEOUT_HOST_QUEUE"
	envDB    = "MCPSYNC_SCALEOUT_DATABASE_URL"
	envLease = "MCPSYNC_SCALEOUT_LEASE"
)

func TestMain(m *testing.M) {
	if q := os.Getenv(envQueue); q != "" {
		os.Exit(hostMain(q, os.Getenv(envDB), os.Getenv(envLease)))
	}
	pgtest.Main(m)
}

// nopSignaler drops every signal: no workflows run in this test.
type nopSignaler struct{}

func (nopSignaler) SignalWorkflow(context.Context, string, string, string, any) error { return nil }

// hostMain runs a session host until SIGTERM or SIGINT, like a worker's.
func hostMain(queue, dbURL, lease string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	d, err := time.ParseDuration(lease)
	if err != nil {
		fmt.Fprintln(os.Stderr, "lease:", err)
		return 2
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "database:", err)
		return 1
	}
	defer pool.Close()
	cfg := zap.NewDevelopmentConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.DisableStacktrace = true
	log, err := cfg.Build()
	if err != nil {
		return 1
	}
	h := mcphost.New(mcphost.Options{
		Store: ledger.New(pool), Signaler: nopSignaler{}, Queue: queue, Logger: log.Named(queue),
		Lease: d, ClaimInterval: 300 * time.Millisecond, KeepAlive: 500 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second,
	})
	if err := h.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "host:", err)
		return 1
	}
	return 0
}

// syncBuffer collects a child's stderr.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startHost starts a host process; it is stopped (SIGTERM, then SIGKILL) when the test ends.
func startHost(t *testing.T, queue, dbURL string, lease time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envQueue+"="+queue, envDB+"="+dbURL, envLease+"="+lease.String())
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("host %s (pid %d) stderr:\n%s", queue, cmd.Process.Pid, stderr.String())
		}
	})
	return cmd
}

// view is what the ledger and the server say at one moment.
type view struct {
	byHost   map[string]int   // live current sessions per host queue
	hostOf   map[int64]string // host of each source's live current session
	liveOnce bool             // every source has exactly one live session on the server
}

func (v view) String() string {
	hosts := make([]string, 0, len(v.byHost))
	for h, n := range v.byHost {
		hosts = append(hosts, fmt.Sprintf("%s=%d", h, n))
	}
	sort.Strings(hosts)
	return fmt.Sprintf("sessions per host %s, %d sources live, one server session each: %v",
		strings.Join(hosts, " "), len(v.hostOf), v.liveOnce)
}

// Issue 12 defect 6, end to end: three host processes, 30 HTTP sources served by one
// fault-injecting server, one listener per source. The sources spread about 10 per host; a
// host killed with SIGKILL loses its sources to the other two within the lease and a few
// seconds; a host that joins gets its share back; and the server never sees two live
// sessions of one source.
func TestScaleOutSpreadsAndFailsOver(t *testing.T) {
	const (
		nSources = 30
		lease    = 3 * time.Second
		// idle is how long the server keeps a session that sends nothing (the hosts ping every
		// 500 ms): the session of a killed host stops counting as live after it, well within
		// the lease.
		idle = 1500 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dbURL := pgtest.NewDB(t)
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store := ledger.New(pool)

	srv := chaosmcp.New(chaosmcp.Options{Name: "scaleout"})
	t.Cleanup(func() { srv.Close() })
	srv.Set("demo://notes/1", "v1", "text/plain")
	listenerOf := map[int64]string{}
	for i := range nSources {
		hs, err := srv.StartHTTP("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hs.Close() })
		src, _, err := store.AddSource(ctx, ledger.SourceSpec{Name: fmt.Sprintf("src-%02d", i), Transport: ledger.TransportHTTP, URL: hs.URL})
		if err != nil {
			t.Fatal(err)
		}
		listenerOf[src.ID] = hs.ListenerID()
	}
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		for ctx.Err() == nil {
			srv.CloseIdleSessions(idle)
			time.Sleep(100 * time.Millisecond)
		}
	}()
	t.Cleanup(func() { cancel(); <-reaped })

	look := func() view {
		t.Helper()
		rows, err := pool.Query(ctx, `SELECT so.id, se.host_queue FROM sources so
			JOIN sessions se ON se.source_id = so.id AND se.generation = so.current_generation
			WHERE se.ended_at IS NULL`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		v := view{byHost: map[string]int{}, hostOf: map[int64]string{}, liveOnce: true}
		for rows.Next() {
			var id int64
			var host string
			if err := rows.Scan(&id, &host); err != nil {
				t.Fatal(err)
			}
			v.byHost[host]++
			v.hostOf[id] = host
		}
		st := srv.Stats()
		for _, l := range listenerOf {
			if st.LiveByListener[l] != 1 {
				v.liveOnce = false
			}
		}
		return v
	}
	wait := func(timeout time.Duration, what string, ok func(view) bool) (view, time.Duration) {
		t.Helper()
		start := time.Now()
		for {
			v := look()
			if ok(v) {
				return v, time.Since(start)
			}
			if time.Since(start) > timeout {
				t.Fatalf("%s: not reached within %s: %s", what, timeout, v)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	within := func(v view, hosts []string, lo, hi int) bool {
		n := 0
		for _, h := range hosts {
			if v.byHost[h] < lo || v.byHost[h] > hi {
				return false
			}
			n += v.byHost[h]
		}
		return n == nSources && len(v.hostOf) == nSources && v.liveOnce
	}

	hosts := []string{"w0", "w1", "w2"}
	procs := map[string]*exec.Cmd{}
	for _, h := range hosts {
		procs[h] = startHost(t, h, dbURL, lease)
	}
	v, took := wait(45*time.Second, "30 sources spread over 3 hosts, 10±2 each",
		func(v view) bool { return within(v, hosts, 8, 12) })
	t.Logf("spread after %s: %s", took.Round(time.Millisecond), v)

	victim := "w0"
	var lost []int64
	for id, h := range v.hostOf {
		if h == victim {
			lost = append(lost, id)
		}
	}
	slices.Sort(lost)
	killedAt := time.Now()
	if err := procs[victim].Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	survivors := []string{"w1", "w2"}
	v, _ = wait(lease+10*time.Second, "the killed host's sources live on the others", func(v view) bool {
		for _, id := range lost {
			if h, ok := v.hostOf[id]; !ok || h == victim {
				return false
			}
		}
		return v.byHost[victim] == 0 && len(v.hostOf) == nSources && v.liveOnce
	})
	moved := time.Since(killedAt)
	t.Logf("%d sources of the killed host moved %s after SIGKILL (lease %s): %s",
		len(lost), moved.Round(time.Millisecond), lease, v)
	if moved > lease+4*time.Second {
		t.Errorf("the killed host's sources moved after %s, want within the lease %s and a few seconds", moved, lease)
	}
	v, took = wait(20*time.Second, "30 sources spread over 2 hosts, 15±2 each",
		func(v view) bool { return within(v, survivors, 13, 17) })
	t.Logf("spread over the survivors after %s more: %s", took.Round(time.Millisecond), v)

	// A new host joins: the others hand sources over (each closes its session before it
	// releases the lease) until it holds its share.
	joined := []string{"w1", "w2", "w3"}
	procs["w3"] = startHost(t, "w3", dbURL, lease)
	v, took = wait(30*time.Second, "30 sources spread again over 3 hosts, 10±2 each",
		func(v view) bool { return within(v, joined, 8, 12) })
	t.Logf("a new host got its share after %s: %s", took.Round(time.Millisecond), v)

	st := srv.Stats()
	for id, l := range listenerOf {
		if st.MaxLiveByListener[l] != 1 {
			t.Errorf("source %d: the server saw %d live sessions at once, want 1", id, st.MaxLiveByListener[l])
		}
	}
	t.Logf("server: %d sessions started, at most one live per source", st.SessionsStarted)
}
