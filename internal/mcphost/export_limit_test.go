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

// SSEScanner is the event and line counting of the SSE bound (sseLimitReader.scan), for a
// test to compare with a byte-at-a-time reference.
type SSEScanner struct{ r sseLimitReader }

// NewSSEScanner returns a scanner for events of at most limit bytes.
func NewSSEScanner(limit int64) *SSEScanner { return &SSEScanner{r: sseLimitReader{limit: limit}} }

// Scan counts b; over reports that the event went over the bound at offset i of b.
func (s *SSEScanner) Scan(b []byte) (i int, over bool) { return s.r.scan(b) }

// State returns the bytes of the current event, of the current line (CRs excluded), and
// whether the line has a colon.
func (s *SSEScanner) State() (n int64, lineLen int, colon bool) { return s.r.n, s.r.lineLen, s.r.colon }
