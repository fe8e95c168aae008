package chaosmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
)

// Both eras (issue 13 item 8). A server made with Options.ProtocolVersions = AllProtocolVersions
// speaks 2026-07-28 next to the legacy versions: over stdio and in-memory transports a client
// picks its era per session; over HTTP, [Server.BothErasHandler] routes 2026-07-28 requests to
// a stateless handler and everything else to the stateful one, both on the same *mcp.Server
// (the go-sdk serves 2026-07-28 over HTTP only when stateless, and a stateless handler gives
// legacy clients no event stream). Modern sessions never initialize, so they are not in
// [Server.Sessions]; their subscriptions ride on subscriptions/listen, answered by the go-sdk,
// and every fault of notifications/resources/updated applies to them too. list_changed reaches
// a modern client on each of its listen streams whose acknowledgement granted
// resourcesListChanged (the go-sdk client opens such a "control" listen at connect), through
// the list_changed faults; [Stats.LiveListens] and [Stats.LiveListChangedListens] count them.

// ProtocolModern is the stateless revision (server/discover, subscriptions/listen).
const ProtocolModern = mcpsync.ProtocolVersion20260728

// AllProtocolVersions are the legacy versions and 2026-07-28, newest first.
var AllProtocolVersions = append([]string{ProtocolModern}, legacyProtocolVersions...)

const (
	methodListen        = "subscriptions/listen"
	notifyAcknowledged  = "notifications/subscriptions/acknowledged"
	protocolHeader      = "Mcp-Protocol-Version"
	sessionIDHeader     = "Mcp-Session-Id"
	metaKeySubscription = mcp.MetaKeySubscriptionID
)

// ListenFaults are the knobs of the modern era's subscriptions/listen streams; the zero value
// turns them all off. They apply to streams opened afterwards (acknowledgement knobs) or to
// notifications sent afterwards (StaleSubscriptionID).
type ListenFaults struct {
	// WithholdAck never sends notifications/subscriptions/acknowledged: the stream is open
	// and notifications flow, but the client is never told what is watched.
	WithholdAck bool
	// AckOnly, when non-nil, acknowledges only the listed URIs of those asked for (partial
	// ack): the others are left out of the acknowledgement. (The go-sdk server still watches
	// them; a client must treat them as not watched.)
	AckOnly []string
	// Refuse makes the server refuse to watch the listed URIs: resources/subscribe of one of
	// them fails, and so does a whole subscriptions/listen that names one (the go-sdk's
	// acknowledgement is all-or-nothing on error).
	Refuse []string
	// StaleSubscriptionID replaces the subscription ID in the _meta of every
	// notifications/resources/updated with one no live stream has ("stale-…").
	StaleSubscriptionID bool
}

// eraFaults are the modern-era knobs; guarded by Server.mu.
type eraFaults struct {
	listen ListenFaults
	// ttlMs and scope, when ttlMs > 0, are put on every read and list result.
	ttlMs int
	scope string
	// listens are the live subscriptions/listen HTTP requests (DropListenStreams).
	listens map[*listenStream]bool
}

type listenStream struct {
	cancel context.CancelFunc
}

// SetListenFaults sets the subscriptions/listen knobs.
func (s *Server) SetListenFaults(f ListenFaults) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f.AckOnly = slices.Clone(f.AckOnly)
	f.Refuse = slices.Clone(f.Refuse)
	s.era.listen = f
}

// SetResultCache puts ttlMs and cacheScope (e.g. "public" or "private") on every later
// resources/read, resources/list and resources/templates/list result; ttlMs 0 turns it off.
// Only 2026-07-28 clients look at them (the go-sdk client caches while ttlMs > 0).
func (s *Server) SetResultCache(ttlMs int, scope string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.era.ttlMs, s.era.scope = ttlMs, scope
}

// applyCache stamps the cache knobs on a read or list result.
func (s *Server) applyCache(res mcp.Result) {
	s.mu.Lock()
	ttl, scope := s.era.ttlMs, s.era.scope
	s.mu.Unlock()
	if ttl <= 0 {
		return
	}
	switch r := res.(type) {
	case *mcp.ReadResourceResult:
		if r != nil {
			r.TTLMs, r.CacheScope = ttl, scope
		}
	case *mcp.ListResourcesResult:
		if r != nil {
			r.TTLMs, r.CacheScope = ttl, scope
		}
	case *mcp.ListResourceTemplatesResult:
		if r != nil {
			r.TTLMs, r.CacheScope = ttl, scope
		}
	}
}

// modernListen is one live subscriptions/listen request of a 2026-07-28 session, over any
// transport. Its subscription ID and whether it receives list_changed are learnt from the
// acknowledgement the go-sdk sends for it.
type modernListen struct {
	ss          *mcp.ServerSession
	id          any  // the subscription ID (the listen's JSON-RPC ID); nil until acknowledged
	listChanged bool // the go-sdk granted resourcesListChanged and the server advertises it
}

type listenCtxKey struct{}

// handleListen tracks a subscriptions/listen request for as long as the go-sdk serves it
// (until the client cancels it, its stream ends or the session closes).
func (s *Server) handleListen(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	ss, _ := req.GetSession().(*mcp.ServerSession)
	l := &modernListen{ss: ss}
	s.mu.Lock()
	s.listens[l] = true
	s.stats.ListensStarted++
	s.changedLocked()
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listens, l)
		s.changedLocked()
		s.mu.Unlock()
	}()
	return next(context.WithValue(ctx, listenCtxKey{}, l), method, req)
}

// registerListen records, from the acknowledgement the go-sdk is about to send for a listen,
// its subscription ID and whether list_changed is to reach it. When the server no longer
// advertises listChanged ([Server.SetCapabilities]), resourcesListChanged is taken out of the
// acknowledgement, as a session that negotiated without it gets no list_changed.
func (s *Server) registerListen(ctx context.Context, p *mcp.SubscriptionsAcknowledgedParams) {
	l, _ := ctx.Value(listenCtxKey{}).(*modernListen)
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.caps.ListChanged {
		p.Notifications.ResourcesListChanged = false
	}
	if l == nil || !s.listens[l] {
		return
	}
	l.id = p.Meta[metaKeySubscription]
	l.listChanged = p.Notifications.ResourcesListChanged && l.id != nil
	s.changedLocked()
}

// listenSending applies the listen knobs to an outgoing acknowledgement or updated
// notification; it reports false when the message must not be sent.
func (s *Server) listenSending(ctx context.Context, method string, req mcp.Request) bool {
	if method == notifyAcknowledged {
		if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok && p != nil {
			// Registered even when the acknowledgement is withheld: the stream is open
			// and notifications flow on it.
			s.registerListen(ctx, p)
		}
	}
	s.mu.Lock()
	f := s.era.listen
	s.mu.Unlock()
	switch method {
	case notifyAcknowledged:
		if f.WithholdAck {
			s.countEra(func(st *Stats) { st.AcksWithheld++ })
			return false
		}
		if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok && p != nil && f.AckOnly != nil {
			var kept []string
			for _, u := range p.Notifications.ResourceSubscriptions {
				if slices.Contains(f.AckOnly, u) {
					kept = append(kept, u)
				}
			}
			if len(kept) < len(p.Notifications.ResourceSubscriptions) {
				s.countEra(func(st *Stats) { st.AcksPartial++ })
			}
			p.Notifications.ResourceSubscriptions = kept
		}
	case notifyUpdated:
		if p, ok := req.GetParams().(*mcp.ResourceUpdatedNotificationParams); ok && p != nil && f.StaleSubscriptionID {
			if id, ok := p.Meta[metaKeySubscription]; ok {
				m := cloneMeta(p.Meta)
				m[metaKeySubscription] = "stale-" + toString(id)
				p.Meta = m
				s.countEra(func(st *Stats) { st.StaleSubscriptionIDs++ })
			}
		}
	}
	return true
}

func (s *Server) countEra(f func(*Stats)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.stats)
	s.changedLocked()
}

func cloneMeta(m map[string]any) map[string]any {
	out := make(map[string]any, len(m)+1)
	for k, v := range m {
		out[k] = v
	}
	return out
}

func toString(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "?"
	}
	return strings.Trim(string(b), `"`)
}

// StatelessHTTPHandler returns a stateless streamable-HTTP handler of this server: the only
// way the go-sdk serves 2026-07-28 over HTTP. Legacy clients get no event stream from it (GET
// is 405); use [Server.BothErasHandler] to serve both.
func (s *Server) StatelessHTTPHandler() http.Handler {
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp }, &mcp.StreamableHTTPOptions{
		Logger: s.logger, Stateless: true,
	})
	return emptyCursorHTTP(s.trackListens(h))
}

// BothErasHandler serves both eras at one endpoint from one server: a request whose
// Mcp-Protocol-Version header is 2026-07-28 or later, or a server/discover without the header,
// goes to the stateless handler; everything else (initialize, legacy requests with their
// Mcp-Session-Id, the legacy GET event stream) to the stateful one.
func (s *Server) BothErasHandler() http.Handler {
	return s.bothErasHandler("")
}

func (s *Server) bothErasHandler(listener string) http.Handler {
	stateful, stateless := s.httpHandler(listener), s.StatelessHTTPHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get(protocolHeader); v != "" {
			if v >= ProtocolModern {
				stateless.ServeHTTP(w, r)
			} else {
				stateful.ServeHTTP(w, r)
			}
			return
		}
		method, err := peekMethod(r)
		if err != nil {
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if method == methodDiscover {
			stateless.ServeHTTP(w, r)
			return
		}
		stateful.ServeHTTP(w, r)
	})
}

// peekMethod returns the JSON-RPC method of a POST's body (up to 1 MiB), leaving the body
// readable for the handler; "" for other requests and bodies that are not one request.
func peekMethod(r *http.Request) (string, error) {
	if r.Method != http.MethodPost || r.Body == nil {
		return "", nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return "", err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		Method string `json:"method"`
	}
	_ = json.Unmarshal(body, &msg)
	return msg.Method, nil
}

// trackListens wraps a stateless handler so that DropListenStreams can cut the live
// subscriptions/listen responses.
func (s *Server) trackListens(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method, err := peekMethod(r)
		if err != nil {
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if method != methodListen {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		ls := &listenStream{cancel: cancel}
		s.mu.Lock()
		if s.era.listens == nil {
			s.era.listens = map[*listenStream]bool{}
		}
		s.era.listens[ls] = true
		s.stats.ListenStreams++
		s.changedLocked()
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.era.listens, ls)
			s.changedLocked()
			s.mu.Unlock()
		}()
		dropped := make(chan struct{})
		var once sync.Once
		go func() {
			<-ctx.Done()
			once.Do(func() { close(dropped) })
		}()
		h.ServeHTTP(&droppable{ResponseWriter: w, dropped: dropped}, r.WithContext(ctx))
		if r.Context().Err() == nil && ctx.Err() != nil {
			// Cut by DropListenStreams: end the connection without the complete result,
			// as a crashed server would.
			panic(http.ErrAbortHandler)
		}
		cancel()
	})
}

// droppable is a ResponseWriter that writes nothing once its stream was dropped, so the
// go-sdk's final "complete" result never reaches the client.
type droppable struct {
	http.ResponseWriter
	dropped <-chan struct{}
}

func (d *droppable) Write(b []byte) (int, error) {
	select {
	case <-d.dropped:
		return 0, io.ErrClosedPipe
	default:
		return d.ResponseWriter.Write(b)
	}
}

func (d *droppable) Flush() {
	select {
	case <-d.dropped:
	default:
		if f, ok := d.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// DropListenStreams cuts every live subscriptions/listen HTTP stream without its complete
// result (a transport drop), and returns how many it cut. Only HTTP streams are tracked; over
// stdio a listen stream ends only with the connection ([Server.Restart]).
func (s *Server) DropListenStreams() int {
	s.mu.Lock()
	var victims []*listenStream
	for ls := range s.era.listens {
		victims = append(victims, ls)
	}
	s.stats.ListenStreamsDropped += len(victims)
	s.changedLocked()
	s.mu.Unlock()
	for _, ls := range victims {
		ls.cancel()
	}
	return len(victims)
}

// LiveListenStreams is how many subscriptions/listen HTTP streams are open now.
func (s *Server) LiveListenStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.era.listens)
}

// ConnectInMemoryAt is [Server.ConnectInMemory] with the client's protocol choice: version ""
// lets the go-sdk client negotiate (server/discover first, then initialize), any other value
// is passed as mcp.ClientSessionOptions.ProtocolVersion.
func (s *Server) ConnectInMemoryAt(ctx context.Context, opts *mcp.ClientOptions, version string) (*mcp.ClientSession, error) {
	return s.connectInMemory(ctx, mcp.NewClient(&mcp.Implementation{Name: "chaosmcp-client", Version: "0"}, opts), version)
}

// ConnectClientInMemory connects an existing go-sdk client (e.g. one with middleware) over
// in-memory transports at version ("" = negotiate).
func (s *Server) ConnectClientInMemory(ctx context.Context, c *mcp.Client, version string) (*mcp.ClientSession, error) {
	return s.connectInMemory(ctx, c, version)
}

// InMemoryTransport returns a client transport whose other end is served by this server.
func (s *Server) InMemoryTransport(ctx context.Context) (mcp.Transport, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errServerClosed
	}
	st, ct := mcp.NewInMemoryTransports()
	if _, err := s.mcp.Connect(ctx, withEmptyCursors(st), nil); err != nil {
		return nil, fmt.Errorf("chaosmcp: connect server side: %w", err)
	}
	return ct, nil
}

func (s *Server) connectInMemory(ctx context.Context, c *mcp.Client, version string) (*mcp.ClientSession, error) {
	ct, err := s.InMemoryTransport(ctx)
	if err != nil {
		return nil, err
	}
	cs, err := c.Connect(ctx, ct, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, fmt.Errorf("chaosmcp: connect client side: %w", err)
	}
	return cs, nil
}

const methodDiscover = "server/discover"

// discover lets the go-sdk answer server/discover, then rewrites the advertised capabilities
// and server info from the current knobs, as initialize does for legacy sessions.
func (s *Server) discover(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	res, err := next(ctx, method, req)
	if err != nil {
		return res, err
	}
	dr, ok := res.(*mcp.DiscoverResult)
	if !ok || dr == nil {
		return res, err
	}
	s.mu.Lock()
	c, name, version := s.caps, s.name, s.version
	s.mu.Unlock()
	caps := &mcp.ServerCapabilities{Resources: &mcp.ResourceCapabilities{Subscribe: c.Subscribe, ListChanged: c.ListChanged}}
	if c.Snapshot {
		caps.Experimental = map[string]any{SnapshotCapability: map[string]any{
			"version": snapshotExtensionVers, "metaKey": SnapshotMetaKey,
		}}
	}
	dr.Capabilities = caps
	if dr.Meta == nil {
		dr.Meta = mcp.Meta{}
	}
	dr.Meta[mcp.MetaKeyServerInfo] = &mcp.Implementation{Name: name, Version: version}
	return dr, nil
}
