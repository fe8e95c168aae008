// Package mcpgoserver is a small MCP test server built on an independent implementation,
// github.com/mark3labs/mcp-go v1.2.1, for interop tests of the 2026-07-28 era (issue 13 item
// 10): text resources, resources/read, a mutation API that sets content and notifies
// subscribers, and subscriptions/listen (mcp-go's own, server/subscriptions.go) over stdio and
// streamable HTTP, with knobs that drop the HTTP listen streams without their complete result
// (DropListenStreams), make mcp-go end every listen with its complete result
// (EndListenStreams, the only way a stdio stream ends while its process lives), and hold new
// listens back (HoldListens) so that a change can be made while nothing watches, and refuse
// URIs (RefuseSubscriptions: mcp-go then fails the whole listen, it has no partial
// acknowledgement). ServeListener serves stdio connections that arrive over a socket, and Relay
// is the process a stdio source runs to reach it, so that a test can kill and restart "the
// server process" while the server's state lives on in the test.
//
// mcp-go's built-in sessions do not implement server.SessionWithResourceSubscriptions, so a
// listen's resource subscriptions would be acknowledged and then never notified. The server
// therefore puts its own session type (subSession, wrapping the transport's session) into every
// request's context; it records the URIs each listen stream watches, and Set notifies them on
// that stream, tagged with the listen's subscription ID.
package mcpgoserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

// Server is the test server. Create it with New.
type Server struct {
	mcp *server.MCPServer

	mu        sync.Mutex
	resources map[string]string // URI → text
	sessions  map[*subSession]bool
	listens   map[*listenReq]bool
	live      map[liveKey]any // listen requests being served (both transports) → their JSON-RPC ID
	hold      chan struct{}   // non-nil: new listens wait until it is closed
	refused   map[string]bool // URIs a listen may not subscribe (RefuseSubscriptions)
	stats     Stats
}

// liveKey names one listen request being served: its session and its JSON-RPC ID.
type liveKey struct {
	ss *subSession
	id string
}

// Stats are counters since New.
type Stats struct {
	// Reads counts resources/read per URI.
	Reads map[string]int
	// UpdatesSent counts notifications/resources/updated handed to listen streams.
	UpdatesSent int
	// ListenStreamsDropped counts HTTP listen streams cut by DropListenStreams.
	ListenStreamsDropped int
	// Listens counts subscriptions/listen requests served (past HoldListens).
	Listens int
	// ListensHeld counts listens that waited for a HoldListens release.
	ListensHeld int
	// ListensEnded counts listens EndListenStreams made mcp-go end with their complete result.
	ListensEnded int
	// StdioConnections counts the connections ServeListener served.
	StdioConnections int
}

type listenReq struct{ cancel context.CancelFunc }

// New returns a server named name with no resources, declaring resources with subscribe and
// listChanged.
func New(name string) *Server {
	s := &Server{resources: map[string]string{}, sessions: map[*subSession]bool{}, listens: map[*listenReq]bool{},
		live: map[liveKey]any{}, refused: map[string]bool{}, stats: Stats{Reads: map[string]int{}}}
	hooks := &server.Hooks{}
	hooks.AddBeforeSubscriptionsListen(s.beforeListen)
	hooks.AddAfterSubscriptionsListen(func(ctx context.Context, id any, _ *mcp.SubscriptionsListenRequest, _ *mcp.SubscriptionsListenResult) {
		s.listenDone(ctx, id)
	})
	hooks.AddOnError(func(ctx context.Context, id any, method mcp.MCPMethod, _ any, _ error) {
		if method == mcp.MethodSubscriptionsListen {
			s.listenDone(ctx, id)
		}
	})
	s.mcp = server.NewMCPServer(name, "1.2.1-test", server.WithResourceCapabilities(true, true), server.WithHooks(hooks))
	return s
}

// Set creates or changes the text resource uri and notifies the listen streams watching it.
func (s *Server) Set(uri, text string) {
	s.set(uri, text)
	s.notify(uri)
}

// SetSilently changes (or creates) the resource without any notification.
func (s *Server) SetSilently(uri, text string) { s.set(uri, text) }

func (s *Server) set(uri, text string) {
	s.mu.Lock()
	_, exists := s.resources[uri]
	s.resources[uri] = text
	s.mu.Unlock()
	if !exists {
		s.mcp.AddResource(mcp.NewResource(uri, uri, mcp.WithMIMEType("text/plain")), s.read)
	}
}

func (s *Server) read(_ context.Context, req mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
	uri := req.Params.URI
	s.mu.Lock()
	s.stats.Reads[uri]++
	text, ok := s.resources[uri]
	s.mu.Unlock()
	if !ok {
		return nil, server.ErrResourceNotFound
	}
	return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, MIMEType: "text/plain", Text: text}}, nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Reads = map[string]int{}
	for k, v := range s.stats.Reads {
		st.Reads[k] = v
	}
	return st
}

// Watching returns the URIs some live listen stream watches, sorted.
func (s *Server) Watching() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for ss := range s.sessions {
		for u := range ss.subs {
			seen[u] = true
		}
	}
	out := make([]string, 0, len(seen))
	for u := range seen {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// notify hands notifications/resources/updated for uri to every listen stream watching it.
func (s *Server) notify(uri string) {
	s.mu.Lock()
	var targets []*subSession
	var ids []any
	for ss := range s.sessions {
		if id, ok := ss.subs[uri]; ok {
			targets, ids = append(targets, ss), append(ids, id)
		}
	}
	s.mu.Unlock()
	for i, ss := range targets {
		n := mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{
			Method: mcp.MethodNotificationResourceUpdated,
			Params: mcp.NotificationParams{
				Meta:             map[string]any{mcp.MetaKeySubscriptionID: ids[i]},
				AdditionalFields: map[string]any{"uri": uri},
			},
		}}
		if u, ok := ss.ClientSession.(server.SessionWithStreamableHTTPConfig); ok {
			u.UpgradeToSSEWhenReceiveNotification()
		}
		select {
		case ss.NotificationChannel() <- n:
			s.mu.Lock()
			s.stats.UpdatesSent++
			s.mu.Unlock()
		default:
		}
	}
}

// beforeListen runs before mcp-go serves a subscriptions/listen: it waits while listens are
// held (HoldListens), then notes the listen's subscription ID (its JSON-RPC ID) for each URI it
// asks for, before mcp-go subscribes them on the request's session, and records the listen as
// live.
func (s *Server) beforeListen(ctx context.Context, id any, req *mcp.SubscriptionsListenRequest) {
	s.mu.Lock()
	hold := s.hold
	s.mu.Unlock()
	if hold != nil {
		s.mu.Lock()
		s.stats.ListensHeld++
		s.mu.Unlock()
		select {
		case <-hold:
		case <-ctx.Done():
		}
	}
	ss, ok := server.ClientSessionFromContext(ctx).(*subSession)
	s.mu.Lock()
	s.stats.Listens++
	if ok {
		s.live[liveKey{ss, fmt.Sprint(id)}] = id
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	ss.mu.Lock()
	ss.listenID = id
	for _, u := range req.Params.Notifications.ResourceSubscriptions {
		ss.next[u] = id
	}
	ss.mu.Unlock()
}

// listenDone forgets a listen mcp-go finished serving (its result or its error was produced).
func (s *Server) listenDone(ctx context.Context, id any) {
	ss, ok := server.ClientSessionFromContext(ctx).(*subSession)
	if !ok {
		return
	}
	s.mu.Lock()
	delete(s.live, liveKey{ss, fmt.Sprint(id)})
	s.mu.Unlock()
}

// HoldListens makes every subscriptions/listen that arrives from now on wait (before mcp-go
// subscribes or acknowledges anything) until release is called: while held, a re-listen
// watches nothing, so a change made meanwhile is notified to nobody. Release is idempotent.
func (s *Server) HoldListens() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.hold = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.hold == ch {
				s.hold = nil
			}
			s.mu.Unlock()
			close(ch)
		})
	}
}

// EndListenStreams makes mcp-go end every live listen the way it ends one itself: its handler
// returns, unsubscribes the listen's URIs and mcp-go writes the listen's complete result. It
// cancels each listen through mcp-go's own in-flight cancellation (the handler's context, as a
// notifications/cancelled for the listen's ID would), handed to the MCPServer directly rather
// than sent by the client. It returns how many listens it ended. Over stdio this is the only
// way a listen stream ends while the connection lives.
func (s *Server) EndListenStreams() int {
	s.mu.Lock()
	victims := map[liveKey]any{}
	for k, id := range s.live {
		victims[k] = id
	}
	s.mu.Unlock()
	n := 0
	for k, id := range victims {
		raw, err := json.Marshal(map[string]any{"jsonrpc": mcp.JSONRPC_VERSION, "method": mcp.MethodNotificationCancelled,
			"params": map[string]any{"requestId": id, "reason": "mcpgoserver: EndListenStreams"}})
		if err != nil {
			continue
		}
		s.mcp.HandleMessage(s.mcp.WithContext(context.Background(), k.ss), raw)
		n++
	}
	s.mu.Lock()
	s.stats.ListensEnded += n
	s.mu.Unlock()
	return n
}

// LiveListens is how many subscriptions/listen requests mcp-go is serving (both transports).
func (s *Server) LiveListens() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.live)
}

// wrap puts a subSession around the request's session in ctx.
func (s *Server) wrap(ctx context.Context) context.Context {
	inner := server.ClientSessionFromContext(ctx)
	if inner == nil {
		return ctx
	}
	if _, ok := inner.(*subSession); ok {
		return ctx
	}
	return s.mcp.WithContext(ctx, &subSession{ClientSession: inner, owner: s, subs: map[string]any{}, next: map[string]any{}})
}

// ServeStdio serves one client over in and out (e.g. os.Stdin and os.Stdout) until ctx ends
// or the input closes.
func (s *Server) ServeStdio(ctx context.Context, in io.Reader, out io.Writer) error {
	st := server.NewStdioServer(s.mcp)
	st.SetContextFunc(func(ctx context.Context) context.Context { return s.wrap(ctx) })
	return st.Listen(ctx, in, out)
}

// ServeListener serves the stdio connections that arrive on ln (see Relay), one at a time
// (mcp-go's stdio session is one per process, so a connection is served only once the one
// before it ended), each with ServeStdio until its input ends. It returns when ln is closed
// or ctx ends; a connection being served then is closed.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("mcpgoserver: accepting a stdio connection: %w", err)
		}
		s.mu.Lock()
		s.stats.StdioConnections++
		s.mu.Unlock()
		cctx, cancel := context.WithCancel(ctx)
		stop := context.AfterFunc(cctx, func() { _ = conn.Close() })
		_ = s.ServeStdio(cctx, conn, conn)
		stop()
		cancel()
		_ = conn.Close()
	}
}

// Relay is the body of a stdio server process whose server lives elsewhere: it connects to
// addr (a ServeListener) and copies in to the connection and the connection to out, line by
// line as they come, until the server ends the connection (an end of in is passed on as a
// half-close). Killing the relay's process ends the connection, which the server sees as its
// stdio input ending.
func Relay(addr string, in io.Reader, out io.Writer) error {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return fmt.Errorf("mcpgoserver relay: %w", err)
	}
	defer conn.Close()
	go func() {
		_, _ = io.Copy(conn, in)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	w := bufio.NewWriter(out)
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			if _, werr := w.Write(line); werr != nil {
				return werr
			}
			if werr := w.Flush(); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("mcpgoserver relay: %w", err)
		}
	}
}

// HTTPHandler serves streamable HTTP (both eras; 2026-07-28 requests are served statelessly
// by mcp-go).
func (s *Server) HTTPHandler() http.Handler {
	h := server.NewStreamableHTTPServer(s.mcp, server.WithHTTPContextFunc(func(ctx context.Context, _ *http.Request) context.Context {
		return s.wrap(ctx)
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(body, &msg) != nil || msg.Method != string(mcp.MethodSubscriptionsListen) {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithCancel(r.Context())
		lr := &listenReq{cancel: cancel}
		s.mu.Lock()
		s.listens[lr] = true
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.listens, lr)
			s.mu.Unlock()
		}()
		dw := &droppable{ResponseWriter: w, ctx: ctx}
		h.ServeHTTP(dw, r.WithContext(ctx))
		if r.Context().Err() == nil && ctx.Err() != nil {
			// Cut by DropListenStreams: end the connection without the complete result.
			panic(http.ErrAbortHandler)
		}
		cancel()
	})
}

// DropListenStreams cuts every live HTTP listen stream without its complete result, as a
// transport drop would, and returns how many. (Over stdio a stream ends only with the
// connection: close the server's input or kill its process.)
func (s *Server) DropListenStreams() int {
	s.mu.Lock()
	var victims []*listenReq
	for lr := range s.listens {
		victims = append(victims, lr)
	}
	s.stats.ListenStreamsDropped += len(victims)
	s.mu.Unlock()
	for _, lr := range victims {
		lr.cancel()
	}
	return len(victims)
}

// LiveListenStreams is how many HTTP listen streams are open.
func (s *Server) LiveListenStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.listens)
}

// droppable writes nothing once its stream was cut, so no complete result reaches the client.
type droppable struct {
	http.ResponseWriter
	ctx context.Context
}

func (d *droppable) Write(b []byte) (int, error) {
	if d.ctx.Err() != nil {
		return 0, io.ErrClosedPipe
	}
	return d.ResponseWriter.Write(b)
}

func (d *droppable) Flush() {
	if d.ctx.Err() != nil {
		return
	}
	if f, ok := d.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// subSession wraps a transport's session and implements server.SessionWithResourceSubscriptions
// (which mcp-go's built-in sessions lack), passing the optional interfaces mcp-go looks for on
// to the wrapped session.
type subSession struct {
	server.ClientSession
	owner *Server

	mu       sync.Mutex
	listenID any            // the newest listen's ID
	next     map[string]any // URI → the ID of the listen about to subscribe it
	subs     map[string]any // URI → the subscription ID of the listen that watches it; guarded by owner.mu
}

// RefuseSubscriptions makes the server refuse to subscribe uris from now on. mcp-go has no
// partial acknowledgement: a listen asking for any of them fails as a whole with an
// invalid-params error, and subscribes none of its URIs.
func (s *Server) RefuseSubscriptions(uris ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range uris {
		s.refused[u] = true
	}
}

// errRefused is the error of a URI RefuseSubscriptions names.
var errRefused = errors.New("mcpgoserver: this resource cannot be subscribed")

// SubscribeToResourceErr subscribes uri as SubscribeToResource does, or refuses it (mcp-go
// then fails the whole listen).
func (ss *subSession) SubscribeToResourceErr(uri string) error {
	ss.owner.mu.Lock()
	refused := ss.owner.refused[uri]
	ss.owner.mu.Unlock()
	if refused {
		return errRefused
	}
	ss.SubscribeToResource(uri)
	return nil
}

// SubscribeToResource records uri as watched by the current listen stream.
func (ss *subSession) SubscribeToResource(uri string) {
	ss.mu.Lock()
	id, ok := ss.next[uri]
	if ok {
		delete(ss.next, uri)
	} else {
		id = ss.listenID
	}
	ss.mu.Unlock()
	ss.owner.mu.Lock()
	defer ss.owner.mu.Unlock()
	ss.subs[uri] = id
	ss.owner.sessions[ss] = true
}

// UnsubscribeFromResource forgets uri (mcp-go calls it when the listen ends).
func (ss *subSession) UnsubscribeFromResource(uri string) {
	ss.owner.mu.Lock()
	defer ss.owner.mu.Unlock()
	delete(ss.subs, uri)
	if len(ss.subs) == 0 {
		delete(ss.owner.sessions, ss)
	}
}

// SubscribedResources returns the watched URIs.
func (ss *subSession) SubscribedResources() []string {
	ss.owner.mu.Lock()
	defer ss.owner.mu.Unlock()
	out := make([]string, 0, len(ss.subs))
	for u := range ss.subs {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// IsSubscribedToResource reports whether uri is watched.
func (ss *subSession) IsSubscribedToResource(uri string) bool {
	ss.owner.mu.Lock()
	defer ss.owner.mu.Unlock()
	_, ok := ss.subs[uri]
	return ok
}

// SetSubscriptionFilter passes the listen filter on to the wrapped session.
func (ss *subSession) SetSubscriptionFilter(f mcp.SubscriptionFilter) {
	if fs, ok := ss.ClientSession.(server.SessionWithSubscriptionFilter); ok {
		fs.SetSubscriptionFilter(f)
	}
}

// SubscriptionFilter reads the wrapped session's listen filter.
func (ss *subSession) SubscriptionFilter() (mcp.SubscriptionFilter, bool) {
	if fs, ok := ss.ClientSession.(server.SessionWithSubscriptionFilter); ok {
		return fs.SubscriptionFilter()
	}
	return mcp.SubscriptionFilter{}, false
}

// UpgradeToSSEWhenReceiveNotification passes the SSE upgrade on to the wrapped session.
func (ss *subSession) UpgradeToSSEWhenReceiveNotification() {
	if u, ok := ss.ClientSession.(server.SessionWithStreamableHTTPConfig); ok {
		u.UpgradeToSSEWhenReceiveNotification()
	}
}

// GetClientInfo and the other client-info methods pass on to the wrapped session.
func (ss *subSession) GetClientInfo() mcp.Implementation {
	if c, ok := ss.ClientSession.(server.SessionWithClientInfo); ok {
		return c.GetClientInfo()
	}
	return mcp.Implementation{}
}

// SetClientInfo passes on to the wrapped session.
func (ss *subSession) SetClientInfo(i mcp.Implementation) {
	if c, ok := ss.ClientSession.(server.SessionWithClientInfo); ok {
		c.SetClientInfo(i)
	}
}

// GetClientCapabilities passes on to the wrapped session.
func (ss *subSession) GetClientCapabilities() mcp.ClientCapabilities {
	if c, ok := ss.ClientSession.(server.SessionWithClientInfo); ok {
		return c.GetClientCapabilities()
	}
	return mcp.ClientCapabilities{}
}

// SetClientCapabilities passes on to the wrapped session.
func (ss *subSession) SetClientCapabilities(caps mcp.ClientCapabilities) {
	if c, ok := ss.ClientSession.(server.SessionWithClientInfo); ok {
		c.SetClientCapabilities(caps)
	}
}

var (
	_ server.SessionWithResourceSubscriptions    = (*subSession)(nil)
	_ server.SessionWithResourceSubscriptionsErr = (*subSession)(nil)
	_ server.SessionWithSubscriptionFilter       = (*subSession)(nil)
	_ server.SessionWithStreamableHTTPConfig     = (*subSession)(nil)
	_ server.SessionWithClientInfo               = (*subSession)(nil)
)
