// Package localstack runs a whole mcpsync deployment on one machine, for benchmarks and the
// release gate: a real Temporal server, a fresh Postgres ledger database (on a given server, or
// on a private cluster started for the stack), and real mcpsync workers with their session
// hosts. The Temporal server is, by Options.Temporal, the in-memory test server
// (go.temporal.io/server/temporaltest, transfer poll rate raised), the embedded server exactly
// as `make run` starts it (devtemporal with its persistence and dynamic config, in this
// process as mcpsync-dev runs it in its own), or an external cluster. The first worker runs in
// this process, or as a separate mcpsync-worker process as `make run` runs it
// (Options.WorkerCommand). Stop ends everything it started.
package localstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/temporal"
	"go.temporal.io/server/temporaltest"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/cli"
	"github.com/mcpsync/mcpsync/internal/config"
	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/logging"
	"github.com/mcpsync/mcpsync/internal/mcphost"
	"github.com/mcpsync/mcpsync/internal/redact"
	"github.com/mcpsync/mcpsync/internal/workerapp"
)

// DynamicConfig returns the dynamic config of an in-process test server: search attributes
// visible at once, the transfer queue polled fast (the default adds ~50 ms to every workflow
// task), and one partition per task queue.
func DynamicConfig() dynamicconfig.StaticClient {
	return dynamicconfig.StaticClient{
		dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key(): []dynamicconfig.ConstrainedValue{{Value: true}},
		dynamicconfig.TransferProcessorMaxPollRPS.Key():             []dynamicconfig.ConstrainedValue{{Value: 1000}},
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():      []dynamicconfig.ConstrainedValue{{Value: 1}},
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key():     []dynamicconfig.ConstrainedValue{{Value: 1}},
	}
}

// Options configure a stack.
type Options struct {
	// AdminURL is a Postgres server's admin URL (database "postgres") on which a fresh
	// database is created for the stack; empty starts a private cluster in a temporary
	// directory on a free loopback port.
	AdminURL string
	// Logger receives the stack's logs (default: discard).
	Logger *zap.Logger
	// Host tunes each worker's session host.
	Host mcphost.Options
	// SuggestContinueAsNewAt, if positive, makes the server suggest continue-as-new at that
	// many history events (TemporalTest only).
	SuggestContinueAsNewAt int
	// Temporal chooses the Temporal server (default TemporalTest).
	Temporal TemporalKind
	// Persistence is passed to devtemporal with TemporalEmbedded (empty: devtemporal's
	// default). PersistencePostgres keeps Temporal's state in two fresh databases on the
	// stack's Postgres server (as mcpsync-dev keeps them beside the ledger), dropped by Stop.
	Persistence devtemporal.Persistence
	// TemporalAddress and TemporalNamespace name the cluster with TemporalExternal (namespace
	// default "default"); the connection's TLS and API key come from the TEMPORAL_TLS_* and
	// TEMPORAL_API_KEY variables, as for mcpsync-worker.
	TemporalAddress, TemporalNamespace string
	// WorkerCommand, if set, runs the first worker as this command (e.g. a built
	// bin/mcpsync-worker) in a process of its own, configured through its environment like
	// `make run` does (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, DATABASE_URL; gateway off,
	// metrics on a free port); its log is kept in the stack's temporary directory. Empty: the
	// first worker runs in this process.
	WorkerCommand []string
	// NoFirstWorker starts the stack without any worker (the caller adds its own).
	NoFirstWorker bool
}

// TemporalKind chooses the stack's Temporal server.
type TemporalKind int

const (
	// TemporalTest is go.temporal.io/server/temporaltest: in-memory SQLite, in this process.
	TemporalTest TemporalKind = iota
	// TemporalEmbedded is the embedded server `make run` starts (devtemporal with
	// Options.Persistence, its data directory temporary; the same dynamic config; no Web UI),
	// in this process.
	TemporalEmbedded
	// TemporalExternal is a running cluster at Options.TemporalAddress.
	TemporalExternal
)

// String names the kind as the bench prints it.
func (k TemporalKind) String() string {
	switch k {
	case TemporalTest:
		return "temporaltest (in-memory)"
	case TemporalEmbedded:
		return "embedded (make run default)"
	case TemporalExternal:
		return "external"
	}
	return fmt.Sprintf("TemporalKind(%d)", int(k))
}

// Stack is a running deployment.
type Stack struct {
	// Temporal is the test server with TemporalTest, else nil.
	Temporal *temporaltest.TestServer
	// Dev is the embedded server with TemporalEmbedded, else nil.
	Dev *devtemporal.Server
	// TemporalAddress is the frontend the stack's client and workers use.
	TemporalAddress string
	Client          client.Client
	Namespace       string
	// DatabaseURL is the ledger database; Store is a ledger on it.
	DatabaseURL string
	Store       *ledger.Store

	opts    Options
	log     *zap.Logger
	pool    *pgxpool.Pool
	cluster *pgcluster.Cluster
	tmpDir  string
	adminDB string
	dbName  string

	mu       sync.Mutex
	workers  []*workerapp.Worker
	extraDBs []string
	proc     *exec.Cmd
	procDone chan error
	procLog  string
}

// Start brings a stack up with one worker (none with NoFirstWorker). On error nothing is
// left running.
func Start(ctx context.Context, opts Options) (_ *Stack, err error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Stack{opts: opts, log: opts.Logger}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	admin := opts.AdminURL
	if admin == "" {
		if err := pgcluster.EnsureInstalled(ctx, s.log); err != nil {
			return nil, err
		}
		if s.tmpDir, err = os.MkdirTemp("", "mcpsync-stack-"); err != nil {
			return nil, err
		}
		// fsync stays on unless the stack is the in-memory test one (`make run` keeps it on).
		s.cluster, err = pgcluster.Start(ctx, pgcluster.Options{DataDir: s.tmpDir + "/pg", NoFsync: opts.Temporal == TemporalTest, Logger: s.log.Named("postgres"),
			Settings: map[string]string{"max_connections": "300"}})
		if err != nil {
			return nil, fmt.Errorf("private postgres: %w", err)
		}
		admin = s.cluster.AdminURL()
	}
	if s.DatabaseURL, err = s.createDatabase(ctx, admin); err != nil {
		return nil, err
	}
	if s.pool, err = pgxpool.New(ctx, s.DatabaseURL); err != nil {
		return nil, err
	}
	if _, err := dbschema.Apply(ctx, s.pool); err != nil {
		return nil, err
	}
	s.Store = ledger.New(s.pool)

	if err := s.startTemporal(ctx, admin); err != nil {
		return nil, err
	}
	switch {
	case opts.NoFirstWorker:
	case len(opts.WorkerCommand) > 0:
		if err := s.startWorkerProcess(); err != nil {
			return nil, err
		}
	default:
		if _, err := s.AddWorker(ctx, "host-1"); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// startTemporal starts (or connects to) the server opts.Temporal names and dials s.Client.
func (s *Stack) startTemporal(ctx context.Context, admin string) error {
	tlog := logging.Temporal(s.log.Named("temporal"))
	switch s.opts.Temporal {
	case TemporalTest:
		dc := DynamicConfig()
		if s.opts.SuggestContinueAsNewAt > 0 {
			dc[dynamicconfig.HistoryCountSuggestContinueAsNew.Key()] = []dynamicconfig.ConstrainedValue{{Value: s.opts.SuggestContinueAsNewAt}}
		}
		s.Temporal = temporaltest.NewServer(temporaltest.WithBaseServerOptions(temporal.WithDynamicConfigClient(dc)))
		s.Namespace = s.Temporal.GetDefaultNamespace()
		s.TemporalAddress = s.Temporal.GetFrontendHostPort()
		opts, err := config.TemporalConn{}.ClientOptions(s.TemporalAddress, s.Namespace, client.Options{Logger: tlog})
		if err != nil {
			return err
		}
		s.Client = s.Temporal.NewClientWithOptions(opts)
		return nil
	case TemporalEmbedded:
		if s.tmpDir == "" {
			var err error
			if s.tmpDir, err = os.MkdirTemp("", "mcpsync-stack-"); err != nil {
				return err
			}
		}
		dopts := devtemporal.Options{
			DataDir: filepath.Join(s.tmpDir, "temporal"), DisableUI: true, Logger: s.log,
			Persistence: s.opts.Persistence,
		}
		if s.opts.Persistence == devtemporal.PersistencePostgres {
			main, vis := s.dbName+"_temporal", s.dbName+"_temporal_visibility"
			s.mu.Lock()
			s.extraDBs = append(s.extraDBs, main, vis)
			s.mu.Unlock()
			dopts.Postgres = &devtemporal.Postgres{URL: admin, Database: main, VisibilityDatabase: vis}
		}
		dev, err := devtemporal.Start(ctx, dopts)
		if err != nil {
			return fmt.Errorf("embedded Temporal: %w", err)
		}
		s.Dev = dev
		s.Namespace = dev.Namespace()
		s.TemporalAddress = dev.FrontendAddress()
		s.Client, err = config.TemporalConn{}.Dial(ctx, s.TemporalAddress, s.Namespace, client.Options{Logger: tlog})
		if err != nil {
			return fmt.Errorf("dial embedded Temporal: %w", err)
		}
		return nil
	case TemporalExternal:
		if s.opts.TemporalAddress == "" {
			return errors.New("localstack: TemporalExternal needs Options.TemporalAddress")
		}
		s.TemporalAddress, s.Namespace = s.opts.TemporalAddress, s.opts.TemporalNamespace
		if s.Namespace == "" {
			s.Namespace = devtemporal.DefaultNamespace
		}
		var err error
		s.Client, err = config.FromEnv().Temporal.Dial(ctx, s.TemporalAddress, s.Namespace, client.Options{Logger: tlog})
		if err != nil {
			return fmt.Errorf("dial Temporal %s: %w", s.TemporalAddress, err)
		}
		return nil
	}
	return fmt.Errorf("localstack: unknown Temporal kind %d", int(s.opts.Temporal))
}

// startWorkerProcess runs opts.WorkerCommand as the stack's worker, as `make run` runs
// mcpsync-worker. The process is stopped (SIGTERM, then SIGKILL after 30 s) by Stop and dies
// with this process (--parent-pid).
func (s *Stack) startWorkerProcess() error {
	if s.tmpDir == "" {
		var err error
		if s.tmpDir, err = os.MkdirTemp("", "mcpsync-stack-"); err != nil {
			return err
		}
	}
	s.procLog = filepath.Join(s.tmpDir, "worker.log")
	logf, err := os.Create(s.procLog)
	if err != nil {
		return err
	}
	defer logf.Close() // the child holds its own descriptor
	args := append(append([]string{}, s.opts.WorkerCommand[1:]...), "--log-level", "warn", "--parent-pid", fmt.Sprint(os.Getpid()))
	cmd := exec.Command(s.opts.WorkerCommand[0], args...)
	cmd.Env = append(os.Environ(),
		"TEMPORAL_ADDRESS="+s.TemporalAddress, "TEMPORAL_NAMESPACE="+s.Namespace, "DATABASE_URL="+s.DatabaseURL,
		"MCPSYNC_GATEWAY_ADDR=off", "MCPSYNC_METRICS_ADDR=127.0.0.1:0")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker process %s: %w", s.opts.WorkerCommand[0], err)
	}
	s.proc, s.procDone = cmd, make(chan error, 1)
	go func() { s.procDone <- cmd.Wait() }()
	return nil
}

// WorkerPID is the worker process's PID, 0 when the workers run in this process.
func (s *Stack) WorkerPID() int {
	if s.proc == nil {
		return 0
	}
	return s.proc.Process.Pid
}

// WorkerExited reports, without waiting, whether the worker process has exited, with its log's
// path; false when it runs or there is none.
func (s *Stack) WorkerExited() (bool, string) {
	if s.proc == nil {
		return false, ""
	}
	select {
	case err := <-s.procDone:
		s.procDone <- err
		return true, s.procLog
	default:
		return false, ""
	}
}

func (s *Stack) stopWorkerProcess() {
	if s.proc == nil {
		return
	}
	_ = s.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.procDone:
	case <-time.After(30 * time.Second):
		_ = s.proc.Process.Kill()
		<-s.procDone
	}
	s.proc = nil
}

func (s *Stack) createDatabase(ctx context.Context, admin string) (string, error) {
	u, name, err := createDatabase(ctx, admin)
	if err != nil {
		return "", err
	}
	s.adminDB, s.dbName = admin, name
	return u, nil
}

// createDatabase creates a database with a random name on the server of admin and returns
// its URL and name.
func createDatabase(ctx context.Context, admin string) (string, string, error) {
	u, err := url.Parse(admin)
	if err != nil {
		return "", "", fmt.Errorf("admin URL %q: %w", redact.DSN(admin), redact.Err(err))
	}
	var rnd [5]byte
	_, _ = rand.Read(rnd[:])
	name := "stack_" + hex.EncodeToString(rnd[:])
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", "", fmt.Errorf("connect %s: %w", redact.DSN(admin), redact.Err(err))
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", "", fmt.Errorf("create database: %w", err)
	}
	u.Path = "/" + name
	q := u.Query()
	if q.Get("pool_max_conns") == "" {
		q.Set("pool_max_conns", "32")
	}
	u.RawQuery = q.Encode()
	return u.String(), name, nil
}

// NewDatabase creates one more fresh, migrated database on the stack's Postgres server (for
// measurements that need a ledger of their own) and returns its URL; Stop drops it.
func (s *Stack) NewDatabase(ctx context.Context) (string, error) {
	u, name, err := createDatabase(ctx, s.adminDB)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	s.extraDBs = append(s.extraDBs, name)
	s.mu.Unlock()
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	if _, err := dbschema.Apply(ctx, pool); err != nil {
		return "", err
	}
	return u, nil
}

// AddWorker starts one more worker (Temporal worker + session host) with host queue name.
func (s *Stack) AddWorker(ctx context.Context, name string) (*workerapp.Worker, error) {
	h := s.opts.Host
	if h.ClaimInterval == 0 {
		h.ClaimInterval = 500 * time.Millisecond
	}
	w, err := workerapp.Start(ctx, workerapp.Config{
		DatabaseURL: s.DatabaseURL, Namespace: s.Namespace, Logger: s.log, Client: s.Client,
		HostQueue: name + "-" + s.dbName, Host: h,
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	return w, nil
}

// CLI runs an mcpsync command against the stack and returns its output and exit code.
func (s *Stack) CLI(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = int(cli.Run(ctx, cli.Env{Stdout: &out, Stderr: &errb, Store: s.Store, Temporal: s.Client,
		Config: config.Env{Namespace: s.Namespace, DatabaseURL: s.DatabaseURL}}, args))
	return out.String(), errb.String(), code
}

// MustCLI runs a command and returns an error unless it exits 0.
func (s *Stack) MustCLI(ctx context.Context, args ...string) (string, error) {
	out, errOut, code := s.CLI(ctx, args...)
	if code != 0 {
		return out, fmt.Errorf("mcpsync %v: exit %d: %s", args, code, errOut)
	}
	return out, nil
}

// Stop stops the workers, the Temporal server, drops the ledger database and stops the
// private Postgres cluster, in that order. It is safe to call on a partly started stack.
func (s *Stack) Stop() {
	s.mu.Lock()
	ws := s.workers
	s.workers = nil
	s.mu.Unlock()
	for _, w := range ws {
		w.Stop()
	}
	s.stopWorkerProcess()
	if s.Client != nil {
		s.Client.Close()
	}
	if s.Temporal != nil {
		s.Temporal.Stop()
	}
	if s.Dev != nil {
		_ = s.Dev.Stop()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if s.dbName != "" && s.cluster == nil {
		if conn, err := pgx.Connect(ctx, s.adminDB); err == nil {
			for _, name := range append([]string{s.dbName}, s.extraDBs...) {
				_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			}
			conn.Close(ctx)
		}
	}
	if s.cluster != nil {
		_ = s.cluster.Stop(ctx)
		_ = s.cluster.RemoveData()
	}
	if s.tmpDir != "" {
		os.RemoveAll(s.tmpDir)
	}
}
