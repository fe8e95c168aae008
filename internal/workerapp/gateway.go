package workerapp

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/gateway"
)

// startGateway serves the MCP gateway (issue 15) on cfg.GatewayAddr with the worker's ledger
// and Temporal client; an empty address runs none (nil). An address in use is one WARN line
// and the worker runs on without a gateway (a second worker on the machine must not fail for
// it); any other failure is an error.
func startGateway(ctx context.Context, cfg Config, w *Worker) (*gateway.Gateway, error) {
	if cfg.GatewayAddr == "" {
		return nil, nil
	}
	gw, err := gateway.New(gateway.Options{Addr: cfg.GatewayAddr, Store: w.Store, Temporal: w.Client,
		Namespace: cfg.Namespace, Logger: cfg.Logger.Named("gateway")})
	if err != nil {
		return nil, err
	}
	err = gw.Start(ctx)
	switch {
	case errors.Is(err, gateway.ErrAddrInUse):
		cfg.Logger.Warn("gateway not served: address in use; set "+gateway.EnvAddr+" to another address, or to off",
			zap.String("addr", cfg.GatewayAddr))
		return nil, nil
	case err != nil:
		return nil, err
	}
	return gw, nil // Start logged "gateway serving" with the URL (scripts/run.sh prints it)
}

// GatewayURL is the URL of the worker's MCP gateway, "" when it serves none.
func (w *Worker) GatewayURL() string {
	if w.gateway == nil {
		return ""
	}
	return w.gateway.URL()
}
