package mcphost

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// HTTPTransportWithOAuth is the transport DefaultTransport builds for the HTTP source src,
// with handler as its OAuth handler instead of the one oauthHandler would build.
func HTTPTransportWithOAuth(ctx context.Context, src ledger.Source, handler auth.OAuthHandler) (mcp.Transport, error) {
	client, err := httpClient(ctx, src)
	if err != nil {
		return nil, err
	}
	return newHTTPSourceTransport(src, client, handler), nil
}
