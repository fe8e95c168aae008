// Package gateway serves mcpsync's accepted, guarded versions to agents over MCP (streamable
// HTTP, both protocol eras): every request is authenticated by a bearer token that names a
// principal, reads return only the latest accepted version through the output guard with its
// proof in _meta, and notifications/resources/updated is sent only after a new version (or a
// tombstone) passed the acceptance fence (issue 15).
//
// Files: gateway.go (options, lifecycle, the per-principal MCP servers), uri.go (gateway URIs),
// auth.go (bearer tokens → principals), resources.go (list and read), subscribe.go (subscribe
// and listen → subscription workflows), feed.go (the invalidation outbox → notifications).
package gateway

import (
	"errors"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// DefaultAddr is where the gateway listens unless configured otherwise (MCPSYNC_GATEWAY_ADDR).
const DefaultAddr = "127.0.0.1:8765"

// Path is the HTTP path of the MCP endpoint.
const Path = "/mcp"

// Options configures a Gateway. Store and Temporal are required; every other zero value is a
// usable default.
type Options struct {
	// Addr is the listen address; empty: DefaultAddr.
	Addr string
	// Store is the ledger (tokens, grants, versions, the outbox).
	Store *ledger.Store
	// Temporal starts subscription workflows for subscribe/listen; Namespace is its namespace.
	Temporal  client.Client
	Namespace string
	// Logger; nil: no logs.
	Logger *zap.Logger
	// MaxRequestBytes bounds a request body; 0: 1 MiB.
	MaxRequestBytes int64
	// MaxStreamsPerToken bounds the open streams (sessions / listens) of one token; 0: 16.
	MaxStreamsPerToken int
	// NotificationQueue bounds the notifications waiting for one stream; 0: 256. A stream whose
	// queue overflows is not silently thinned: it is told to re-read (list_changed) instead.
	NotificationQueue int
}

func (o Options) withDefaults() Options {
	if o.Addr == "" {
		o.Addr = DefaultAddr
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = 1 << 20
	}
	if o.MaxStreamsPerToken == 0 {
		o.MaxStreamsPerToken = 16
	}
	if o.NotificationQueue == 0 {
		o.NotificationQueue = 256
	}
	return o
}

// Gateway is a running MCP gateway. Each principal has its own *mcp.Server, so a notification
// sent through it (Server.ResourceUpdated) can reach only that principal's sessions.
type Gateway struct {
	opts Options

	mu      sync.Mutex
	servers map[string]*mcp.Server // principal → its MCP server
}

// New checks opts and returns a Gateway that is not yet listening.
func New(opts Options) (*Gateway, error) {
	if opts.Store == nil {
		return nil, errors.New("gateway: no ledger store")
	}
	if opts.Temporal == nil {
		return nil, errors.New("gateway: no Temporal client")
	}
	return &Gateway{opts: opts.withDefaults(), servers: map[string]*mcp.Server{}}, nil
}
