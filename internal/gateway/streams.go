package gateway

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// HTTP headers limitStreams classifies requests by. A 2026-07-28 request carries its
// method in Mcp-Method (the SDK refuses one whose header and body disagree); a 2025-11-25
// request after initialize carries Mcp-Session-Id.
const (
	headerMethod    = "Mcp-Method"
	headerSessionID = "Mcp-Session-Id"
	methodListen    = "subscriptions/listen"
)

// Notification methods that go through the per-session queues.
const (
	methodResourceUpdated     = "notifications/resources/updated"
	methodResourceListChanged = "notifications/resources/list_changed"
	methodListenAcknowledged  = "notifications/subscriptions/acknowledged"
)

// notifySendTimeout bounds one notification's delivery to one session.
const notifySendTimeout = 10 * time.Second

// tokenStreams is what one token has open: its 2025 sessions, its 2026 listen requests and
// the initializes in flight (counted against MaxStreamsPerToken), and a cancel function per
// long-lived HTTP request (a 2025 GET stream, a 2026 listen) so that a token revocation can
// end them.
type tokenStreams struct {
	pending  int // 2025 initialize requests in flight
	listens  int
	sessions map[*mcp.ServerSession]struct{}
	cancels  map[int]context.CancelFunc
	next     int
}

func (t *tokenStreams) open() int { return t.pending + t.listens + len(t.sessions) }

func (t *tokenStreams) idle() bool { return t.open() == 0 && len(t.cancels) == 0 }

// tooManyStreams is the answer to a request that would open one stream more than
// MaxStreamsPerToken allows.
type tooManyStreams struct{ limit int }

func (e tooManyStreams) Error() string {
	return fmt.Sprintf("too many open streams for this token: at most %d sessions and listen streams at once (issue 15 item 6); close one and retry", e.limit)
}

func (f *feedState) tokenLocked(id string) *tokenStreams {
	f.initLocked()
	t := f.tokens[id]
	if t == nil {
		t = &tokenStreams{sessions: map[*mcp.ServerSession]struct{}{}, cancels: map[int]context.CancelFunc{}}
		f.tokens[id] = t
	}
	return t
}

func (f *feedState) forgetIfIdleLocked(id string) {
	if t := f.tokens[id]; t != nil && t.idle() {
		delete(f.tokens, id)
	}
}

// tokenIDs returns the tokens with something open.
func (f *feedState) tokenIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	out := make([]string, 0, len(f.tokens))
	for id := range f.tokens {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// limitStreams bounds the streams one token holds open (Options.MaxStreamsPerToken, issue
// 15 item 6): a 2025-11-25 session (counted from its initialize request until it ends) and
// a 2026-07-28 subscriptions/listen request. A request that would exceed the bound gets
// HTTP 429 before it reaches the MCP server, so nothing is half-opened. Every long-lived
// request (a 2025 GET stream, a 2026 listen) runs under a context that a revocation of its
// token cancels (endToken). It reads the token from principalFrom, so it must run inside
// protect; a request without a principal is passed on unchanged (protect refused it).
func (g *Gateway) limitStreams(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, tokenID, ok := principalFrom(r.Context())
		if !ok || tokenID == "" {
			h.ServeHTTP(w, r)
			return
		}
		listen := r.Method == http.MethodPost && r.Header.Get(headerMethod) == methodListen
		initialize := r.Method == http.MethodPost && r.Header.Get(headerMethod) == "" && r.Header.Get(headerSessionID) == ""
		stream := r.Method == http.MethodGet || listen
		limit := g.opts.MaxStreamsPerToken

		f := &g.feed
		f.mu.Lock()
		t := f.tokenLocked(tokenID)
		if (listen || initialize) && t.open() >= limit {
			f.forgetIfIdleLocked(tokenID)
			f.mu.Unlock()
			w.Header().Set("Retry-After", "1")
			http.Error(w, tooManyStreams{limit}.Error(), http.StatusTooManyRequests)
			return
		}
		switch {
		case listen:
			t.listens++
		case initialize:
			t.pending++
		}
		ctx := r.Context()
		id := -1
		if stream {
			var cancel context.CancelFunc
			ctx, cancel = context.WithCancel(ctx)
			defer cancel()
			id = t.next
			t.next++
			t.cancels[id] = cancel
		}
		f.mu.Unlock()

		defer func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			t := f.tokenLocked(tokenID)
			switch {
			case listen:
				t.listens--
			case initialize:
				t.pending-- // the session, if one was made, is counted by trackSessions now
			}
			delete(t.cancels, id)
			f.forgetIfIdleLocked(tokenID)
		}()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// endToken ends every stream and session of a token that no longer authenticates: its
// long-lived requests are cancelled and its 2025 sessions closed (item 4).
func (g *Gateway) endToken(tokenID, why string) {
	f := &g.feed
	f.mu.Lock()
	f.initLocked()
	t := f.tokens[tokenID]
	if t == nil {
		f.mu.Unlock()
		return
	}
	var cancels []context.CancelFunc
	for _, c := range t.cancels {
		cancels = append(cancels, c)
	}
	var sessions []*mcp.ServerSession
	for ss := range t.sessions {
		sessions = append(sessions, ss)
	}
	f.mu.Unlock()
	g.opts.Logger.Info("ending the streams of a token", zap.String("token", tokenID), zap.String("why", why),
		zap.Int("requests", len(cancels)), zap.Int("sessions", len(sessions)))
	for _, c := range cancels {
		c()
	}
	for _, ss := range sessions {
		_ = ss.Close()
	}
}

// instrumentServer prepares a principal's server for the feed: it registers the server as
// the one to notify for principal, queues outgoing notifications per session (bounded by
// Options.NotificationQueue), tracks the 2025 sessions of each token, and hides the
// list_changed sentinel. gw-core calls it right after mcp.NewServer; the server's first
// visible set is recorded (recordVisible) before any request gets the server.
func (g *Gateway) instrumentServer(principal string, srv *mcp.Server) {
	g.feed.mu.Lock()
	g.feed.initLocked()
	g.feed.servers[principal] = srv
	g.feed.mu.Unlock()
	srv.AddSendingMiddleware(g.queueNotifications(principal))
	srv.AddReceivingMiddleware(g.trackSessions(principal))
}

// subscribed is called once the SDK registered (registered) or refused a subscribe of
// principal to gatewayURI: a version accepted while the subscribe was pending is announced
// again, now that the session can receive it.
func (g *Gateway) subscribed(principal, gatewayURI string, registered bool) {
	if !g.feed.endSubscribe(principal, gatewayURI, registered) {
		return
	}
	if srv := g.feed.server(principal); srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), notifySendTimeout)
		defer cancel()
		_ = srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: gatewayURI})
	}
}

// trackSessions counts each 2025 session against the token that initialized it, until the
// session ends, and keeps the list_changed sentinel out of resources/list and reads.
func (g *Gateway) trackSessions(principal string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return g.trackSessionsOf(principal, next)
	}
}

func (g *Gateway) trackSessionsOf(principal string, next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "resources/subscribe":
			res, err := next(ctx, method, req)
			if p, ok := req.GetParams().(*mcp.SubscribeParams); ok {
				// The SDK registered the session (or refused) before next returned.
				g.subscribed(principal, p.URI, err == nil)
			}
			return res, err
		case "initialize":
			ss, ok := req.GetSession().(*mcp.ServerSession)
			_, tokenID, okp := principalFromExtra(req.GetExtra())
			if !okp {
				_, tokenID, okp = principalFrom(ctx)
			}
			if !ok || !okp || tokenID == "" {
				return next(ctx, method, req)
			}
			// Counted before the answer goes out, so that limitStreams, which releases the
			// initialize's reservation once the HTTP request ends, never under-counts.
			g.addSession(tokenID, ss)
			res, err := next(ctx, method, req)
			if err != nil {
				g.removeSession(ss)
				return res, err
			}
			go func() { _ = ss.Wait(); g.removeSession(ss) }()
			return res, nil
		case "resources/list":
			res, err := next(ctx, method, req)
			if lr, ok := res.(*mcp.ListResourcesResult); ok && err == nil {
				kept := lr.Resources[:0]
				for _, r := range lr.Resources {
					if r.URI != listChangedSentinel {
						kept = append(kept, r)
					}
				}
				lr.Resources = kept
			}
			return res, err
		case "resources/read":
			if p, ok := req.GetParams().(*mcp.ReadResourceParams); ok && p.URI == listChangedSentinel {
				return nil, mcp.ResourceNotFoundError(p.URI)
			}
		}
		return next(ctx, method, req)
	}
}

func (g *Gateway) addSession(tokenID string, ss *mcp.ServerSession) {
	f := &g.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokenLocked(tokenID).sessions[ss] = struct{}{}
	f.sessionToken[ss] = tokenID
}

func (g *Gateway) removeSession(ss *mcp.ServerSession) {
	f := &g.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	if id, ok := f.sessionToken[ss]; ok {
		delete(f.sessionToken, ss)
		if t := f.tokens[id]; t != nil {
			delete(t.sessions, ss)
			f.forgetIfIdleLocked(id)
		}
	}
}

// queueNotifications is the sending middleware that puts resources/updated and
// list_changed into a bounded queue per session, sent by one goroutine per session: a slow
// agent delays only itself, and never makes the feed wait.
func (g *Gateway) queueNotifications(principal string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return g.queueNotificationsOf(principal, next)
	}
}

func (g *Gateway) queueNotificationsOf(principal string, next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == methodListenAcknowledged {
			// A listen's URIs are registered before its acknowledgement goes out.
			res, err := next(ctx, method, req)
			if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok {
				for _, u := range p.Notifications.ResourceSubscriptions {
					go g.subscribed(principal, u, true)
				}
			}
			return res, err
		}
		if method != methodResourceUpdated && method != methodResourceListChanged {
			return next(ctx, method, req)
		}
		ss, ok := req.GetSession().(*mcp.ServerSession)
		if !ok || ss == nil {
			return next(ctx, method, req)
		}
		g.queueFor(ss, next).push(method, req)
		return nil, nil
	}
}

func (g *Gateway) queueFor(ss *mcp.ServerSession, next mcp.MethodHandler) *notifyQueue {
	f := &g.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	q := f.queues[ss]
	if q != nil {
		return q
	}
	send := func(method string, req mcp.Request) error {
		ctx, cancel := context.WithTimeout(context.Background(), notifySendTimeout)
		defer cancel()
		_, err := next(ctx, method, req)
		return err
	}
	relist := func(meta mcp.Meta) mcp.Request {
		return &mcp.ServerRequest[*mcp.ResourceListChangedParams]{Session: ss, Params: &mcp.ResourceListChangedParams{Meta: meta}}
	}
	q = newNotifyQueue(g.opts.NotificationQueue, send, relist, g.opts.Logger)
	f.queues[ss] = q
	go func() {
		_ = ss.Wait()
		q.stop()
		f.mu.Lock()
		delete(f.queues, ss)
		f.mu.Unlock()
	}()
	return q
}

// notifyQueue is one session's bounded notification queue. Notifications wait in FIFO
// order, a pending duplicate (same method and URI) is not queued twice (one re-read covers
// both), and when capacity distinct notifications are waiting and one more comes, the queue
// does not drop any silently: it replaces everything waiting by one list_changed, which
// tells the agent to list and re-read (issue 15 item 6).
type notifyQueue struct {
	capacity int
	send     func(method string, req mcp.Request) error
	relist   func(mcp.Meta) mcp.Request
	log      *zap.Logger

	mu       sync.Mutex
	items    []queued
	keys     map[string]struct{}
	overflow bool     // send one list_changed before anything else
	meta     mcp.Meta // _meta of the last queued notification (a 2026 listen's subscription ID)
	wake     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
}

type queued struct {
	method string
	req    mcp.Request
	key    string
}

func newNotifyQueue(capacity int, send func(string, mcp.Request) error, relist func(mcp.Meta) mcp.Request, log *zap.Logger) *notifyQueue {
	if capacity < 1 {
		capacity = 1
	}
	q := &notifyQueue{capacity: capacity, send: send, relist: relist, log: log,
		keys: map[string]struct{}{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go q.run()
	return q
}

func notifyKey(method string, req mcp.Request) string {
	if p, ok := req.GetParams().(*mcp.ResourceUpdatedNotificationParams); ok {
		return method + " " + p.URI
	}
	return method
}

func (q *notifyQueue) push(method string, req mcp.Request) {
	key := notifyKey(method, req)
	q.mu.Lock()
	if p := req.GetParams(); p != nil {
		if m := p.GetMeta(); len(m) > 0 {
			q.meta = m
		}
	}
	switch {
	case q.overflow:
		// Everything is re-read after the pending list_changed; nothing more to remember.
	case hasKey(q.keys, key):
	case len(q.items) >= q.capacity:
		q.items, q.keys, q.overflow = nil, map[string]struct{}{}, true
		q.log.Info("notification queue full: the session is told to re-read (list_changed)", zap.Int("capacity", q.capacity))
	default:
		q.items = append(q.items, queued{method, req, key})
		q.keys[key] = struct{}{}
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func hasKey(m map[string]struct{}, k string) bool { _, ok := m[k]; return ok }

func (q *notifyQueue) pop() (queued, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.overflow {
		q.overflow = false
		meta := q.meta
		return queued{method: methodResourceListChanged, req: q.relist(meta), key: methodResourceListChanged}, true
	}
	if len(q.items) == 0 {
		return queued{}, false
	}
	it := q.items[0]
	q.items = q.items[1:]
	delete(q.keys, it.key)
	return it, true
}

func (q *notifyQueue) run() {
	for {
		for {
			it, ok := q.pop()
			if !ok {
				break
			}
			if err := q.send(it.method, it.req); err != nil {
				q.log.Debug("notification not delivered", zap.String("method", it.method), zap.Error(err))
			}
			select {
			case <-q.done:
				return
			default:
			}
		}
		select {
		case <-q.done:
			return
		case <-q.wake:
		}
	}
}

func (q *notifyQueue) stop() { q.stopOnce.Do(func() { close(q.done) }) }
