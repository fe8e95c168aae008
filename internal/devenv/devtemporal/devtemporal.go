// Package devtemporal runs a complete Temporal service inside the current process for local
// development: the four server roles (frontend, history, matching, worker) persisted in one
// SQLite file, the namespace the project uses with its search attributes, and the Temporal Web
// UI. Restarting over the same data directory keeps every workflow.
package devtemporal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	uiserver "github.com/temporalio/ui-server/v2/server"
	uiconfig "github.com/temporalio/ui-server/v2/server/config"
	uioptions "github.com/temporalio/ui-server/v2/server/server_options"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/cluster"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/dynamicconfig"
	tlog "go.temporal.io/server/common/log"
	"go.temporal.io/server/common/membership/static"
	sqliteplugin "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite"
	"go.temporal.io/server/common/primitives"
	sqliteschema "go.temporal.io/server/schema/sqlite"
	"go.temporal.io/server/temporal"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
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
	return map[string]enumspb.IndexedValueType{
		"McpsyncSource":    enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"McpsyncURI":       enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"McpsyncState":     enumspb.INDEXED_VALUE_TYPE_KEYWORD,
		"McpsyncPrincipal": enumspb.INDEXED_VALUE_TYPE_KEYWORD,
	}
}

// ErrDataDirInUse reports that another process runs a server on the same data directory.
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
	// DataDir holds the SQLite file (created with its schema when missing) and a lock file.
	// Required.
	DataDir string
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
}

// Server is a running in-process Temporal service and Web UI, started by Start.
type Server struct {
	log       *zap.Logger
	host      string
	frontend  int
	uiPort    int
	namespace string
	dbFile    string
	lock      *os.File
	quiet     *atomic.Bool // set while stopping: shutdown noise is not logged
	temporal  temporal.Server
	ui        *uiserver.Server
	uiDone    chan error

	stopOnce sync.Once
	stopErr  error
}

// Start starts the Temporal services and the Web UI in this process and returns once the
// frontend answers, the namespace exists with the search attributes registered, and the UI
// serves HTTP. The SQLite schema is created only when the database file is new, so a restart
// over the same DataDir keeps all workflows. It fails with a *PortInUseError when the frontend
// or UI port is taken, and with ErrDataDirInUse when another process serves DataDir. On error
// nothing is left running.
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
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 60 * time.Second
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
		dbFile:    filepath.Join(dataDir, DatabaseFileName),
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
	sqlCfg, err := s.prepareDatabase(opts)
	if err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	serverOpts, err := s.serverOptions(opts, sqlCfg)
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
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := s.awaitFrontend(ctx, opts.SearchAttributes); err != nil {
		return nil, fmt.Errorf("devtemporal: %w", err)
	}
	if !opts.DisableUI {
		if err := s.startUI(ctx); err != nil {
			return nil, fmt.Errorf("devtemporal: %w", err)
		}
	}
	s.log.Info("Temporal ready", zap.String("frontend", s.FrontendAddress()), zap.String("ui", s.UIURL()), zap.String("db", s.dbFile))
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

// portFor returns port after checking it can be bound, or a free port when port is 0.
func portFor(service, host string, port int) (int, error) {
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

// prepareDatabase creates the SQLite schema when the file is new and the namespace when it is
// missing.
func (s *Server) prepareDatabase(opts Options) (*config.SQL, error) {
	sqlCfg := &config.SQL{
		PluginName:   sqliteplugin.PluginName,
		DatabaseName: s.dbFile,
		// File mode with SQLite's default rollback journal. (journal_mode=wal measured 4-15x
		// slower per workflow here, with the plugin's single connection per store.)
		ConnectAttributes: map[string]string{"mode": "rwc"},
	}
	if _, err := os.Stat(s.dbFile); errors.Is(err, os.ErrNotExist) {
		if err := sqliteschema.SetupSchema(sqlCfg); err != nil {
			_ = os.Remove(s.dbFile) // a half-made file must not be mistaken for a good one
			return nil, fmt.Errorf("create SQLite schema in %s: %w", s.dbFile, err)
		}
		s.log.Info("created Temporal database", zap.String("db", s.dbFile))
	} else if err != nil {
		return nil, fmt.Errorf("stat %s: %w", s.dbFile, err)
	}
	ns, err := sqliteschema.NewNamespaceConfig(clusterName, opts.Namespace, false, opts.SearchAttributes)
	if err != nil {
		return nil, fmt.Errorf("namespace %s: %w", opts.Namespace, err)
	}
	if err := sqliteschema.CreateNamespaces(sqlCfg, ns); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", opts.Namespace, err)
	}
	return sqlCfg, nil
}

func (s *Server) serverOptions(opts Options, sqlCfg *config.SQL) ([]temporal.ServerOption, error) {
	frontendAddr := s.FrontendAddress()
	httpPort, err := portFor("frontend HTTP", s.host, 0)
	if err != nil {
		return nil, err
	}
	hosts := map[primitives.ServiceName]static.Hosts{
		primitives.FrontendService: static.SingleLocalHost(frontendAddr),
	}
	services := map[string]config.Service{
		string(primitives.FrontendService): {RPC: config.RPC{GRPCPort: s.frontend, HTTPPort: httpPort, BindOnIP: s.host}},
	}
	for _, svc := range []primitives.ServiceName{primitives.HistoryService, primitives.MatchingService, primitives.WorkerService} {
		port, err := portFor(string(svc), s.host, 0)
		if err != nil {
			return nil, err
		}
		hosts[svc] = static.SingleLocalHost(net.JoinHostPort(s.host, strconv.Itoa(port)))
		services[string(svc)] = config.Service{RPC: config.RPC{GRPCPort: port, BindOnIP: s.host}}
	}

	cfg := &config.Config{}
	cfg.Global.Membership.MaxJoinDuration = 30 * time.Second
	cfg.Global.Membership.BroadcastAddress = s.host
	cfg.Persistence = config.Persistence{
		DefaultStore:     sqliteplugin.PluginName,
		VisibilityStore:  sqliteplugin.PluginName,
		NumHistoryShards: 1,
		DataStores:       map[string]config.DataStore{sqliteplugin.PluginName: {SQL: sqlCfg}},
	}
	cfg.ClusterMetadata = &cluster.Config{
		EnableGlobalNamespace:    false,
		FailoverVersionIncrement: 10,
		MasterClusterName:        clusterName,
		CurrentClusterName:       clusterName,
		ClusterInformation: map[string]cluster.ClusterInformation{
			clusterName: {
				Enabled:                true,
				InitialFailoverVersion: 1,
				RPCAddress:             frontendAddr,
				HTTPAddress:            net.JoinHostPort(s.host, strconv.Itoa(httpPort)),
				// Used only when the database is new; afterwards the stored ID wins, so the
				// ID is stable per data directory.
				ClusterID: primitives.NewUUID().String(),
			},
		},
	}
	cfg.DCRedirectionPolicy.Policy = "noop"
	cfg.Services = services
	cfg.Archival.History.State = "disabled"
	cfg.Archival.Visibility.State = "disabled"
	cfg.NamespaceDefaults.Archival.History.State = "disabled"
	cfg.NamespaceDefaults.Archival.Visibility.State = "disabled"
	cfg.PublicClient.HostPort = frontendAddr

	logger := tlog.NewZapLogger(s.log.Named("temporal").WithOptions(gate(opts.ServerLogLevel, s.quiet)))
	authorizer, err := authorization.GetAuthorizerFromConfig(&cfg.Global.Authorization)
	if err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	claimMapper, err := authorization.GetClaimMapperFromConfig(&cfg.Global.Authorization, logger)
	if err != nil {
		return nil, fmt.Errorf("claim mapper: %w", err)
	}
	dyn := dynamicconfig.StaticClient{
		// The default (20) puts a ~50 ms floor under every workflow task.
		dynamicconfig.TransferProcessorMaxPollRPS.Key(): 1000,
		// One partition per task queue: a single-host server gains nothing from more, and
		// forwarding between partitions costs CPU on every task.
		dynamicconfig.MatchingNumTaskqueueReadPartitions.Key():  1,
		dynamicconfig.MatchingNumTaskqueueWritePartitions.Key(): 1,
		// Search attributes added at run time are visible at once.
		dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key(): true,
		// The Web UI lists and counts workflows often.
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,
	}
	for k, v := range opts.DynamicConfig {
		dyn[dynamicconfig.MakeKey(k)] = v
	}
	return []temporal.ServerOption{
		temporal.WithConfig(cfg),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(hosts),
		temporal.WithLogger(logger),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(dyn),
	}, nil
}

// awaitFrontend waits until the frontend answers and knows the namespace, then registers any
// search attribute the namespace lacks (a namespace created by an older version keeps its
// record, and CreateNamespaces never changes an existing one).
func (s *Server) awaitFrontend(ctx context.Context, want map[string]enumspb.IndexedValueType) error {
	c, err := s.dial(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := retry(ctx, func() error {
		_, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.namespace})
		return err
	}); err != nil {
		return fmt.Errorf("namespace %s never became visible: %w", s.namespace, err)
	}
	have, err := c.OperatorService().ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: s.namespace})
	if err != nil {
		return fmt.Errorf("list search attributes: %w", err)
	}
	missing := map[string]enumspb.IndexedValueType{}
	for name, typ := range want {
		if got, ok := have.GetCustomAttributes()[name]; !ok {
			missing[name] = typ
		} else if got != typ {
			return fmt.Errorf("search attribute %s is registered as %s, want %s", name, got, typ)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if _, err := c.OperatorService().AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{
		Namespace: s.namespace, SearchAttributes: missing,
	}); err != nil {
		return fmt.Errorf("add search attributes: %w", err)
	}
	s.log.Info("registered search attributes", zap.Int("count", len(missing)))
	return nil
}

// dial connects an SDK client to the frontend, retrying until it answers or ctx ends.
func (s *Server) dial(ctx context.Context) (client.Client, error) {
	var c client.Client
	err := retry(ctx, func() error {
		var err error
		c, err = client.DialContext(ctx, client.Options{
			HostPort:  s.FrontendAddress(),
			Namespace: s.namespace,
			Logger:    SDKLogger(s.log.Named("temporal-client").WithOptions(gate(zapcore.WarnLevel, s.quiet))),
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("frontend %s never answered: %w", s.FrontendAddress(), err)
	}
	return c, nil
}

// retry calls f with a growing pause until it succeeds or ctx ends; then it returns f's last
// error.
func retry(ctx context.Context, f func() error) error {
	delay := 20 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

func (s *Server) startUI(ctx context.Context) error {
	origins := []string{
		"http://" + net.JoinHostPort(s.host, strconv.Itoa(s.uiPort)),
		"http://" + net.JoinHostPort("localhost", strconv.Itoa(s.uiPort)),
	}
	s.ui = uiserver.NewServer(uioptions.WithConfigProvider(&uiconfig.Config{
		Host:                s.host,
		Port:                s.uiPort,
		TemporalGRPCAddress: s.FrontendAddress(),
		EnableUI:            true,
		DefaultNamespace:    s.namespace,
		CORS:                uiconfig.CORS{AllowOrigins: origins, CookieInsecure: true},
		HideLogs:            true,
		DisableNewsFetch:    true,
	}))
	go func() { s.uiDone <- s.ui.Start() }()
	health := s.UIURL() + "/healthz"
	hc := &http.Client{Timeout: 2 * time.Second}
	err := retry(ctx, func() error {
		select {
		case err := <-s.uiDone:
			s.uiDone <- err // keep it for shutdown
			return fmt.Errorf("UI server exited: %v", err)
		default:
		}
		resp, err := hc.Get(health)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", health, resp.Status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("Web UI on %s never answered: %w", s.UIURL(), err)
	}
	return nil
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

// Namespace is the namespace Start created.
func (s *Server) Namespace() string { return s.namespace }

// DatabaseFile is the SQLite file holding all Temporal state.
func (s *Server) DatabaseFile() string { return s.dbFile }

// gate filters a logger's entries by level, and drops all but the most severe while quiet is
// set. Unlike zap.IncreaseLevel it never complains when level is below the logger's own.
func gate(level zapcore.LevelEnabler, quiet *atomic.Bool) zap.Option {
	return zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return gatedCore{Core: c, level: level, quiet: quiet}
	})
}

type gatedCore struct {
	zapcore.Core
	level zapcore.LevelEnabler
	quiet *atomic.Bool
}

func (c gatedCore) allowed(l zapcore.Level) bool {
	if c.quiet.Load() {
		return l >= zapcore.DPanicLevel
	}
	return c.level.Enabled(l)
}

func (c gatedCore) Enabled(l zapcore.Level) bool { return c.allowed(l) && c.Core.Enabled(l) }

func (c gatedCore) With(fields []zapcore.Field) zapcore.Core {
	return gatedCore{Core: c.Core.With(fields), level: c.level, quiet: c.quiet}
}

func (c gatedCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if !c.allowed(e.Level) {
		return ce
	}
	return c.Core.Check(e, ce)
}

// SDKLogger adapts a zap logger to the Temporal SDK's logger interface.
func SDKLogger(l *zap.Logger) sdklog.Logger {
	return sdklog.NewStructuredLogger(slog.New(zapslog.NewHandler(l.Core())))
}
