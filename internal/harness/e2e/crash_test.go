package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// workerProcess is mcpsync-worker running as a child process of the test.
type workerProcess struct {
	cmd *exec.Cmd
}

// startWorkerBinary starts mcpsync-worker as a child process of the test, on the stack's Temporal
// server and ledger, with the flags args and its output in logPath. env adjusts the test's
// environment for it: "KEY=value" sets a variable, a bare "KEY" leaves it out. The test's
// cleanup kills it.
func (s *stack) startWorkerBinary(logPath string, args []string, env ...string) *workerProcess {
	s.t.Helper()
	logf, err := os.Create(logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	defer logf.Close() // the child has its own descriptor
	drop := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		drop[k] = true
	}
	var vars []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			vars = append(vars, kv)
		}
	}
	for _, kv := range env {
		if strings.Contains(kv, "=") {
			vars = append(vars, kv)
		}
	}
	cmd := exec.Command(binary(s.t, "mcpsync-worker"), args...)
	cmd.Env = append(vars, "TEMPORAL_ADDRESS="+s.ts.GetFrontendHostPort(),
		"TEMPORAL_NAMESPACE="+s.ts.GetDefaultNamespace(), "DATABASE_URL="+s.dbURL)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = workerProcAttr()
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	w := &workerProcess{cmd: cmd}
	s.t.Cleanup(w.kill)
	return w
}

// kill ends the worker with SIGKILL (no graceful shutdown: its leases and sessions are left
// behind) and reaps it.
func (w *workerProcess) kill() {
	if w.cmd.ProcessState != nil {
		return
	}
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	_ = w.cmd.Wait()
}

// mutator changes random resources of a server until stopped, remembering the last content.
type mutator struct {
	srv     *chaosmcp.Server
	uris    []string
	stop    chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	last    map[string]string
	changes int
}

func startMutator(srv *chaosmcp.Server, uris []string) *mutator {
	m := &mutator{srv: srv, uris: uris, stop: make(chan struct{}), done: make(chan struct{}), last: map[string]string{}}
	go func() {
		defer close(m.done)
		rng := rand.New(rand.NewPCG(3, 5))
		for i := 0; ; i++ {
			select {
			case <-m.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			u := m.uris[rng.IntN(len(m.uris))]
			body := fmt.Sprintf("%s change %d", u, i)
			m.mu.Lock()
			m.last[u] = body
			m.mu.Unlock()
			m.srv.Set(u, body, "text/plain")
			m.mu.Lock()
			m.changes++
			m.mu.Unlock()
		}
	}()
	return m
}

// await waits until the mutator has made n more changes.
func (m *mutator) await(t *testing.T, n int, what string) {
	t.Helper()
	m.mu.Lock()
	target := m.changes + n
	m.mu.Unlock()
	eventually(t, 30*time.Second, what, func() (bool, string) {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.changes >= target, fmt.Sprintf("%d of %d changes", m.changes, target)
	})
}

// halt stops the mutator and returns each resource's final content, checked against what the
// server serves.
func (m *mutator) halt(t *testing.T) map[string]string {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for _, u := range m.uris {
		r, _ := m.srv.Get(u)
		if b, ok := m.last[u]; ok && b != r.Text {
			t.Errorf("%s: last set %q, server serves %q", u, b, r.Text)
		}
		out[u] = r.Text
	}
	return out
}

// converged waits until every resource's accepted digest is its final content's.
func (s *stack) converged(source string, final map[string]string, within time.Duration, what string) {
	s.t.Helper()
	eventually(s.t, within, what, func() (bool, string) {
		missing := 0
		var example string
		for u, body := range final {
			sub, err := s.st.SubscriptionByKey(s.ctx, "default", source, u)
			if err != nil {
				return false, err.Error()
			}
			if sub.LastAcceptedDigest != ledger.Digest([]byte(body)) {
				missing++
				v, qerr := s.queryState(sub.WorkflowID)
				example = fmt.Sprintf("%s %s: %s; issued %d accepted %d session %d; last reads %v; workflow %+v %v",
					u, sub.State, sub.StateReason, sub.LastIssuedOrdinal, sub.LastAcceptedOrdinal, sub.SessionGeneration,
					s.lastDispatches(sub.ID, 4), v, qerr)
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d not converged, e.g. %s", missing, len(final), example)
	})
}

// Crashes while changes stream in: the worker killed with SIGKILL and restarted, PostgreSQL
// restarted, the MCP server restarted. After each, no subscription is lost, no version
// regresses (R24 from the ledger), and every subscription converges on the server's content.
// In both eras, the source pinned; in 2026-07-28 the MCP server's restart also cuts its
// subscriptions/listen streams without their complete result, as a crashed server would.
func TestCrashesWhileStreaming(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			cluster, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: filepath.Join(dir, "pg"), NoFsync: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				// Run as root, the data may live in a private directory outside dir.
				if cluster.Stop(context.Background()) == nil {
					_ = cluster.RemoveData()
				}
			})
			pool, err := pgxpool.New(ctx, cluster.URL())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dbschema.Apply(ctx, pool); err != nil {
				t.Fatal(err)
			}
			pool.Close()
			s := newStack(t, withDatabase(cluster.URL()), withoutWorker())

			const n = 20
			res := map[string]string{}
			var uris []string
			for i := 0; i < n; i++ {
				u := fmt.Sprintf("demo://crash/%02d", i)
				res[u], uris = "v0", append(uris, u)
			}
			srv := newEraServer(t, "crash", res)
			h := serveBothEras(t, srv, "127.0.0.1:0")
			w1 := s.startWorkerBinary(filepath.Join(dir, "worker-1.log"), []string{"--log-level", "warn"})
			s.mustCLI("source", "add", "crash", "--url", h.URL, "--backstop", "10s", "--protocol", era)
			for _, u := range uris {
				s.mustCLI("subscribe", "crash", u, "--wait", "60s")
			}
			s.converged("crash", res, time.Minute, "initial versions")

			// 1. kill -9 the worker mid-stream, keep changing, start a new worker.
			m := startMutator(srv, uris)
			m.await(t, 15, "changes in flight when the worker dies")
			w1.kill()
			m.await(t, 15, "changes while no worker runs")
			s.startWorkerBinary(filepath.Join(dir, "worker-2.log"), []string{"--log-level", "warn"})
			s.converged("crash", m.halt(t), 2*time.Minute, "converged after the worker was killed")
			s.checkInvariants()

			// 2. Restart PostgreSQL mid-stream.
			m = startMutator(srv, uris)
			m.await(t, 15, "changes in flight when PostgreSQL stops")
			port := cluster.Port()
			if err := cluster.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			m.await(t, 30, "changes while PostgreSQL is down")
			cluster, err = pgcluster.Start(ctx, pgcluster.Options{DataDir: filepath.Join(dir, "pg"), Port: port, NoFsync: true})
			if err != nil {
				t.Fatal(err)
			}
			s.converged("crash", m.halt(t), 2*time.Minute, "converged after PostgreSQL restarted")
			s.checkInvariants()

			// 3. Restart the MCP server mid-stream (every session ends; updates in between are lost).
			m = startMutator(srv, uris)
			m.await(t, 15, "changes in flight when the MCP server restarts")
			srv.Restart()
			if era == ledger.ProtocolModern {
				srv.DropListenStreams()
			}
			m.await(t, 30, "changes while the sessions reconnect")
			s.converged("crash", m.halt(t), 2*time.Minute, "converged after the MCP server restarted")

			// No subscription is lost: each is ACTIVE again once it has re-established on the newest
			// session (a session that ends once more right after the restart parks one in
			// RECONCILIATION_REQUIRED until it does).
			eventually(t, 2*time.Minute, "every subscription ACTIVE after the restarts", func() (bool, string) {
				for _, u := range uris {
					if sub := s.sub("crash", u); sub.State != mcpsync.StateActive {
						return false, fmt.Sprintf("%s lost: %s (%s)", u, sub.State, sub.StateReason)
					}
				}
				return true, ""
			})
			s.checkInvariants()
		})
	}
}

// lastDispatches describes a subscription's newest read dispatches.
func (s *stack) lastDispatches(subID int64, n int) []string {
	rows, err := s.st.Pool().Query(s.ctx, `SELECT ordinal, reason, session_generation, coalesce(outcome, '-'), issued_at
		FROM read_dispatches WHERE subscription_id = $1 ORDER BY ordinal DESC LIMIT $2`, subID, n)
	if err != nil {
		return []string{err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var ord, sgen int64
		var reason, outcome string
		var at time.Time
		if err := rows.Scan(&ord, &reason, &sgen, &outcome, &at); err != nil {
			return []string{err.Error()}
		}
		out = append(out, fmt.Sprintf("%d %s s%d %s %s", ord, reason, sgen, outcome, at.Format("15:04:05.000")))
	}
	return out
}
