package mcphost

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// DefaultTransport starts a stdio source as a child process (stderr passed through; on Linux
// killed with its parent) or connects a streamable HTTP source with a single reconnect retry of its
// event stream, so that a dead or restarted HTTP server ends the session within seconds (the
// go-sdk default of five retries takes ~17 s); keep-alive pings catch a peer that hangs.
func DefaultTransport(_ context.Context, src ledger.Source) (mcp.Transport, error) {
	switch src.Transport {
	case ledger.TransportStdio:
		if len(src.Command) == 0 {
			return nil, fmt.Errorf("source %q has no command", src.Name)
		}
		cmd := exec.Command(src.Command[0], src.Command[1:]...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = childProcAttr()
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
	case ledger.TransportHTTP:
		return &mcp.StreamableClientTransport{Endpoint: src.URL, MaxRetries: 1}, nil
	default:
		return nil, fmt.Errorf("source %q: unknown transport %q", src.Name, src.Transport)
	}
}
