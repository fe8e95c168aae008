package mcphost

import (
	"io"
	"os/exec"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ChildCommand returns the command of a stdio transport DefaultTransport built (nil for any
// other transport).
func ChildCommand(tr mcp.Transport) *exec.Cmd {
	if ct, ok := tr.(*childTransport); ok {
		return ct.cmd
	}
	return nil
}

// BodyBytes returns how many bytes the bounded response bodies of an HTTP transport built by
// DefaultTransport have taken from the network so far.
func BodyBytes(tr mcp.Transport) int64 {
	ht, ok := tr.(*httpSourceTransport)
	if !ok {
		return -1
	}
	return ht.HTTPClient.Transport.(*authTransport).count.n.Load()
}

// NewLineLimitReader is the reader a stdio transport puts over a child's stdout.
func NewLineLimitReader(r io.Reader, limit int64) io.Reader {
	return &lineLimitReader{r: r, limit: limit}
}
