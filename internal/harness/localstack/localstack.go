// Package localstack runs a whole mcpsync deployment inside one process, for benchmarks and
// the release gate: a real Temporal server (go.temporal.io/server/temporaltest, in-memory
// SQLite, transfer poll rate raised), a fresh Postgres ledger database (on a given server, or
// on a private cluster started for the stack), and real mcpsync workers with their session
// hosts. Stop ends everything it started.
package localstack

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
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
	// many history events.
	SuggestContinueAsNewAt int
}

// Stack is a running in-process deployment.
type Stack struct {
	Temporal  *temporaltest.TestServer
	Client    client.Client
	Namespace string
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
}

// Start brings a stack up with one worker. On error nothing is left running.
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
		s.cluster, err = pgcluster.Start(ctx, pgcluster.Options{DataDir: s.tmpDir + "/pg", NoFsync: true, Logger: s.log.Named("postgres"),
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

	dc := DynamicConfig()
	if opts.SuggestContinueAsNewAt > 0 {
		dc[dynamicconfig.HistoryCountSuggestContinueAsNew.Key()] = []dynamicconfig.ConstrainedValue{{Value: opts.SuggestContinueAsNewAt}}
	}
	s.Temporal = temporaltest.NewServer(temporaltest.WithBaseServerOptions(temporal.WithDynamicConfigClient(dc)))
	s.Namespace = s.Temporal.GetDefaultNamespace()
	s.Client = s.Temporal.NewClientWithOptions(client.Options{Namespace: s.Namespace, Logger: logging.Temporal(s.log.Named("temporal"))})
	if _, err := s.AddWorker(ctx, "host-1"); err != nil {
		return nil, err
	}
	return s, nil
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
	if s.Client != nil {
		s.Client.Close()
	}
	if s.Temporal != nil {
		s.Temporal.Stop()
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
