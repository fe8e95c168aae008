// Package chaosmcp is a fault-injecting MCP server built on the go-sdk server side
// (mcp.NewServer). Tests drive it through a Go API: they change its resource set, and they turn
// on one fault at a time (or several) from SPEC R23 — change the set between pages, drop, delay,
// duplicate, reorder or re-encode update notifications, cycle or expire cursors, forge or vary
// snapshot IDs, lose the unsubscribe response, delay or fail chosen reads, restart (new session).
//
// By default the server speaks the legacy (2025-11-25 and older) protocol versions, so every
// client session is stateful and uses resources/subscribe; clients should pin [ProtocolVersion].
// With Options.ProtocolVersions = [AllProtocolVersions] it speaks 2026-07-28 too (era.go). It is served
// over in-memory transports ([Server.ConnectInMemory]), streamable HTTP ([Server.HTTPHandler],
// [Server.StartHTTP]) and stdio ([Server.ServeStdio]).
//
// Every method is safe for concurrent use. Knobs take effect for the next message they apply to;
// capability knobs take effect for sessions that initialize afterwards.
package chaosmcp

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
)

// ProtocolVersion is the MCP protocol version clients of this server should pin
// (mcp.ClientSessionOptions.ProtocolVersion); it is the newest version the server supports.
const ProtocolVersion = mcpsync.ProtocolVersion20251125

// SnapshotCapability is the key under which the server advertises the snapshot-ID extension in
// its initialize result's capabilities.experimental map (when [Capabilities.Snapshot] is set).
// Its value is an object {"version": 1, "metaKey": SnapshotMetaKey}.
const SnapshotCapability = "mcpsync/snapshot"

// SnapshotMetaKey is the key of the snapshot ID (a string) in the _meta object of each
// resources/list and resources/templates/list result, when a [SnapshotMode] other than
// SnapshotOff is set. The ID proves something only if the extension was negotiated.
const SnapshotMetaKey = "mcpsync/snapshotId"

// Method and notification names the server handles or sends.
const (
	methodInitialize      = "initialize"
	methodListResources   = "resources/list"
	methodListTemplates   = "resources/templates/list"
	methodReadResource    = "resources/read"
	methodSubscribe       = "resources/subscribe"
	methodUnsubscribe     = "resources/unsubscribe"
	notifyUpdated         = "notifications/resources/updated"
	notifyListChanged     = "notifications/resources/list_changed"
	defaultName           = "chaosmcp"
	defaultVersion        = "0.1.0"
	defaultPageSize       = 50
	notificationTimeout   = 10 * time.Second
	listenerHeader        = "X-Chaosmcp-Listener"
	snapshotExtensionVers = 1
)

// legacyProtocolVersions are the versions the server negotiates by default: the ones with
// protocol sessions and resources/subscribe.
var legacyProtocolVersions = []string{mcpsync.ProtocolVersion20251125, mcpsync.ProtocolVersion20250618,
	mcpsync.ProtocolVersion20250326, mcpsync.ProtocolVersion20241105}

// Options configure a [Server]. The zero value is valid.
type Options struct {
	// Name and Version are the serverInfo of the initialize result
	// (defaults "chaosmcp" and "0.1.0"); see also [Server.SetServerInfo].
	Name, Version string
	// PageSize is the default number of items per list page (default 50).
	PageSize int
	// Capabilities are the capabilities advertised to sessions; nil means
	// [DefaultCapabilities]. See also [Server.SetCapabilities].
	Capabilities *Capabilities
	// ProtocolVersions restricts the protocol versions the server negotiates. Empty means
	// the legacy versions 2025-11-25, 2025-06-18, 2025-03-26 and 2024-11-05. Including
	// 2026-07-28 lets stateless clients in, for which most faults are not designed.
	ProtocolVersions []string
	// Seed seeds the random source used by probabilistic faults (see [Server.SetUpdateDropRate]).
	Seed uint64
	// Logger receives the server's and the go-sdk's logs (the go-sdk's per-message Info
	// logs at Debug level); nil discards them.
	Logger *slog.Logger
}

// Capabilities are the resource capabilities a session is told about at initialization.
type Capabilities struct {
	// Subscribe advertises resources.subscribe. When false, resources/subscribe is answered
	// with -32601 (method not found) for sessions that negotiated without it.
	Subscribe bool
	// ListChanged advertises resources.listChanged. When false, sessions that negotiated
	// without it receive no notifications/resources/list_changed.
	ListChanged bool
	// Snapshot advertises the snapshot-ID extension ([SnapshotCapability]). Whether list
	// results carry IDs is set separately ([Server.SetSnapshotMode]), so that IDs can be
	// sent without being negotiated.
	Snapshot bool
}

// DefaultCapabilities are the capabilities of a new server: subscribe and listChanged, no
// snapshot extension.
var DefaultCapabilities = Capabilities{Subscribe: true, ListChanged: true}

// Server is a fault-injecting MCP server. Create it with [New]; stop it with [Server.Close].
type Server struct {
	mcp    *mcp.Server
	logger *slog.Logger
	// next is the go-sdk's own sending handler, below the fault layer; send is the whole
	// sending chain (fault layer included). Both are fixed in New.
	next, send mcp.MethodHandler

	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup

	mu        sync.Mutex
	changed   chan struct{}
	closed    bool
	resources map[string]*Resource
	templates map[string]*Template
	// catalogVersion changes whenever a resource or template is added, removed or its
	// descriptor (name, MIME type) changes; sorted caches the sorted keys for that version.
	catalogVersion int64
	sorted         map[ListKind][]string
	sortedAt       int64

	name, version string
	caps          Capabilities
	epoch         int
	sessionSeq    int
	sessions      map[*mcp.ServerSession]*session
	listenerSeq   int
	versions      []string // the protocol versions the server negotiates

	list   listFaults
	notify notifyFaults
	read   readFaults
	unsub  UnsubscribeMode
	era    eraFaults
	// listens are the live subscriptions/listen requests of 2026-07-28 sessions, over any
	// transport (era.go); list_changed reaches those acknowledged with resourcesListChanged.
	listens map[*modernListen]bool
	rng     *rand.Rand
	stats   Stats
}

// New creates a server with an empty resource set.
func New(opts Options) *Server {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	caps := DefaultCapabilities
	if opts.Capabilities != nil {
		caps = *opts.Capabilities
	}
	versions := opts.ProtocolVersions
	if len(versions) == 0 {
		versions = legacyProtocolVersions
	}
	s := &Server{
		logger:    logger,
		changed:   make(chan struct{}),
		resources: make(map[string]*Resource),
		templates: make(map[string]*Template),
		sorted:    make(map[ListKind][]string),
		sortedAt:  -1,
		name:      cmp.Or(opts.Name, defaultName),
		version:   cmp.Or(opts.Version, defaultVersion),
		caps:      caps,
		versions:  slices.Clone(versions),
		sessions:  make(map[*mcp.ServerSession]*session),
		listens:   make(map[*modernListen]bool),
		rng:       rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
	}
	s.list.pageSize = opts.PageSize
	if s.list.pageSize <= 0 {
		s.list.pageSize = defaultPageSize
	}
	s.read.notFound = NotFoundMCP
	s.stats.Reads = map[string]int{}
	s.bgCtx, s.bgCancel = context.WithCancel(context.Background())

	s.mcp = mcp.NewServer(&mcp.Implementation{Name: s.name, Version: s.version}, &mcp.ServerOptions{
		Logger:                    slog.New(demoteInfo{logger.Handler()}),
		PageSize:                  s.list.pageSize,
		SubscribeHandler:          s.subscribeHandler,
		UnsubscribeHandler:        s.unsubscribeHandler,
		SupportedProtocolVersions: versions,
		// The initialize result's capabilities are rewritten per session (see initialize);
		// this is only the starting point. 2026-07-28 sessions never initialize: the go-sdk
		// acknowledges their listens from these, as they were at New (see era.go).
		Capabilities: &mcp.ServerCapabilities{Resources: &mcp.ResourceCapabilities{
			Subscribe: caps.Subscribe, ListChanged: caps.ListChanged}},
	})
	s.mcp.AddSendingMiddleware(s.sendingMiddleware)
	s.mcp.AddReceivingMiddleware(s.receivingMiddleware)
	return s
}

// MCPServer returns the underlying go-sdk server, e.g. to serve it over another transport.
// Adding features to it directly bypasses the fault layer for those features.
func (s *Server) MCPServer() *mcp.Server { return s.mcp }

// SetServerInfo changes the serverInfo (name, version) reported to sessions that initialize
// afterwards.
func (s *Server) SetServerInfo(name, version string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.name, s.version = name, version
}

// SetCapabilities changes the capabilities advertised to sessions that initialize afterwards.
// Live sessions keep what they negotiated.
func (s *Server) SetCapabilities(c Capabilities) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caps = c
}

// Close ends every session, stops delayed notifications and makes the server refuse new
// sessions. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.bgCancel()
	s.closeSessions(nil)
	s.bg.Wait()
	return nil
}

// ClearFaults turns every fault knob off (page sizes back to Options.PageSize, no cycles,
// expiries, hooks, snapshot IDs, notification or read faults, normal unsubscribe), releases
// held notifications in arrival order, and keeps data, capabilities and sessions.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	pageSize := s.list.pageSize
	cursorGen := s.list.cursorGen
	s.list = listFaults{pageSize: pageSize, cursorGen: cursorGen}
	s.notify = notifyFaults{}
	notFound := s.read.notFound
	s.read = readFaults{notFound: notFound}
	s.unsub = UnsubscribeNormal
	s.era = eraFaults{listens: s.era.listens}
	s.mu.Unlock()
	s.FlushUpdates()
}

// CodeResourceNotFound is the MCP error code for an unknown resource in resources/read
// (used by the go-sdk before v1.7 and by many servers); see [NotFoundMCP].
const CodeResourceNotFound = -32002

// demoteInfo logs the go-sdk's Info records (one per session event and notification) at
// Debug level, so that a server logging at Info is not flooded.
type demoteInfo struct{ h slog.Handler }

func demote(l slog.Level) slog.Level {
	if l == slog.LevelInfo {
		return slog.LevelDebug
	}
	return l
}

func (d demoteInfo) Enabled(ctx context.Context, l slog.Level) bool {
	return d.h.Enabled(ctx, demote(l))
}

func (d demoteInfo) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return d.h.Handle(ctx, r)
}

func (d demoteInfo) WithAttrs(as []slog.Attr) slog.Handler { return demoteInfo{d.h.WithAttrs(as)} }
func (d demoteInfo) WithGroup(g string) slog.Handler       { return demoteInfo{d.h.WithGroup(g)} }
