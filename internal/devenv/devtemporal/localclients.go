package devtemporal

import (
	"sync"
	"time"

	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/server/api/adminservice/v1"
	"go.temporal.io/server/client"
	"go.temporal.io/server/common"
	"go.temporal.io/server/common/dynamicconfig"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/membership"
	"go.temporal.io/server/common/metrics"
	"go.temporal.io/server/common/testing/testhooks"
	"google.golang.org/grpc"
)

// sharedLocalClients is the server's client factory provider with one change: the clients of
// the server's own frontend are made once per factory and shared, instead of once per call.
//
// The server's default factory dials a new gRPC connection to the local frontend every time
// one of these clients is asked for, and nothing ever closes it. The frontend asks for one on
// every ListSearchAttributes, AddSearchAttributes and RemoveSearchAttributes call with SQL
// visibility (service/frontend/operator_handler.go in v1.32.1), and mcpsync's launch path
// lists the search attributes before every subscription start, so each start left one more
// connection from the server to itself: 5,795 of them at 10,000 subscriptions, until the
// process ran out of file descriptors (issue 16 item 4). The clients hold no per-call state
// (a connection and fixed timeouts), so one per timeout pair serves every caller.
type sharedLocalClients struct {
	inner client.FactoryProvider
}

// NewFactory wraps the default factory.
func (p sharedLocalClients) NewFactory(
	rpcFactory common.RPCFactory,
	monitor membership.Monitor,
	metricsHandler metrics.Handler,
	dc *dynamicconfig.Collection,
	testHooks testhooks.TestHooks,
	numberOfHistoryShards int32,
	logger log.Logger,
	throttledLogger log.Logger,
) client.Factory {
	return &sharedLocalFactory{
		Factory:  p.inner.NewFactory(rpcFactory, monitor, metricsHandler, dc, testHooks, numberOfHistoryShards, logger, throttledLogger),
		frontend: map[[2]time.Duration]localFrontend{},
		admin:    map[[2]time.Duration]adminservice.AdminServiceClient{},
		operator: map[time.Duration]operatorservice.OperatorServiceClient{},
	}
}

// localFrontend is what NewLocalFrontendClientWithTimeout returns.
type localFrontend struct {
	conn   grpc.ClientConnInterface
	client workflowservice.WorkflowServiceClient
}

// sharedLocalFactory memoizes the local frontend, admin and operator clients by their
// arguments; every other method is the wrapped factory's.
type sharedLocalFactory struct {
	client.Factory

	mu       sync.Mutex
	frontend map[[2]time.Duration]localFrontend
	admin    map[[2]time.Duration]adminservice.AdminServiceClient
	operator map[time.Duration]operatorservice.OperatorServiceClient
}

// NewLocalFrontendClientWithTimeout returns the one client (and connection) made for these
// timeouts.
func (f *sharedLocalFactory) NewLocalFrontendClientWithTimeout(timeout, longPollTimeout time.Duration) (grpc.ClientConnInterface, workflowservice.WorkflowServiceClient, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := [2]time.Duration{timeout, longPollTimeout}
	if c, ok := f.frontend[key]; ok {
		return c.conn, c.client, nil
	}
	conn, c, err := f.Factory.NewLocalFrontendClientWithTimeout(timeout, longPollTimeout)
	if err != nil {
		return nil, nil, err
	}
	f.frontend[key] = localFrontend{conn: conn, client: c}
	return conn, c, nil
}

// NewLocalAdminClientWithTimeout returns the one client made for these timeouts.
func (f *sharedLocalFactory) NewLocalAdminClientWithTimeout(timeout, largeTimeout time.Duration) (adminservice.AdminServiceClient, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := [2]time.Duration{timeout, largeTimeout}
	if c, ok := f.admin[key]; ok {
		return c, nil
	}
	c, err := f.Factory.NewLocalAdminClientWithTimeout(timeout, largeTimeout)
	if err != nil {
		return nil, err
	}
	f.admin[key] = c
	return c, nil
}

// NewLocalOperatorClientWithTimeout returns the one client made for this timeout.
func (f *sharedLocalFactory) NewLocalOperatorClientWithTimeout(timeout time.Duration) (operatorservice.OperatorServiceClient, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.operator[timeout]; ok {
		return c, nil
	}
	c, err := f.Factory.NewLocalOperatorClientWithTimeout(timeout)
	if err != nil {
		return nil, err
	}
	f.operator[timeout] = c
	return c, nil
}
