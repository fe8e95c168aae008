// Package chaosmcp is a fault-injecting MCP server built on the go-sdk server side
// (mcp.NewServer). Tests drive it through a Go API: they change its resource set, and they turn
// on one fault at a time (or several) from SPEC R23 — change the set between pages, drop, delay,
// duplicate, reorder or re-encode update notifications, cycle or expire cursors, forge or vary
// snapshot IDs, lose the unsubscribe response, delay or fail chosen reads, restart (new session).
//
// The server speaks the legacy (2025-11-25 and older) protocol versions, so every client session
// is stateful and uses resources/subscribe; clients should pin [ProtocolVersion]. It is served
// over in-memory transports ([Server.ConnectInMemory]), streamable HTTP ([Server.HTTPHandler],
// [Server.StartHTTP]) and stdio ([Server.ServeStdio]).
//
// Every method is safe for concurrent use. Knobs take effect for the next message they apply to;
// capability knobs take effect for sessions that initialize afterwards.
package chaosmcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ProtocolVersion is the MCP protocol version clients of this server should pin
// (mcp.ClientSessionOptions.ProtocolVersion); it is the newest version the server supports.
const ProtocolVersion = "2025-11-25"

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
var legacyProtocolVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

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

// Resource is one entry of the server's resource set.
type Resource struct {
	// URI is the exact string the server lists, reads and notifies.
	URI string
	// Name is the listed name; empty means the last path segment of URI.
	Name string
	// MIMEType is listed and returned by reads.
	MIMEType string
	// Text is the body of a text resource (used when Blob is nil).
	Text string
	// Blob, when non-nil, makes this a binary resource with this body.
	Blob []byte
}

// Template is one entry of resources/templates/list.
type Template struct {
	// URITemplate is the RFC 6570 template, e.g. "demo://notes/{id}".
	URITemplate string
	// Name is the listed name.
	Name string
	// MIMEType is the listed MIME type.
	MIMEType string
}

// SessionInfo describes one live session.
type SessionInfo struct {
	// Seq numbers sessions in the order they initialized, from 1, across restarts.
	Seq int
	// Epoch is the server epoch (number of restarts) the session started in.
	Epoch int
	// ID is the transport session ID (the Mcp-Session-Id for streamable HTTP; empty otherwise).
	ID string
	// ProtocolVersion is the negotiated protocol version.
	ProtocolVersion string
	// Capabilities are the capabilities the session was told about.
	Capabilities Capabilities
	// Subscriptions are the URIs the session is subscribed to, sorted.
	Subscriptions []string
}

// Stats are cumulative counters since the server was created (live values where noted).
type Stats struct {
	// Epoch is the number of restarts so far.
	Epoch int
	// SessionsStarted counts sessions that completed initialize.
	SessionsStarted int
	// LiveSessions is the number of initialized sessions not yet closed.
	LiveSessions int
	// Reads counts resources/read requests per requested URI.
	Reads map[string]int
	// ListCalls and TemplateListCalls count resources/list and resources/templates/list requests.
	ListCalls, TemplateListCalls int
	// CursorErrors counts list requests answered with -32602 because of their cursor.
	CursorErrors int
	// UpdatesSent counts notifications/resources/updated messages written to sessions
	// (duplicates included); UpdatesDuplicated counts the extra copies among them.
	UpdatesSent, UpdatesDuplicated int
	// UpdatesDropped counts updated notifications dropped by a fault.
	UpdatesDropped int
	// UpdatesHeld is the number of updated notifications currently held for reordering.
	UpdatesHeld int
	// ListChangedSent and ListChangedDropped count notifications/resources/list_changed
	// messages written to sessions, and those suppressed or dropped by a fault.
	ListChangedSent, ListChangedDropped int
	// SendErrors counts notifications the transport failed to write (e.g. a closed session).
	SendErrors int
	// SubscribeCalls and UnsubscribeCalls count subscribe / unsubscribe handler calls.
	SubscribeCalls, UnsubscribeCalls int
	// UnsubscribesUnanswered counts unsubscribe requests left unanswered by a fault.
	UnsubscribesUnanswered int
	// Subscriptions is the live number of subscribed sessions per URI.
	Subscriptions map[string]int
}

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

	list   listFaults
	notify notifyFaults
	read   readFaults
	unsub  UnsubscribeMode
	rng    *rand.Rand
	stats  Stats
}

// session is the server's view of one initialized session.
type session struct {
	ss       *mcp.ServerSession
	seq      int
	epoch    int
	protocol string
	caps     Capabilities
	listener string // the HTTP listener the session arrived on, if any
	subs     map[string]bool
	closing  chan struct{} // closed when the server ends the session
	scans    map[ListKind]*scanState
	held     []heldUpdate
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
		name:      cmpOr(opts.Name, defaultName),
		version:   cmpOr(opts.Version, defaultVersion),
		caps:      caps,
		sessions:  make(map[*mcp.ServerSession]*session),
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
		// this is only the starting point.
		Capabilities: &mcp.ServerCapabilities{Resources: &mcp.ResourceCapabilities{}},
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

// Set stores a text resource (creating or replacing it). A new URI sends
// notifications/resources/list_changed to every session that negotiated listChanged; every
// Set sends notifications/resources/updated to the sessions subscribed to exactly uri, even
// when the body did not change.
func (s *Server) Set(uri, text, mimeType string) {
	s.PutMany(Resource{URI: uri, Text: text, MIMEType: mimeType})
}

// SetBlob stores a binary resource; notifications as for [Server.Set].
func (s *Server) SetBlob(uri string, data []byte, mimeType string) {
	if data == nil {
		data = []byte{}
	}
	s.PutMany(Resource{URI: uri, Blob: data, MIMEType: mimeType})
}

// Put stores r; notifications as for [Server.Set].
func (s *Server) Put(r Resource) { s.PutMany(r) }

// PutMany stores several resources at once: at most one list_changed notification is sent
// for the whole batch, and one updated notification per stored URI with subscribers.
// Resources with an empty URI are ignored.
func (s *Server) PutMany(rs ...Resource) {
	s.mu.Lock()
	added := false
	var uris []string
	for _, r := range rs {
		if r.URI == "" {
			continue
		}
		r := r
		if r.Name == "" {
			r.Name = defaultName
			if base := path.Base(r.URI); base != "" && base != "." && base != "/" {
				r.Name = base
			}
		}
		if r.Blob != nil {
			r.Blob = slices.Clone(r.Blob)
			r.Text = ""
		}
		old, ok := s.resources[r.URI]
		if !ok {
			added = true
		}
		if !ok || old.Name != r.Name || old.MIMEType != r.MIMEType {
			s.catalogVersion++
		}
		s.resources[r.URI] = &r
		uris = append(uris, r.URI)
	}
	s.changedLocked()
	s.mu.Unlock()
	if added {
		s.notifyListChanged()
	}
	for _, u := range uris {
		s.notifyUpdated(u)
	}
}

// Delete removes a resource. If it existed, list_changed is sent (as for a new URI) and the
// sessions subscribed to uri get notifications/resources/updated, so that their next read
// observes the deletion. It reports whether the resource existed.
func (s *Server) Delete(uri string) bool {
	s.mu.Lock()
	_, ok := s.resources[uri]
	if ok {
		delete(s.resources, uri)
		s.catalogVersion++
		s.changedLocked()
	}
	s.mu.Unlock()
	if ok {
		s.notifyListChanged()
		s.notifyUpdated(uri)
	}
	return ok
}

// Get returns a copy of the resource stored under exactly uri.
func (s *Server) Get(uri string) (Resource, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.resources[uri]
	if !ok {
		return Resource{}, false
	}
	c := *r
	c.Blob = slices.Clone(r.Blob)
	return c, true
}

// URIs returns the URIs of the resource set, sorted.
func (s *Server) URIs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sortedLocked(ListResources))
}

// SetTemplate adds or replaces a resource template; a new template sends list_changed.
// Templates are listed only: reads are answered from the resource set.
func (s *Server) SetTemplate(t Template) {
	s.mu.Lock()
	old, ok := s.templates[t.URITemplate]
	if !ok || *old != t {
		s.catalogVersion++
	}
	s.templates[t.URITemplate] = &t
	s.changedLocked()
	s.mu.Unlock()
	if !ok {
		s.notifyListChanged()
	}
}

// DeleteTemplate removes a template (sending list_changed) and reports whether it existed.
func (s *Server) DeleteTemplate(uriTemplate string) bool {
	s.mu.Lock()
	_, ok := s.templates[uriTemplate]
	if ok {
		delete(s.templates, uriTemplate)
		s.catalogVersion++
		s.changedLocked()
	}
	s.mu.Unlock()
	if ok {
		s.notifyListChanged()
	}
	return ok
}

// Templates returns the templates, sorted by URI template.
func (s *Server) Templates() []Template {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Template
	for _, k := range s.sortedLocked(ListTemplates) {
		out = append(out, *s.templates[k])
	}
	return out
}

// sortedLocked returns the sorted keys of a list kind, cached per catalog version.
func (s *Server) sortedLocked(kind ListKind) []string {
	if s.sortedAt != s.catalogVersion {
		clear(s.sorted)
		s.sortedAt = s.catalogVersion
	}
	if keys, ok := s.sorted[kind]; ok {
		return keys
	}
	var keys []string
	if kind == ListTemplates {
		for k := range s.templates {
			keys = append(keys, k)
		}
	} else {
		for k := range s.resources {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	s.sorted[kind] = keys
	return keys
}

// Sessions returns the live initialized sessions, ordered by Seq.
func (s *Server) Sessions() []SessionInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SessionInfo
	for _, sess := range s.sessions {
		subs := make([]string, 0, len(sess.subs))
		for u := range sess.subs {
			subs = append(subs, u)
		}
		sort.Strings(subs)
		out = append(out, SessionInfo{
			Seq: sess.seq, Epoch: sess.epoch, ID: sess.ss.ID(), ProtocolVersion: sess.protocol,
			Capabilities: sess.caps, Subscriptions: subs,
		})
	}
	slices.SortFunc(out, func(a, b SessionInfo) int { return a.Seq - b.Seq })
	return out
}

// Subscribers returns the Seq of every live session subscribed to exactly uri, sorted.
func (s *Server) Subscribers(uri string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int
	for _, sess := range s.sessions {
		if sess.subs[uri] {
			out = append(out, sess.seq)
		}
	}
	slices.Sort(out)
	return out
}

// Epoch returns the number of restarts so far.
func (s *Server) Epoch() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.statsLocked()
}

func (s *Server) statsLocked() Stats {
	st := s.stats
	st.Epoch = s.epoch
	st.LiveSessions = len(s.sessions)
	st.Reads = make(map[string]int, len(s.stats.Reads))
	for k, v := range s.stats.Reads {
		st.Reads[k] = v
	}
	st.Subscriptions = map[string]int{}
	st.UpdatesHeld = 0
	for _, sess := range s.sessions {
		for u := range sess.subs {
			st.Subscriptions[u]++
		}
		st.UpdatesHeld += len(sess.held)
	}
	return st
}

// Await blocks until cond holds for the server's [Stats] (re-checked after every change), or
// ctx ends, in which case it returns an error wrapping ctx.Err().
func (s *Server) Await(ctx context.Context, cond func(Stats) bool) error {
	for {
		s.mu.Lock()
		st := s.statsLocked()
		ch := s.changed
		s.mu.Unlock()
		if cond(st) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("chaosmcp: condition not reached (stats %+v): %w", st, ctx.Err())
		}
	}
}

// changedLocked wakes every Await.
func (s *Server) changedLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Restart ends every live session, as a server process restart would: blocked requests are
// released with an error, the sessions are closed (in-memory and stdio clients see the
// connection end; HTTP clients get 404 for the old session ID), and the epoch advances. The
// resource set and the fault knobs are kept. It returns the new epoch.
func (s *Server) Restart() int {
	s.mu.Lock()
	s.epoch++
	epoch := s.epoch
	s.changedLocked()
	s.mu.Unlock()
	s.closeSessions(nil)
	return epoch
}

// closeSessions ends the sessions selected by match; a nil match selects every go-sdk
// session, including those that never initialized. Blocked requests of the selected sessions
// are released first, because the go-sdk's Close waits for in-flight requests.
func (s *Server) closeSessions(match func(*session) bool) {
	s.mu.Lock()
	var victims []*mcp.ServerSession
	for ss, sess := range s.sessions {
		if match == nil || match(sess) {
			closeOnce(sess.closing)
			victims = append(victims, ss)
		}
	}
	s.mu.Unlock()
	if match == nil {
		for ss := range s.mcp.Sessions() {
			if !slices.Contains(victims, ss) {
				victims = append(victims, ss)
			}
		}
	}
	var wg sync.WaitGroup
	for _, ss := range victims {
		wg.Go(func() { _ = ss.Close() })
	}
	wg.Wait()
	for _, ss := range victims {
		s.dropSession(ss)
	}
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

// dropSession forgets a closed session.
func (s *Server) dropSession(ss *mcp.ServerSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess, ok := s.sessions[ss]; ok {
		closeOnce(sess.closing)
		delete(s.sessions, ss)
		s.changedLocked()
	}
}

// receivingMiddleware is the fault layer for requests.
func (s *Server) receivingMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case methodInitialize:
			return s.initialize(ctx, method, req, next)
		case methodListResources, methodListTemplates:
			return s.handleList(ctx, method, req)
		case methodReadResource:
			return s.handleRead(ctx, req)
		case methodSubscribe:
			if sess := s.sessionOf(req); sess != nil && !sess.caps.Subscribe {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "server does not support resource subscriptions"}
			}
		case methodUnsubscribe:
			return s.handleUnsubscribe(ctx, method, req, next)
		}
		return next(ctx, method, req)
	}
}

// initialize lets the go-sdk answer, then registers the session and rewrites the advertised
// capabilities and server info from the current knobs.
func (s *Server) initialize(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	res, err := next(ctx, method, req)
	if err != nil {
		return res, err
	}
	ir, ok := res.(*mcp.InitializeResult)
	if !ok {
		return res, err
	}
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok {
		return res, err
	}
	listener := ""
	if extra := req.GetExtra(); extra != nil && extra.Header != nil {
		listener = extra.Header.Get(listenerHeader)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		// Close waits for in-flight requests, this one included: close asynchronously.
		go func() { _ = ss.Close() }()
		return nil, errServerClosed
	}
	s.sessionSeq++
	sess := &session{
		ss: ss, seq: s.sessionSeq, epoch: s.epoch, protocol: ir.ProtocolVersion, caps: s.caps,
		listener: listener, subs: map[string]bool{}, closing: make(chan struct{}),
		scans: map[ListKind]*scanState{},
	}
	s.sessions[ss] = sess
	s.stats.SessionsStarted++
	caps := &mcp.ServerCapabilities{Resources: &mcp.ResourceCapabilities{
		Subscribe: sess.caps.Subscribe, ListChanged: sess.caps.ListChanged,
	}}
	if sess.caps.Snapshot {
		caps.Experimental = map[string]any{SnapshotCapability: map[string]any{
			"version": snapshotExtensionVers, "metaKey": SnapshotMetaKey,
		}}
	}
	ir.Capabilities = caps
	ir.ServerInfo = &mcp.Implementation{Name: s.name, Version: s.version}
	s.changedLocked()
	// Started under s.mu, so that it cannot race with Close's s.bg.Wait.
	s.bg.Go(func() {
		_ = ss.Wait()
		s.dropSession(ss)
	})
	s.mu.Unlock()
	return ir, nil
}

// sessionOf returns the server's record of the request's session, or nil.
func (s *Server) sessionOf(req mcp.Request) *session {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[ss]
}

// subscribeHandler records a subscription; the go-sdk then records it for ResourceUpdated.
func (s *Server) subscribeHandler(_ context.Context, req *mcp.SubscribeRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.SubscribeCalls++
	if sess := s.sessions[req.Session]; sess != nil {
		sess.subs[req.Params.URI] = true
	}
	s.changedLocked()
	return nil
}

// unsubscribeHandler forgets a subscription, or, under UnsubscribeHang, never returns until
// the client gives up or the session ends (the subscription stays).
func (s *Server) unsubscribeHandler(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	s.mu.Lock()
	s.stats.UnsubscribeCalls++
	mode := s.unsub
	sess := s.sessions[req.Session]
	if mode == UnsubscribeHang {
		s.stats.UnsubscribesUnanswered++
	} else if sess != nil {
		delete(sess.subs, req.Params.URI)
	}
	s.changedLocked()
	s.mu.Unlock()
	if mode == UnsubscribeHang {
		return waitAbandoned(ctx, sess)
	}
	return nil
}

// handleUnsubscribe lets the go-sdk unsubscribe and then, under UnsubscribeLoseResponse,
// withholds the response until the client gives up or the session ends.
func (s *Server) handleUnsubscribe(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	res, err := next(ctx, method, req)
	if err != nil {
		return res, err
	}
	s.mu.Lock()
	lose := s.unsub == UnsubscribeLoseResponse
	if lose {
		s.stats.UnsubscribesUnanswered++
		s.changedLocked()
	}
	s.mu.Unlock()
	if lose {
		return nil, waitAbandoned(ctx, s.sessionOf(req))
	}
	return res, nil
}

// waitAbandoned blocks until the request is cancelled or the server ends the session, and
// returns the reason as an error.
func waitAbandoned(ctx context.Context, sess *session) error {
	var closing <-chan struct{}
	if sess != nil {
		closing = sess.closing
	}
	select {
	case <-ctx.Done():
		return fmt.Errorf("chaosmcp: request abandoned: %w", context.Cause(ctx))
	case <-closing:
		return errSessionEnded
	}
}

var (
	errSessionEnded = errors.New("chaosmcp: session ended by the server")
	errServerClosed = errors.New("chaosmcp: server closed")
)

// UnsubscribeMode selects how resources/unsubscribe is answered.
type UnsubscribeMode int

const (
	// UnsubscribeNormal unsubscribes and answers.
	UnsubscribeNormal UnsubscribeMode = iota
	// UnsubscribeHang never answers (until the client cancels the request or the session
	// ends) and keeps the subscription, so updated notifications continue.
	UnsubscribeHang
	// UnsubscribeLoseResponse unsubscribes but never answers (until the client cancels the
	// request or the session ends): the client cannot tell whether it took effect.
	UnsubscribeLoseResponse
)

// SetUnsubscribeMode selects how later resources/unsubscribe requests are answered.
func (s *Server) SetUnsubscribeMode(m UnsubscribeMode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unsub = m
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
	s.mu.Unlock()
	s.FlushUpdates()
}

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
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
