package devtemporal

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"go.temporal.io/server/client"
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
)

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

// serverOptions configures the server with mainCfg as the default store and visCfg as the
// visibility store (the same config for SQLite).
func (s *Server) serverOptions(opts Options, mainCfg, visCfg *config.SQL) ([]temporal.ServerOption, error) {
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
		DefaultStore:     mainCfg.PluginName,
		VisibilityStore:  mainCfg.PluginName,
		NumHistoryShards: s.shards,
		DataStores:       map[string]config.DataStore{mainCfg.PluginName: {SQL: mainCfg}},
	}
	if visCfg != mainCfg {
		cfg.Persistence.VisibilityStore = "visibility"
		cfg.Persistence.DataStores["visibility"] = config.DataStore{SQL: visCfg}
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
	if opts.TLS != nil {
		opts.TLS.apply(cfg, s.host)
	}

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
		// The Web UI lists and counts workflows often.
		dynamicconfig.FrontendMaxNamespaceVisibilityRPSPerInstance.Key(): 100,
		// Persistence operations in flight per history shard (the server's default is 1).
		dynamicconfig.ShardIOConcurrency.Key(): opts.ShardIOConcurrency,
	}
	for k, v := range opts.DynamicConfig {
		dyn[dynamicconfig.MakeKey(k)] = v
	}
	// Search attributes added at run time are visible at once, without reading them from the
	// database on every use (searchAttributeRefresh), unless DynamicConfig sets the key.
	var dc dynamicconfig.Client = dyn
	var interceptors []temporal.ServerOption
	if _, set := dyn[dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key()]; !set {
		refresh := newSearchAttributeRefresh(dyn)
		dc, s.saCache = refresh, refresh
		interceptors = append(interceptors, temporal.WithChainedFrontendGrpcInterceptors(refresh.interceptor))
	}
	return append(interceptors,
		temporal.WithConfig(cfg),
		temporal.ForServices(temporal.DefaultServices),
		temporal.WithStaticHosts(hosts),
		temporal.WithLogger(logger),
		temporal.WithAuthorizer(authorizer),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper { return claimMapper }),
		temporal.WithDynamicConfigClient(dc),
		// One connection from the server to its own frontend, not one per search-attribute
		// call (see sharedLocalClients).
		temporal.WithClientFactoryProvider(sharedLocalClients{inner: client.NewFactoryProvider()}),
	), nil
}
