// Package envmcp is an MCP server that reports the process it runs in, for testing what a
// stdio source's child sees (issue 14 item 4): resource EnvURI is its environment, one
// NAME=VALUE line per variable sorted by name, and resource CwdURI its working directory.
// A test re-executes its own binary with an argument that makes it call ServeStdio.
package envmcp

import (
	"context"
	"errors"
	"os"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Resource URIs the server exposes.
const (
	EnvURI = "env://"
	CwdURI = "cwd://"
)

// NewServer returns the server; every read reports the process's state at that moment.
func NewServer() *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "envmcp", Version: "1.0.0"}, nil)
	add := func(uri string, content func() (string, error)) {
		srv.AddResource(&mcp.Resource{URI: uri, Name: uri, MIMEType: "text/plain"},
			func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
				text, err := content()
				if err != nil {
					return nil, err
				}
				return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "text/plain", Text: text}}}, nil
			})
	}
	add(EnvURI, func() (string, error) {
		env := os.Environ()
		sort.Strings(env)
		return strings.Join(env, "\n"), nil
	})
	add(CwdURI, os.Getwd)
	return srv
}

// ServeStdio serves one session over the process's stdin and stdout until the client
// disconnects.
func ServeStdio(ctx context.Context) error {
	err := NewServer().Run(ctx, &mcp.StdioTransport{})
	if errors.Is(err, mcp.ErrConnectionClosed) {
		return nil
	}
	return err
}

// ParseEnv turns the content of EnvURI back into a map.
func ParseEnv(text string) map[string]string {
	vars := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if name, val, ok := strings.Cut(line, "="); ok {
			vars[name] = val
		}
	}
	return vars
}
