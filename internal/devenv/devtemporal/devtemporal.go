// Package devtemporal runs a complete Temporal service inside the current process for local
// development: the four server roles (frontend, history, matching, worker) persisted in one
// SQLite file or in two PostgreSQL databases (Options.Persistence), the namespace the project
// uses with its search attributes, and the Temporal Web UI. Restarting over the same data
// directory (SQLite) or the same databases (PostgreSQL) keeps every workflow.
package devtemporal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	uiserver "github.com/temporalio/ui-server/v2/server"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/server/common/config"
	tlog "go.temporal.io/server/common/log"
	"go.temporal.io/server/temporal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/devenv/ports"
)

// DefaultNamespace is the namespace Start creates when Options.Namespace is empty.
const DefaultNamespace = "default"

// DatabaseFileName is the SQLite file, inside Options.DataDir, that holds all Temporal state.
const DatabaseFileName = "temporal.db"

// clusterName is the name of the single local cluster.
const clusterName = "active"

// SearchAttributes are the custom search attributes the project's workflows set; Start
// registers them on the namespace unless Options.SearchAttributes overrides them.
func SearchAttributes() map[string]enumspb.IndexedValueType {
	attrs := make(map[string]enumspb.IndexedValueType, len(contract.SearchAttributeNames))
	for _, name := range contract.SearchAttributeNames {
		attrs[name] = enumspb.INDEXED_VALUE_TYPE_KEYWORD
	}
	return attrs
}

// ErrDataDirInUse reports that another process runs a server on the same data directory.
//
//lint:ignore ST1005 "Temporal" is a proper noun.
var ErrDataDirInUse = errors.New("Temporal data directory is in use by another process")

// PortInUseError reports that a port Start should listen on is already taken.
type PortInUseError struct {
	// Service is "frontend" or "ui".
	Service string
	Host    string
	Port    int
	Err     error
}

// Error names the service and the address that is taken.
func (e *PortInUseError) Error() string {
	return fmt.Sprintf("%s port %d on %s is already in use: %v", e.Service, e.Port, e.Host, e.Err)
}

// Unwrap returns the listen error.
func (e *PortInUseError) Unwrap() error { return e.Err }

// Options configure Start.
type Options struct {
	// DataDir holds a lock file and, with PersistenceSQLite, the SQLite file (created with its
	// schema when missing). Required.
	DataDir string
	// Persistence chooses where the server keeps its state (default PersistenceSQLite). Both
	// choices are durable: SQLite writes synchronously, PostgreSQL commits synchronously
	// unless its server is configured otherwise.
	Persistence Persistence
	// Postgres configures PersistencePostgres; it is ignored otherwise.
	Postgres *Postgres
	// Host is the address every service listens on (default 127.0.0.1).
	Host string
	// FrontendPort is the gRPC port clients and workers use; 0 picks a free port.
	FrontendPort int
	// UIPort is the Web UI's HTTP port; 0 picks a free port.
	UIPort int
	// DisableUI leaves the Web UI out.
	DisableUI bool
	// Namespace is created at start when missing (default "default").
	Namespace string
	// SearchAttributes are registered on Namespace (default SearchAttributes()).
	SearchAttributes map[string]enumspb.IndexedValueType
	// Logger receives the server's logs (default: discard).
	Logger *zap.Logger
	// ServerLogLevel selects which of the Temporal server's own logs reach Logger, e.g.
	// zapcore.InfoLevel (default zapcore.WarnLevel: the server is chatty).
	ServerLogLevel zapcore.LevelEnabler
	// DynamicConfig adds or overrides dynamic config values, keyed by setting name
	// (e.g. "history.transferProcessorMaxPollRPS").
	DynamicConfig map[string]any
	// StartTimeout bounds the wait for the frontend and the UI to answer (default 60 s).
	StartTimeout time.Duration
	// TLS, if set, makes the frontend serve TLS (nil: plain text).
	TLS *TLS
	// HistoryShards is the number of history shards a new cluster is created with (default
	// DefaultHistoryShards(Persistence)). The count is fixed when the persistence is created:
	// over an existing data directory or database Start uses the stored count, logging one
	// line when it differs from this one.
	HistoryShards int32
	// ShardIOConcurrency is history.shardIOConcurrency, the persistence operations each
	// history shard may have in flight (default DefaultShardIOConcurrency(Persistence)).
	// DynamicConfig overrides it when it sets that key.
	ShardIOConcurrency int
}

// Server is a running in-process Temporal service and Web UI, started by Start.
type Server struct {
	log       *zap.Logger
	host      string
	frontend  int
	uiPort    int
	namespace string
	tls       *TLS
	dbFile    string
	store     string // where the state is, for logs (no secret)
	lock      *os.File
	pgLock    *pgx.Conn    // PersistencePostgres: the session that holds the server lock
	quiet     *atomic.Bool // set while stopping: shutdown noise is not logged
	shards    int32
	temporal  temporal.Server
	ui        *uiserver.Server
	uiDone    chan error
	saCache   *searchAttributeRefresh // nil when Options.DynamicConfig sets the forced refresh

	stopOnce sync.Once
	stopErr  error
}

// Start starts the Temporal services and the Web UI in this process and returns once the
// frontend answers, the namespace exists with the search attributes registered, and the UI
// serves HTTP. The SQLite schema is created only when the database file is new, and the
// PostgreSQL schemas are brought to the server's versions (nothing is applied twice), so a
// restart keeps all workflows. It fails with a *PortInUseError when the frontend or UI port is
// taken, with ErrDataDirInUse when another process serves DataDir, and with ErrDatabaseInUse
// when another server runs on the same PostgreSQL database. On error nothing is left running.
func Start(ctx context.Context, opts Options) (_ *Server, err error) {
	if opts.DataDir == "" {
		return nil, errors.New("devtemporal: Options.DataDir is required")
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if opts.SearchAttributes == nil {
		opts.SearchAttributes = SearchAttributes()
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.ServerLogLevel == nil {
		opts.ServerLogLevel = zapcore.WarnLevel
	}
	if opts.TLS != nil {
		if err := opts.TLS.validate(); err != nil {
			return nil, err
		}
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
	}
	if opts.Persistence == "" {
		opts.Persistence = PersistenceSQLite
	}
	if opts.HistoryShards < 0 || opts.ShardIOConcurrency < 0 {
		return nil, fmt.Errorf("devtemporal: HistoryShards (%d) and ShardIOConcurrency (%d) must not be negative", opts.HistoryShards, opts.ShardIOConcurrency)
	}
	if _, err := ParsePersistence(string(opts.Persistence)); err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	if opts.HistoryShards == 0 {
		opts.HistoryShards = DefaultHistoryShards(opts.Persistence)
	}
	if opts.ShardIOConcurrency == 0 {
		opts.ShardIOConcurrency = DefaultShardIOConcurrency(opts.Persistence)
	}
	dataDir, err := filepath.Abs(opts.DataDir)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: data directory: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("devtemporal: create data directory: %w", err)
	}
	s := &Server{
		log:       opts.Logger,
		host:      opts.Host,
		namespace: opts.Namespace,
		tls:       opts.TLS,
		dbFile:    filepath.Join(dataDir, DatabaseFileName),
		store:     filepath.Join(dataDir, DatabaseFileName),
		uiDone:    make(chan error, 1),
		quiet:     new(atomic.Bool),
	}
	if s.lock, err = lockDir(dataDir); err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	defer func() {
		if err != nil {
			s.shutdown()
		}
	}()

	if s.frontend, err = portFor("frontend", opts.Host, opts.FrontendPort); err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	if !opts.DisableUI {
		if s.uiPort, err = portFor("ui", opts.Host, opts.UIPort); err != nil {
			return nil, fmt.Errorf("devtemporal: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	var mainCfg, visCfg *config.SQL
	if opts.Persistence == PersistencePostgres {
		mainCfg, visCfg, err = s.preparePostgres(ctx, opts)
	} else {
		mainCfg, err = s.prepareDatabase(opts)
		visCfg = mainCfg
	}
	if err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	schemaLog := tlog.NewZapLogger(s.log.Named("temporal-schema").WithOptions(gate(opts.ServerLogLevel, s.quiet)))
	if s.shards, err = s.historyShards(mainCfg, opts.HistoryShards, schemaLog); err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	serverOpts, err := s.serverOptions(opts, mainCfg, visCfg)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	if s.temporal, err = temporal.NewServer(serverOpts...); err != nil {
		return nil, fmt.Errorf("devtemporal: create server: %w", err)
	}
	if err := s.temporal.Start(); err != nil {
		s.temporal = nil // a server that failed to start has nothing to stop
		return nil, fmt.Errorf("devtemporal: start server: %w", err)
	}
	if err := s.awaitFrontend(ctx, opts.SearchAttributes); err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	if !opts.DisableUI {
		if err := s.startUI(ctx); err != nil {
			return nil, fmt.Errorf("devtemporal: %w", err)
		}
	}
	s.log.Info("Temporal ready", zap.String("frontend", s.FrontendAddress()), zap.String("ui", s.UIURL()), zap.String("persistence", string(opts.Persistence)), zap.String("db", s.store),
		zap.Int32("historyShards", s.shards), zap.Int("shardIOConcurrency", opts.ShardIOConcurrency))
	return s, nil
}

// lockDir takes an exclusive, non-blocking lock on dir/temporal.lock; the kernel releases it
// when the process ends.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, "temporal.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrDataDirInUse, dir)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// portFor returns port after checking it can be bound, or a free port when port is 0: one
// outside the kernel's ephemeral range (ports.Free), which no outgoing connection takes
// before the server binds it.
func portFor(service, host string, port int) (int, error) {
	if port == 0 {
		p, err := ports.Free(host)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", service, err)
		}
		return p, nil
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return 0, &PortInUseError{Service: service, Host: host, Port: port, Err: err}
		}
		return 0, fmt.Errorf("%s: cannot listen on %s:%d: %w", service, host, port, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Stop stops the Web UI, then the Temporal services, and releases the data directory. It is
// idempotent; later calls return the first result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.shutdown() })
	return s.stopErr
}

func (s *Server) shutdown() error {
	s.quiet.Store(true)
	var errs []error
	if s.ui != nil {
		s.ui.Stop()
		if err := <-s.uiDone; err != nil {
			errs = append(errs, fmt.Errorf("UI server: %w", err))
		}
		s.ui = nil
	}
	if s.temporal != nil {
		if err := s.temporal.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop Temporal: %w", err))
		}
		s.temporal = nil
	}
	if s.pgLock != nil {
		unlockDatabase(s.pgLock)
		s.pgLock = nil
	}
	if s.lock != nil {
		s.lock.Close() // releases the flock
		s.lock = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("devtemporal: %w", err)
	}
	s.log.Info("Temporal stopped")
	return nil
}

// FrontendAddress is the host:port Temporal clients and workers connect to.
func (s *Server) FrontendAddress() string {
	return net.JoinHostPort(s.host, strconv.Itoa(s.frontend))
}

// UIURL is the Web UI's base URL, or "" when the UI is disabled.
func (s *Server) UIURL() string {
	if s.uiPort == 0 {
		return ""
	}
	return "http://" + net.JoinHostPort(s.host, strconv.Itoa(s.uiPort))
}

// HistoryShards is the number of history shards the server runs with: the count its
// persistence was created with.
func (s *Server) HistoryShards() int32 { return s.shards }

// Namespace is the namespace Start created.
func (s *Server) Namespace() string { return s.namespace }
