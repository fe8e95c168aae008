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

// stdioTransport starts a stdio source as a child process (stderr passed through; on Linux
// killed with its parent).
func stdioTransport(_ context.Context, src ledger.Source) (mcp.Transport, error) {
	if len(src.Command) == 0 {
		return nil, fmt.Errorf("source %q has no command", src.Name)
	}
	cmd := exec.Command(src.Command[0], src.Command[1:]...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = childProcAttr()
	return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
}
