package chaosmcp

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

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

// session is the server's view of one initialized session.
type session struct {
	ss       *mcp.ServerSession
	seq      int
	epoch    int
	protocol string
	caps     Capabilities
	listener string    // the HTTP listener the session arrived on, if any
	lastSeen time.Time // when the session's latest message arrived
	subs     map[string]bool
	closing  chan struct{} // closed when the server ends the session
	scans    map[ListKind]*scanState
	held     []heldUpdate
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

// dropSession forgets a closed session.
func (s *Server) dropSession(ss *mcp.ServerSession) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropSessionLocked(ss)
}

// dropSessionID forgets the closed session with the transport session ID id, if any.
func (s *Server) dropSessionID(id string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for ss := range s.sessions {
		if ss.ID() == id {
			s.dropSessionLocked(ss)
			return
		}
	}
}

func (s *Server) dropSessionLocked(ss *mcp.ServerSession) {
	if sess, ok := s.sessions[ss]; ok {
		closeOnce(sess.closing)
		delete(s.sessions, ss)
		s.changedLocked()
	}
}

// receivingMiddleware is the fault layer for requests.
func (s *Server) receivingMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		s.touch(req)
		switch method {
		case methodInitialize:
			return s.initialize(ctx, method, req, next)
		case methodDiscover:
			return s.discover(ctx, method, req, next)
		case methodListen:
			return s.handleListen(ctx, method, req, next)
		case methodListResources, methodListTemplates:
			res, err := s.handleList(ctx, method, req)
			s.applyCache(res)
			return res, err
		case methodReadResource:
			res, err := s.handleRead(ctx, req)
			s.applyCache(res)
			return res, err
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
	if !slices.ContainsFunc(s.versions, func(v string) bool { return v < ProtocolModern }) {
		// A server of the 2026-07-28 era only: initialize does not exist there (the go-sdk
		// would answer it with 2025-11-25 anyway).
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "initialize is not supported: this server speaks " + strings.Join(s.versions, ", ") + " (use server/discover)"}
	}
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
	sess.lastSeen = time.Now()
	s.countListenerLocked(listener)
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
	if slices.Contains(s.era.listen.Refuse, req.Params.URI) {
		return fmt.Errorf("refusing to watch %s", req.Params.URI)
	}
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

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// touch records that a message of the request's session arrived now (see CloseIdleSessions).
func (s *Server) touch(req mcp.Request) {
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.sessions[ss]; sess != nil {
		sess.lastSeen = time.Now()
	}
}

// countListenerLocked updates the most sessions ever live at once on an HTTP listener, after
// one more session initialized on it.
func (s *Server) countListenerLocked(listener string) {
	if listener == "" {
		return
	}
	live := 0
	for _, sess := range s.sessions {
		if sess.listener == listener {
			live++
		}
	}
	if s.stats.MaxLiveByListener == nil {
		s.stats.MaxLiveByListener = map[string]int{}
	}
	s.stats.MaxLiveByListener[listener] = max(s.stats.MaxLiveByListener[listener], live)
}

// CloseIdleSessions ends every live session from which no message (a request, a ping, a
// notification) arrived for idle, as a server with a session timeout would, and returns how
// many it ended. A test calls it periodically so that the session of a client that died
// without closing it (SIGKILL) stops counting as live; a client that keeps pinging more often
// than idle is never ended.
func (s *Server) CloseIdleSessions(idle time.Duration) int {
	n := 0
	s.closeSessions(func(sess *session) bool {
		if time.Since(sess.lastSeen) >= idle {
			n++
			return true
		}
		return false
	})
	return n
}

// ListenerID names the HTTP listener, as used in [Stats.LiveByListener] and
// [Stats.MaxLiveByListener]. A test that gives each source its own listener counts the live
// sessions of each source.
func (h *HTTPServer) ListenerID() string { return h.listener }
