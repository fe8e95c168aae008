package gateway

import (
	"context"
	"errors"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// SEAM (owned by the feed helper; replaced wholesale): subscribe/unsubscribe are the
// ServerOptions.SubscribeHandler/UnsubscribeHandler of every principal's server (both eras:
// the go-sdk calls SubscribeHandler for resources/subscribe and per URI of subscriptions/listen).

func (g *Gateway) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	return errors.New("gateway subscriptions not built yet")
}

func (g *Gateway) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	return errors.New("gateway subscriptions not built yet")
}
