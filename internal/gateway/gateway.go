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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// DefaultAddr is where the gateway listens unless configured otherwise (MCPSYNC_GATEWAY_ADDR).
const DefaultAddr = "127.0.0.1:8765"

// EnvAddr names the environment variable mcpsync-worker reads the gateway's address from.
const EnvAddr = "MCPSYNC_GATEWAY_ADDR"

// AddrFromEnv returns the gateway address mcpsync-worker uses: EnvAddr's value when set
// ("off" or empty: "", no gateway), DefaultAddr when unset.
func AddrFromEnv() string {
	v, ok := os.LookupEnv(EnvAddr)
	switch {
	case !ok:
		return DefaultAddr
	case strings.EqualFold(strings.TrimSpace(v), "off"):
		return ""
	}
	return strings.TrimSpace(v)
}

// ErrAddrInUse is wrapped by Start's error when the address is taken (another worker's
// gateway, say).
var ErrAddrInUse = errors.New("address in use")

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
	// MaxStreamsPerToken bounds the open streams (sessions / listens) of one token; 0: 128.
	// A 2026-07-28 go-sdk client opens one listen per subscribed URI, so this also bounds how
	// many resources one such agent can watch at once.
	MaxStreamsPerToken int
	// NotificationQueue bounds the notifications waiting for one stream; 0: 256. A stream whose
	// queue overflows is not silently thinned: it is told to re-read (list_changed) instead.
	NotificationQueue int
	// PageSize bounds the resources of one resources/list page; 0: 200, at most MaxPageSize.
	PageSize int
}

// MaxPageSize is the largest resources/list page the gateway sends.
const MaxPageSize = 1000

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
		o.MaxStreamsPerToken = 128
	}
	if o.NotificationQueue == 0 {
		o.NotificationQueue = 256
	}
	if o.PageSize <= 0 {
		o.PageSize = 200
	}
	o.PageSize = min(o.PageSize, MaxPageSize)
	return o
}

// principalServer is a principal's MCP server. recorded is closed once the visible set the
// server started from is recorded (recordVisible): no request gets the server before, so a
// change made after an agent's first answer is always a change from what the feed compares
// with.
type principalServer struct {
	srv      *mcp.Server
	recorded chan struct{}
}

// Gateway is an MCP gateway. Each principal has its own *mcp.Server, so a notification sent
// through it (Server.ResourceUpdated) can reach only that principal's sessions, and its
// resources/list and resources/read answer for that principal alone.
type Gateway struct {
	opts Options

	mu      sync.Mutex
	servers map[string]*principalServer // principal → its MCP server

	feed feedState // the notification feed's and stream bounds' state (feed.go, streams.go)

	// stateful serves the 2025-11-25 era (initialize, sessions, the standalone SSE stream),
	// stateless the 2026-07-28 era (server/discover, subscriptions/listen); route picks one.
	stateful, stateless *mcp.StreamableHTTPHandler
	handler             http.Handler

	life     sync.Mutex
	srv      *http.Server
	ln       net.Listener
	cancel   context.CancelFunc
	feedDone chan struct{}
	closed   bool
}

// New checks opts and returns a Gateway that is not yet listening.
func New(opts Options) (*Gateway, error) {
	if opts.Store == nil {
		return nil, errors.New("gateway: no ledger store")
	}
	if opts.Temporal == nil {
		return nil, errors.New("gateway: no Temporal client")
	}
	if opts.MaxRequestBytes < 0 || opts.MaxStreamsPerToken < 0 || opts.NotificationQueue < 0 {
		return nil, fmt.Errorf("gateway: negative limit (request bytes %d, streams %d, queue %d)",
			opts.MaxRequestBytes, opts.MaxStreamsPerToken, opts.NotificationQueue)
	}
	g := &Gateway{opts: opts.withDefaults(), servers: map[string]*principalServer{}}
	slogger := g.sdkLogger()
	g.stateful = mcp.NewStreamableHTTPHandler(g.serverOfRequest, &mcp.StreamableHTTPOptions{
		Logger: slogger, MaxRequestBodyBytes: g.opts.MaxRequestBytes,
	})
	g.stateless = mcp.NewStreamableHTTPHandler(g.serverOfRequest, &mcp.StreamableHTTPOptions{
		Stateless: true, Logger: slogger, MaxRequestBodyBytes: g.opts.MaxRequestBytes,
	})
	mux := http.NewServeMux()
	mux.Handle(Path, g.limitBody(g.protect(g.limitStreams(http.HandlerFunc(g.route)))))
	g.mountMetadata(mux)
	g.handler = mux
	return g, nil
}

// sdkLogger is the go-sdk's logger: warnings and errors only (the SDK logs every message at
// Info).
func (g *Gateway) sdkLogger() *slog.Logger {
	core, err := zapcore.NewIncreaseLevelCore(g.opts.Logger.Named("mcp").Core(), zapcore.WarnLevel)
	if err != nil { // the logger's own level is above Warn already
		core = g.opts.Logger.Named("mcp").Core()
	}
	return slog.New(zapslog.NewHandler(core))
}

// Handler is the gateway's whole HTTP surface: the MCP endpoint at Path (body bound, bearer
// token, stream bounds, era routing) and the protected-resource metadata. Start serves it;
// tests may mount it themselves.
func (g *Gateway) Handler() http.Handler { return g.handler }

// Start listens on Options.Addr and serves Handler, and runs the notification feed, until
// Close (or ctx ends). A listen failure (address in use, malformed) is returned at once and
// leaves nothing running.
func (g *Gateway) Start(ctx context.Context) error {
	g.life.Lock()
	defer g.life.Unlock()
	if g.srv != nil || g.closed {
		return errors.New("gateway: already started or closed")
	}
	ln, err := net.Listen("tcp", g.opts.Addr)
	if errors.Is(err, syscall.EADDRINUSE) {
		err = fmt.Errorf("%w: %w", ErrAddrInUse, err)
	}
	if err != nil {
		return fmt.Errorf("gateway: listen on %s (set MCPSYNC_GATEWAY_ADDR to another address, or to off): %w", g.opts.Addr, err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	g.ln, g.cancel, g.feedDone = ln, cancel, make(chan struct{})
	g.srv = &http.Server{Handler: g.handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: zap.NewStdLog(g.opts.Logger.Named("http"))}
	go func() {
		if err := g.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			g.opts.Logger.Error("gateway: serve", zap.Error(err))
		}
	}()
	go func() {
		defer close(g.feedDone)
		if err := g.runFeed(rctx); err != nil && rctx.Err() == nil {
			g.opts.Logger.Error("gateway: notification feed stopped", zap.Error(err))
		}
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = g.Close()
		case <-rctx.Done():
		}
	}()
	g.opts.Logger.Info("gateway serving", zap.String("url", g.urlLocked()))
	return nil
}

// Addr is the address the gateway listens on (the real port when Options.Addr asked for port
// 0), or Options.Addr before Start.
func (g *Gateway) Addr() string {
	g.life.Lock()
	defer g.life.Unlock()
	if g.ln != nil {
		return g.ln.Addr().String()
	}
	return g.opts.Addr
}

// URL is the MCP endpoint agents connect to: http://ADDR/mcp.
func (g *Gateway) URL() string {
	g.life.Lock()
	defer g.life.Unlock()
	return g.urlLocked()
}

func (g *Gateway) urlLocked() string {
	addr := g.opts.Addr
	if g.ln != nil {
		addr = g.ln.Addr().String()
	}
	return "http://" + addr + Path
}

// Close stops listening, ends every open connection and stream, and stops the feed. It is
// safe to call more than once and before Start.
func (g *Gateway) Close() error {
	g.life.Lock()
	defer g.life.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	if g.srv == nil {
		return nil
	}
	g.cancel()
	err := g.srv.Close()
	<-g.feedDone
	g.mu.Lock()
	servers := g.servers
	g.servers = map[string]*principalServer{}
	g.mu.Unlock()
	for _, s := range servers {
		for ss := range s.srv.Sessions() {
			_ = ss.Close()
		}
	}
	return err
}

// serverOfRequest is the streamable handlers' getServer: the server of the principal whose
// token authenticated r (nil, a 400, when none did: protect runs first, so never).
func (g *Gateway) serverOfRequest(r *http.Request) *mcp.Server {
	p, _, ok := principalFrom(r.Context())
	if !ok {
		return nil
	}
	return g.server(p)
}

// server returns the principal's MCP server, creating it on first use. Its list and read
// answer for principal only (resources.go); its subscribe/unsubscribe are the feed's.
func (g *Gateway) server(principal string) *mcp.Server {
	g.mu.Lock()
	if s, ok := g.servers[principal]; ok {
		g.mu.Unlock()
		<-s.recorded
		return s.srv
	}
	s := &principalServer{srv: g.newServer(principal), recorded: make(chan struct{})}
	g.servers[principal] = s
	g.mu.Unlock()
	// Outside g.mu: one query, bounded (recordVisible), before the first answer.
	g.recordVisible(principal)
	close(s.recorded)
	return s.srv
}

// newServer makes the principal's MCP server and prepares it for the feed.
func (g *Gateway) newServer(principal string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcpsync-gateway", Title: "mcpsync gateway", Version: version()},
		&mcp.ServerOptions{
			Instructions: "Resources here are mcpsync-accepted versions of upstream MCP resources. " +
				"Each read returns the latest accepted, guarded bytes with their resourceVersion.v1 in _meta[\"" + MetaVersion + "\"]; " +
				"notifications/resources/updated is sent only after a new version was accepted.",
			Logger:             g.sdkLogger(),
			SubscribeHandler:   g.subscribe,
			UnsubscribeHandler: g.unsubscribe,
			Capabilities: &mcp.ServerCapabilities{
				Resources: &mcp.ResourceCapabilities{Subscribe: true, ListChanged: true},
			},
			// Every answer is the principal's own and only as fresh as the ledger: no client
			// cache may serve it again or share it (2026-07-28 ttlMs/cacheScope).
			SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
				c.TTLMs, c.CacheScope = 0, "private"
			},
		})
	s.AddReceivingMiddleware(g.resourceMiddleware(principal))
	g.instrumentServer(principal, s) // stream bounds and notification queues (streams.go)
	return s
}

// version is the running binary's module version ("(devel)" in a development build).
func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
