package mcphost

import (
	"context"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// DefaultTransport starts a stdio source as a child process (stdioTransport) or connects a
// streamable HTTP source (httpTransport), as the source says.
func DefaultTransport(ctx context.Context, src ledger.Source) (mcp.Transport, error) {
	switch src.Transport {
	case ledger.TransportStdio:
		return stdioTransport(ctx, src)
	case ledger.TransportHTTP:
		return httpTransport(ctx, src)
	default:
		return nil, fmt.Errorf("source %q: unknown transport %q", src.Name, src.Transport)
	}
}
