// Package e2e_test runs mcpsync end to end: a real in-process Temporal server
// (temporaltest), a real Postgres ledger, real workers with their session hosts, the CLI, and
// real MCP servers (the fault-injecting server, the demo server over stdio, and a third-party
// server). Keeping them in one package links the Temporal server once.
package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	workflowpb "go.temporal.io/api/workflow/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/temporaltest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

func TestMain(m *testing.M) {
	code := pgtest.Run(m)
	if binDir != "" {
		os.RemoveAll(binDir) // the commands binary built
	}
	os.Exit(code)
}

// stack is one isolated mcpsync deployment for a test.
type stack struct {
	t     *testing.T
	ctx   context.Context
	ts    *temporaltest.TestServer
	tc    client.Client
	dbURL string
	st    *ledger.Store
	log   *zap.Logger

	mu      sync.Mutex
	workers []*workerapp.Worker

	// skipRecording, when set, names the closed executions replayHistories replays but does not
	// record (a run a scenario only needs to have ended).
	skipRecording func(*workflowpb.WorkflowExecutionInfo) bool
}

// stackConfig is what stack options tune.
type stackConfig struct {
	dc       dynamicconfig.StaticClient
	dbURL    string // a migrated database to use instead of a fresh pgtest one
	noWorker bool   // start no in-process worker
}

// stackOption tunes a stack.
type stackOption func(*stackConfig)

// withDatabase makes the stack use an existing, migrated ledger database.
func withDatabase(url string) stackOption { return func(c *stackConfig) { c.dbURL = url } }

// withoutWorker starts the stack with no in-process worker (the test runs its own).
func withoutWorker() stackOption { return func(c *stackConfig) { c.noWorker = true } }

// suggestContinueAsNewAt makes the server suggest continue-as-new once a run's history has n
// events. The suggestion is recorded in history, so replays stay deterministic.
func suggestContinueAsNewAt(n int) stackOption {
	return func(c *stackConfig) {
		c.dc[dynamicconfig.HistoryCountSuggestContinueAsNew.Key()] = []dynamicconfig.ConstrainedValue{{Value: n}}
	}
}

func newStack(t *testing.T, opts ...stackOption) *stack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := stackConfig{dc: localstack.DynamicConfig()}
	for _, o := range opts {
		o(&cfg)
	}
	ts := temporaltest.NewServer(temporaltest.WithT(t), temporaltest.WithBaseServerOptions(temporal.WithDynamicConfigClient(cfg.dc)))
	s := &stack{t: t, ctx: ctx, ts: ts, log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
	s.tc = ts.NewClientWithOptions(client.Options{Namespace: ts.GetDefaultNamespace()})
	t.Cleanup(s.tc.Close)
	s.dbURL = cfg.dbURL
	if s.dbURL == "" {
		s.dbURL = pgtest.NewDB(t)
	}
	pool, err := pgxpool.New(ctx, s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s.st = ledger.New(pool)
	if !cfg.noWorker {
		s.startWorker("host-1")
	}
	t.Cleanup(s.stopWorkers)
	return s
}

// stackKeepAlive is the session hosts' ping interval in these stacks: the default's 2 s, whose
// pings each wait 1 s. No test here relies on the keep-alive to notice a server (dead servers
// end their sessions through their pipe or event stream), and with 500 ms (250 ms per ping) a
// loaded CI machine missed two pings in a row and ended a healthy session in the middle of a
// fault test (TestEraFaultPartialAck: the change then came on the new session's notification,
// not on the poll the test waits for).
const stackKeepAlive = 2 * time.Second

// startWorker starts one more mcpsync worker (Temporal worker + session host) on the stack;
// tune adjusts its session host's options.
func (s *stack) startWorker(queue string, tune ...func(*mcphost.Options)) *workerapp.Worker {
	s.t.Helper()
	h := mcphost.Options{ClaimInterval: 200 * time.Millisecond, Lease: 3 * time.Second,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, KeepAlive: stackKeepAlive}
	for _, f := range tune {
		f(&h)
	}
	w, err := workerapp.Start(s.ctx, workerapp.Config{
		DatabaseURL: s.dbURL, Namespace: s.ts.GetDefaultNamespace(), Logger: s.log,
		Client:    s.tc,
		HostQueue: queue + "-" + strings.ReplaceAll(s.t.Name(), "/", "-"),
		Host:      h,
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	return w
}

// checkInvariants fails the test unless the ledger satisfies every R24 invariant.
func (s *stack) checkInvariants() invariants.Report {
	s.t.Helper()
	rep, err := invariants.Check(s.ctx, s.st.Pool())
	if err != nil {
		s.t.Fatal(err)
	}
	if rep.Violations() != 0 {
		s.t.Errorf("R24 invariants violated: %s", rep)
	}
	return rep
}

func (s *stack) stopWorkers() {
	s.mu.Lock()
	ws := s.workers
	s.workers = nil
	s.mu.Unlock()
	for _, w := range ws {
		w.Stop()
	}
}

// cli runs an mcpsync command against the stack.
func (s *stack) cli(args ...string) (stdout, stderr string, code cli.ExitCode) {
	var out, errb bytes.Buffer
	code = cli.Run(s.ctx, cli.Env{Stdout: &out, Stderr: &errb, Store: s.st, Temporal: s.tc,
		Config: config.Env{Namespace: s.ts.GetDefaultNamespace(), DatabaseURL: s.dbURL}}, args)
	return out.String(), errb.String(), code
}

// mustCLI runs a command and fails the test unless it exits 0.
func (s *stack) mustCLI(args ...string) string {
	s.t.Helper()
	out, errOut, code := s.cli(args...)
	if code != 0 {
		s.t.Fatalf("mcpsync %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// eventually polls cond until it holds or the timeout passes; the message of the last
// attempt explains a failure.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ok, msg := cond()
		if ok {
			return
		}
		last = msg
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not reached within %s: %s", what, timeout, last)
}

func (s *stack) sub(source, uri string) ledger.Subscription {
	s.t.Helper()
	sub, err := s.st.SubscriptionByKey(s.ctx, "default", source, uri)
	if err != nil {
		s.t.Fatal(err)
	}
	return sub
}

// waitDigest waits until the subscription's newest accepted version has digest.
func (s *stack) waitDigest(source, uri, digest string) ledger.Subscription {
	s.t.Helper()
	var sub ledger.Subscription
	eventually(s.t, 30*time.Second, "accepted digest of "+uri, func() (bool, string) {
		var err error
		sub, err = s.st.SubscriptionByKey(s.ctx, "default", source, uri)
		if err != nil {
			return false, err.Error()
		}
		return sub.LastAcceptedDigest == digest, fmt.Sprintf("state %s digest %s (want %s) reason %q", sub.State, sub.LastAcceptedDigest, digest, sub.StateReason)
	})
	return sub
}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binary builds the project's commands once per test binary and returns the path of name.
func binary(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "mcpsync-e2e-bin")
		if buildErr != nil {
			return
		}
		root, err := filepath.Abs("../../..")
		if err != nil {
			buildErr = err
			return
		}
		for bin, pkg := range map[string]string{"mcpsync-demo-server": "./cmd/mcpsync-demo-server", "mcpsync-worker": "./worker"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, bin), pkg)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, name)
}
