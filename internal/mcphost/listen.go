package mcphost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/discovery"
)

// ListenSet watches a set of URIs on one 2026-07-28 client session through
// subscriptions/listen streams (issue 13 items 2–4). Set up: NewListenSet, Install on the
// client, WrapHTTPClient or WrapTransport for the transport, Connect, Bind; then Watch and
// Unwatch. The session host runs one per 2026-07-28 session (listenhost.go).
//
// It keeps the URIs on subscriptions/listen streams of at most BatchSize URIs each. Layout (measured by
// TestListenLayout, 1,000 URIs on one HTTP server): one stream per URI, what the go-sdk's own
// Subscribe does, holds 1,000 HTTP streams, ~9-10k goroutines and tens of MiB, and takes
// seconds to be acknowledged; batches of 500 hold 2 streams, are acknowledged in
// milliseconds and re-listen after a drop in milliseconds, with the same update latency. The
// default is 500 (and BatchBytes bounds a listen request's size), not one stream for all,
// so that one stream's end re-reads at most B subscriptions and no listen request grows
// without bound.
//
// URIs asked for together (within Coalesce) share a stream; a URI added later goes on a new
// stream of its own batch: streams are append-only, so adding never re-opens, and never
// interrupts, a stream that is watching. A stream whose URIs were all removed is cancelled;
// one with some left keeps watching the removed ones (their updates are passed on: the host
// routes by URI and ignores URIs nobody holds), and a removed URI watched again rejoins it.
// No two live streams carry one URI: a stdio server keeps subscriptions per session, so the
// end of either would unsubscribe it for both.
//
// How a batch is sent with go-sdk v1.8.0, which has no raw JSON-RPC call and refuses
// standard method names as custom ones: ClientSession.Subscribe under 2026-07-28 opens one
// fire-and-forget subscriptions/listen per URI (client.go ~1381-1413); the ListenSet calls it
// with a token URI ("mcpsync-listen:N") and its client sending middleware rewrites that
// listen's params to the batch, tagging them with the token in _meta (listenTokenMeta) so
// that the transport tap can pair the token with the JSON-RPC ID the go-sdk picks.
// ClientSession.Unsubscribe of the token cancels the stream.
//
// What the go-sdk does not report is observed beside it, by a transport tap: over streamable
// HTTP an http.RoundTripper (WrapHTTPClient) that sees the listen POST and reads its SSE body
// along with the go-sdk (the HTTP connection has unexported methods the go-sdk type-asserts,
// so it cannot be wrapped); over stdio and in-memory transports a Connection wrapper
// (WrapTransport) that sees the listen request and every incoming message.
//   - The acknowledgement (notifications/subscriptions/acknowledged, its subscription ID in
//     _meta under mcp.MetaKeySubscriptionID, a JSON number) is read by the tap in stream
//     order, so it is always seen before the stream's end. Per URI (R9): listed =
//     WatchAcknowledged; left out = WatchNotAcknowledged (the caller polls, R11); no ack
//     within AckTimeout, or the listen refused = WatchFailed (a failed subscribe). A stream
//     whose ack lists none of its URIs is cancelled (it watches nothing).
//   - An updated notification reaches the client's ResourceUpdatedHandler only if its
//     subscription ID is a current stream's; otherwise OnStale is told (OLD_SESSION) and it
//     routes nothing (the receiving middleware drops it). One without a subscription ID is
//     passed on (a notification only asks for a read; dropping it could lose a change). An
//     update of a stream that just ended may be handled after the end was seen: it is
//     reported stale too, and the epoch's re-read covers it.
//   - A stream that ends other than by our cancel (a transport drop: the body ends without
//     the listen's response; a complete result; a server error after the ack) is a new epoch
//     (R12): OnEpoch is told its URIs (nothing is replayed, each must re-read) and the stream
//     is re-opened after a capped, jittered backoff. Over stdio a transport drop ends the
//     whole connection, hence the session (the host's generation change); a stream can still
//     end alone there with a complete result or an error, which the wrapper sees.
//
// The go-sdk opens a listen of its own at connect when the client has list-changed handlers
// (client.go ~334-360); the ListenSet adopts it as the control stream and re-opens it (with
// resourcesListChanged) when it ends, telling OnEpoch with Control set and no URIs. Its
// acknowledgement is bounded by AckTimeout too: the go-sdk sends it inside Connect with no
// deadline, and over HTTP the request waits for the response headers, which a server that
// withholds the acknowledgement may withhold as well; past AckTimeout the tap cancels the
// request (Connect goes on) and the stream ends as an epoch like any unexpected end.
type ListenSet struct {
	opts ListenOptions

	mu      sync.Mutex
	cs      *mcp.ClientSession
	closed  bool
	seq     int
	entries map[string]*watchEntry
	pending []string
	flushT  *time.Timer
	tokens  map[string]*listenStream // token → stream (open or opening)
	ids     map[string]*listenStream // raw JSON-RPC ID → stream
	retired map[string]bool          // IDs of streams we cancelled: their late updates are dropped silently
	// carried maps each URI on a live stream to it, removed URIs included: a URI watched
	// again while a stream still carries it rejoins that stream, so that no two live streams
	// carry one URI (over stdio a server keeps subscriptions per session, and the end of
	// either stream would unsubscribe the URI for both).
	carried map[string]*listenStream
	control *listenStream
	// unbound are streams whose listen was due before Bind (a control stream re-opened while
	// the connect was still under way): Bind sends them.
	unbound []*listenStream
}

// ListenOptions configure a ListenSet; zero values take the defaults.
type ListenOptions struct {
	// BatchSize is the most URIs one stream carries (default 500; 1 is the go-sdk's layout).
	BatchSize int
	// BatchBytes bounds the summed length of one stream's URIs (default 256 KiB), so that a
	// listen request stays well below the request size servers accept.
	BatchBytes int
	// AckTimeout bounds the wait for a stream's acknowledgement (default 10 s): its URIs are
	// then WatchFailed (a failed subscribe, issue 13 item 3) and the stream is cancelled; the
	// control stream then ends as an epoch and is listened again with backoff.
	AckTimeout time.Duration
	// Coalesce is how long URIs asked for are gathered before their streams open (default
	// 10 ms), so that subscriptions made together share a stream.
	Coalesce time.Duration
	// BackoffMin and BackoffMax bound the re-listen backoff after an unexpected end
	// (defaults 200 ms and 30 s); each delay is jittered down by up to half.
	BackoffMin, BackoffMax time.Duration
	// ListChanged opens a control stream (resourcesListChanged) at Bind when the go-sdk did
	// not open one itself.
	ListChanged bool

	// OnEpoch is told of a stream that ended without our cancel: its URIs must re-read,
	// since nothing is replayed (R12). It is called before the re-listen is sent; a re-read
	// covers the gap only once OnState reported the re-opened stream's acknowledgement (or
	// its failure: then the URI polls). Called without locks held, from the transport's
	// goroutine: it must not block.
	OnEpoch func(e ListenEpoch)
	// OnStale is told of an updated notification whose subscription ID is no current
	// stream's (audited OLD_SESSION by the caller); it was not routed.
	OnStale func(uri, subscriptionID string)
	// OnState is told of every decision about a URI made after its Watch returned (a
	// re-opened stream acknowledged it again, left it out, or timed out).
	OnState func(uri string, st WatchState, err error)
}

// ListenEpoch describes a stream that ended without our cancel.
type ListenEpoch struct {
	// URIs are the watched URIs the stream carried (none for the control stream).
	URIs []string
	// Control is set when it was the list-changed control stream.
	Control bool
	// Reason says how it ended: a transport drop, a complete result, a server error.
	Reason string
}

// WatchState is what the ListenSet knows of one URI.
type WatchState int

// The states of a watched URI.
const (
	// WatchPending: its stream is not acknowledged yet.
	WatchPending WatchState = iota
	// WatchAcknowledged: the server listed it in the stream's acknowledgement: real-time.
	WatchAcknowledged
	// WatchNotAcknowledged: the acknowledgement left it out: not watched, poll it (R11).
	WatchNotAcknowledged
	// WatchFailed: no acknowledgement within AckTimeout, or the server refused the listen:
	// a failed subscribe.
	WatchFailed
)

func (s WatchState) String() string {
	switch s {
	case WatchPending:
		return "pending"
	case WatchAcknowledged:
		return "acknowledged"
	case WatchNotAcknowledged:
		return "not acknowledged"
	case WatchFailed:
		return "failed"
	}
	return "WatchState(" + strconv.Itoa(int(s)) + ")"
}

// ErrAckTimeout is the error of a URI whose stream was not acknowledged within AckTimeout.
var ErrAckTimeout = errors.New("mcphost: subscriptions/listen not acknowledged in time")

// errUnwatched decides a URI removed before its stream was acknowledged.
var errUnwatched = errors.New("mcphost: unwatched before it was acknowledged")

// ErrListenClosed is returned by Watch once the ListenSet is closed (and is the error of
// URIs still waiting for their acknowledgement then).
var ErrListenClosed = errors.New("mcphost: listen set closed")

type watchEntry struct {
	state   WatchState
	err     error
	stream  *listenStream
	decided chan struct{} // closed at the first decision (again after an epoch: see ended)
	told    bool          // the current decided channel is closed
	// redecide: an epoch re-opened the entry's stream after it had been decided; its next
	// decision closes a new decided channel (a Watch made meanwhile waits for the re-opened
	// stream's acknowledgement) and is also reported to OnState.
	redecide bool
}

type listenStream struct {
	token   string
	uris    []string
	control bool
	id      string // raw JSON of the listen's JSON-RPC ID once sent
	acked   bool
	// ackedURIs are the URIs its acknowledgement listed.
	ackedURIs map[string]bool
	closing   bool // cancelled by us: its end is no epoch
	ended     bool
	attempt   int       // re-listens in a row without a stable stream (backoff)
	opened    time.Time // when its listen was sent
	timer     *time.Timer
	// ours: sent by open (ClientSession.Subscribe of its token), so Unsubscribe cancels it;
	// the go-sdk's own control listen can be cancelled only through its HTTP request.
	ours bool
	// cancel aborts its HTTP request (set by the HTTP tap when the listen goes out).
	cancel context.CancelFunc
}

const (
	listenTokenPrefix = "mcpsync-listen:"
	// listenTokenMeta tags a rewritten listen's params with its token, for the transport tap.
	listenTokenMeta = "dev.mcpsync/listen"
	methodListen    = "subscriptions/listen"
	methodAck       = "notifications/subscriptions/acknowledged"
	methodUpdated   = "notifications/resources/updated"
)

// NewListenSet returns an empty ListenSet. Install it on the client and wrap the transport
// before connecting; Bind it to the session after.
func NewListenSet(opts ListenOptions) *ListenSet {
	if opts.BatchSize <= 0 {
		opts.BatchSize = 500
	}
	if opts.BatchBytes <= 0 {
		opts.BatchBytes = 256 << 10
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = 10 * time.Second
	}
	if opts.Coalesce <= 0 {
		opts.Coalesce = 10 * time.Millisecond
	}
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = 200 * time.Millisecond
	}
	if opts.BackoffMax < opts.BackoffMin {
		opts.BackoffMax = max(30*time.Second, opts.BackoffMin)
	}
	return &ListenSet{opts: opts, entries: map[string]*watchEntry{}, tokens: map[string]*listenStream{}, ids: map[string]*listenStream{}, retired: map[string]bool{},
		carried: map[string]*listenStream{}}
}

// Install adds the ListenSet's middleware to client: the sending one that turns a token
// Subscribe into the batch's listen, the receiving one that reads acknowledgements and keeps
// updated notifications with a stale subscription ID from the client's handlers. One
// ListenSet serves one session of the client.
func (l *ListenSet) Install(client *mcp.Client) {
	client.AddSendingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == methodListen {
				if p, ok := req.GetParams().(*mcp.SubscriptionsListenParams); ok && p != nil && p.Notifications != nil {
					l.rewrite(p)
				}
			}
			return next(ctx, method, req)
		}
	})
	client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == methodUpdated {
				if p, ok := req.GetParams().(*mcp.ResourceUpdatedNotificationParams); ok && p != nil {
					if id, has := p.Meta[mcp.MetaKeySubscriptionID]; has {
						switch l.routing(rawID(id)) {
						case routeRetired:
							return nil, nil
						case routeStale:
							if l.opts.OnStale != nil {
								l.opts.OnStale(p.URI, rawID(id))
							}
							return nil, nil
						}
					}
				}
			}
			return next(ctx, method, req)
		}
	})
}

// rewrite turns a token listen into its stream's batch, or adopts the go-sdk's own
// list-changed listen as the control stream; both are tagged with their token.
func (l *ListenSet) rewrite(p *mcp.SubscriptionsListenParams) {
	n := p.Notifications
	l.mu.Lock()
	defer l.mu.Unlock()
	var st *listenStream
	if len(n.ResourceSubscriptions) == 1 && strings.HasPrefix(n.ResourceSubscriptions[0], listenTokenPrefix) {
		st = l.tokens[n.ResourceSubscriptions[0]]
		if st == nil {
			// A stream cancelled before it was sent: ask for nothing (servers end an empty
			// listen at once).
			p.Notifications = &mcp.NotificationSubscriptions{}
			return
		}
		if st.control {
			p.Notifications = &mcp.NotificationSubscriptions{ResourcesListChanged: true}
		} else {
			p.Notifications = &mcp.NotificationSubscriptions{ResourceSubscriptions: append([]string(nil), st.uris...)}
		}
	} else if len(n.ResourceSubscriptions) == 0 && n.ResourcesListChanged && l.control == nil {
		l.seq++
		st = &listenStream{token: listenTokenPrefix + strconv.Itoa(l.seq), control: true, opened: time.Now()}
		l.tokens[st.token] = st
		l.control = st
		// The go-sdk sends it inside Connect, with no deadline of its own: over HTTP a server
		// that withholds the acknowledgement may hold the response headers too, and the
		// connect with them. The ack timeout bounds it like any stream of ours.
		st.timer = time.AfterFunc(l.opts.AckTimeout, func() { l.ackTimedOut(st) })
	} else {
		return
	}
	m := mcp.Meta{}
	for k, v := range p.Meta {
		m[k] = v
	}
	m[listenTokenMeta] = st.token
	p.Meta = m
}

// Bind attaches the connected session; Watch works from then on. With ListChanged it opens
// the control stream unless the go-sdk opened one at connect.
func (l *ListenSet) Bind(cs *mcp.ClientSession) {
	l.mu.Lock()
	l.cs = cs
	due := l.unbound
	l.unbound = nil
	if l.opts.ListChanged && l.control == nil {
		st := l.newStreamLocked(nil, true)
		l.control = st
		due = append(due, st)
	}
	l.mu.Unlock()
	for _, st := range due {
		l.open(st)
	}
}

// Watch adds uris to the watched set and returns, per URI, the first decision about it:
// WatchAcknowledged, WatchNotAcknowledged or WatchFailed (a URI already watched answers its
// current state at once; a failed one is tried again). A URI unwatched, or the set closed,
// before the decision is WatchFailed. It returns early with ctx's error; the URIs stay in the
// set. Err tells why a URI failed.
func (l *ListenSet) Watch(ctx context.Context, uris []string) (map[string]WatchState, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrListenClosed
	}
	if l.cs == nil {
		l.mu.Unlock()
		return nil, errors.New("mcphost: listen set not bound to a session")
	}
	waits := make(map[string]chan struct{}, len(uris))
	entries := make(map[string]*watchEntry, len(uris))
	for _, u := range uris {
		e := l.entries[u]
		if e != nil && e.state == WatchFailed {
			e = nil // a failed subscribe is tried again
		}
		if e == nil {
			e = &watchEntry{decided: make(chan struct{})}
			l.entries[u] = e
			if st := l.carried[u]; st != nil {
				e.stream = st
				if st.acked {
					state := WatchNotAcknowledged
					if st.ackedURIs[u] {
						state = WatchAcknowledged
					}
					l.decideLocked(u, e, state, nil)
				}
			} else {
				l.pending = append(l.pending, u)
			}
		}
		waits[u], entries[u] = e.decided, e
	}
	if len(l.pending) >= l.opts.BatchSize {
		l.flushLocked()
	} else if len(l.pending) > 0 && l.flushT == nil {
		l.flushT = time.AfterFunc(l.opts.Coalesce, l.flush)
	}
	l.mu.Unlock()
	out := make(map[string]WatchState, len(uris))
	for u, decided := range waits {
		select {
		case <-decided:
		case <-ctx.Done():
			return out, fmt.Errorf("waiting for the acknowledgement of %s: %w", u, ctx.Err())
		}
		l.mu.Lock()
		out[u] = entries[u].state
		l.mu.Unlock()
	}
	return out, nil
}

// Err returns the error of a WatchFailed URI (nil otherwise, or when it is not in the set).
func (l *ListenSet) Err(uri string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.entries[uri]; e != nil {
		return e.err
	}
	return nil
}

// State returns what is known of uri, and false when it is not in the set.
func (l *ListenSet) State(uri string) (WatchState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[uri]
	if e == nil {
		return 0, false
	}
	return e.state, true
}

// Unwatch removes uris from the set. A stream left without any URI of the set is cancelled;
// others keep running (nothing is re-opened).
func (l *ListenSet) Unwatch(uris []string) {
	l.mu.Lock()
	var cancel []string
	for _, u := range uris {
		e := l.entries[u]
		if e == nil {
			continue
		}
		delete(l.entries, u)
		if !e.told {
			l.decideLocked(u, e, WatchFailed, errUnwatched)
		}
		if st := e.stream; st != nil && !st.closing && !l.liveLocked(st) {
			st.closing = true
			l.dropLocked(st)
			cancel = append(cancel, st.token)
		}
	}
	cs := l.cs
	l.mu.Unlock()
	for _, tok := range cancel {
		_ = cs.Unsubscribe(context.Background(), &mcp.UnsubscribeParams{URI: tok})
	}
}

// Streams returns how many listen streams are open or opening (the control stream included).
func (l *ListenSet) Streams() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tokens)
}

// Close cancels every stream; Watch fails from then on.
func (l *ListenSet) Close() {
	l.mu.Lock()
	l.closed = true
	if l.flushT != nil {
		l.flushT.Stop()
	}
	var cancel []string
	var aborts []context.CancelFunc
	for tok, st := range l.tokens {
		st.closing = true
		if st.timer != nil {
			st.timer.Stop()
		}
		cancel = append(cancel, tok)
		if st.cancel != nil {
			aborts = append(aborts, st.cancel)
		}
	}
	l.unbound = nil
	l.tokens, l.ids, l.carried = map[string]*listenStream{}, map[string]*listenStream{}, map[string]*listenStream{}
	for u, e := range l.entries {
		if !e.told {
			l.decideLocked(u, e, WatchFailed, ErrListenClosed)
		}
	}
	cs := l.cs
	l.mu.Unlock()
	for _, abort := range aborts {
		abort()
	}
	if cs == nil {
		return
	}
	for _, tok := range cancel {
		_ = cs.Unsubscribe(context.Background(), &mcp.UnsubscribeParams{URI: tok})
	}
}

// liveLocked reports whether st still carries a URI of the set.
func (l *ListenSet) liveLocked(st *listenStream) bool {
	for _, u := range st.uris {
		if e := l.entries[u]; e != nil && e.stream == st {
			return true
		}
	}
	return false
}

func (l *ListenSet) dropLocked(st *listenStream) {
	delete(l.tokens, st.token)
	for _, u := range st.uris {
		if l.carried[u] == st {
			delete(l.carried, u)
		}
	}
	if st.id != "" {
		delete(l.ids, st.id)
		if st.closing {
			l.retired[st.id] = true
		}
	}
	if st.timer != nil {
		st.timer.Stop()
	}
	if l.control == st {
		l.control = nil
	}
}

func (l *ListenSet) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.flushLocked()
}

// flushLocked puts the pending URIs on new streams of at most BatchSize and opens them (in
// the background: Subscribe sends the listen inline).
func (l *ListenSet) flushLocked() []*listenStream {
	if l.flushT != nil {
		l.flushT.Stop()
		l.flushT = nil
	}
	if l.closed {
		return nil
	}
	var live []string
	for _, u := range l.pending {
		if e := l.entries[u]; e != nil && e.stream == nil {
			live = append(live, u)
		}
	}
	l.pending = nil
	var out []*listenStream
	for len(live) > 0 {
		n, size := 0, 0
		for n < len(live) && n < l.opts.BatchSize && (n == 0 || size+len(live[n]) <= l.opts.BatchBytes) {
			size += len(live[n])
			n++
		}
		st := l.newStreamLocked(live[:n:n], false)
		for _, u := range st.uris {
			l.entries[u].stream = st
		}
		live = live[n:]
		out = append(out, st)
	}
	for _, st := range out {
		go l.open(st)
	}
	return out
}

func (l *ListenSet) newStreamLocked(uris []string, control bool) *listenStream {
	l.seq++
	st := &listenStream{token: listenTokenPrefix + strconv.Itoa(l.seq), uris: uris, control: control}
	l.tokens[st.token] = st
	for _, u := range uris {
		l.carried[u] = st
	}
	return st
}

// open sends st's listen and arms its acknowledgement timeout.
func (l *ListenSet) open(st *listenStream) {
	l.mu.Lock()
	if l.closed || st.closing {
		l.mu.Unlock()
		return
	}
	cs := l.cs
	if cs == nil {
		l.unbound = append(l.unbound, st)
		l.mu.Unlock()
		return
	}
	st.ours = true
	st.opened = time.Now()
	st.timer = time.AfterFunc(l.opts.AckTimeout, func() { l.ackTimedOut(st) })
	l.mu.Unlock()
	if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: st.token}); err != nil {
		l.ended(st.token, "", fmt.Errorf("sending subscriptions/listen: %w", err), false)
	}
}

// ackTimedOut fails the URIs of a stream never acknowledged and cancels it. The control
// stream instead ends as an epoch (a list_changed may have been missed) and is listened
// again with backoff, as after any unexpected end.
func (l *ListenSet) ackTimedOut(st *listenStream) {
	l.mu.Lock()
	if st.acked || st.closing || st.ended {
		l.mu.Unlock()
		return
	}
	if st.control {
		l.mu.Unlock()
		l.ended(st.token, "", fmt.Errorf("%w (%v)", ErrAckTimeout, l.opts.AckTimeout), false)
		l.abandon(st)
		return
	}
	st.closing = true
	l.dropLocked(st)
	var notes []stateNote
	for _, u := range st.uris {
		if e := l.entries[u]; e != nil && e.stream == st {
			notes = append(notes, l.decideLocked(u, e, WatchFailed, fmt.Errorf("%w (%v)", ErrAckTimeout, l.opts.AckTimeout)))
		}
	}
	l.mu.Unlock()
	l.tell(notes)
	l.abandon(st)
}

// abandon cancels a stream we no longer count on: its HTTP request if the tap saw it go out,
// and, if open sent it, its go-sdk listen.
func (l *ListenSet) abandon(st *listenStream) {
	l.mu.Lock()
	cs, cancel, ours := l.cs, st.cancel, st.ours
	l.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if ours && cs != nil {
		_ = cs.Unsubscribe(context.Background(), &mcp.UnsubscribeParams{URI: st.token})
	}
}

type stateNote struct {
	uri   string
	state WatchState
	err   error
	later bool // after Watch returned: goes to OnState
}

func (l *ListenSet) decideLocked(uri string, e *watchEntry, st WatchState, err error) stateNote {
	e.state, e.err = st, err
	if !e.told {
		e.told = true
		close(e.decided)
		return stateNote{uri: uri, state: st, err: err, later: e.redecide}
	}
	return stateNote{uri: uri, state: st, err: err, later: true}
}

func (l *ListenSet) tell(notes []stateNote) {
	if l.opts.OnState == nil {
		return
	}
	for _, n := range notes {
		if n.later {
			l.opts.OnState(n.uri, n.state, n.err)
		}
	}
}

// sent pairs a token with the JSON-RPC ID its listen went out with (the transport tap);
// cancel, if not nil, aborts the listen's HTTP request.
func (l *ListenSet) sent(token, id string, cancel context.CancelFunc) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.tokens[token]; st != nil && st.id == "" {
		st.id = id
		st.cancel = cancel
		l.ids[id] = st
	}
}

// current reports whether id is the subscription ID of a stream of this set.
func (l *ListenSet) current(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.ids[id]
	return ok
}

type routeVerdict int

const (
	routeCurrent routeVerdict = iota
	routeRetired              // a stream we cancelled: dropped silently
	routeStale                // no stream of ours: OLD_SESSION
)

// routing says what to do with a notification carrying subscription ID id.
func (l *ListenSet) routing(id string) routeVerdict {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.ids[id] != nil:
		return routeCurrent
	case l.retired[id]:
		return routeRetired
	}
	return routeStale
}

// acknowledged records a stream's acknowledgement: its URIs are acknowledged or not.
func (l *ListenSet) acknowledged(id string, n mcp.NotificationSubscriptions) {
	l.mu.Lock()
	st := l.ids[id]
	if st == nil || st.closing || st.acked {
		l.mu.Unlock()
		return
	}
	st.acked = true
	if st.timer != nil {
		st.timer.Stop()
	}
	in := make(map[string]bool, len(n.ResourceSubscriptions))
	for _, u := range n.ResourceSubscriptions {
		in[u] = true
	}
	st.ackedURIs = in
	var notes []stateNote
	for _, u := range st.uris {
		e := l.entries[u]
		if e == nil || e.stream != st {
			continue
		}
		state := WatchNotAcknowledged
		if in[u] {
			state = WatchAcknowledged
		}
		notes = append(notes, l.decideLocked(u, e, state, nil))
	}
	// A stream that watches none of its URIs is of no use: cancel it (its URIs poll).
	var cancel string
	if !st.control && !slices.ContainsFunc(notes, func(n stateNote) bool { return n.state == WatchAcknowledged }) {
		st.closing = true
		l.dropLocked(st)
		cancel = st.token
	}
	cs := l.cs
	l.mu.Unlock()
	l.tell(notes)
	if cancel != "" {
		_ = cs.Unsubscribe(context.Background(), &mcp.UnsubscribeParams{URI: cancel})
	}
}

// ended records the end of the stream with token (or, when token is "", the one with ID id).
// serverRefused is set for a JSON-RPC error answered by the server; err is nil for a
// complete result.
func (l *ListenSet) ended(token, id string, err error, serverRefused bool) {
	l.mu.Lock()
	st := l.tokens[token]
	if st == nil && id != "" {
		st = l.ids[id]
	}
	if st == nil || st.closing || st.ended {
		if st != nil {
			st.ended = true
		}
		l.mu.Unlock()
		return
	}
	st.ended = true
	l.dropLocked(st)
	var uris []string
	var notes []stateNote
	for _, u := range st.uris {
		if e := l.entries[u]; e != nil && e.stream == st {
			uris = append(uris, u)
		}
	}
	if serverRefused && !st.acked && len(uris) > 1 && !l.closed {
		// Servers refuse a whole listen when they refuse one of its URIs (the go-sdk's and
		// mcp-go's acknowledgements are all-or-nothing on error): retry each URI on a stream
		// of its own, so that one refused URI fails only itself, not its whole batch.
		var singles []*listenStream
		for _, u := range uris {
			one := l.newStreamLocked([]string{u}, false)
			l.entries[u].stream = one
			singles = append(singles, one)
		}
		l.mu.Unlock()
		for _, one := range singles {
			go l.open(one)
		}
		return
	}
	if serverRefused && !st.acked {
		// The server refused the listen: a failed subscribe of every URI on it.
		for _, u := range uris {
			notes = append(notes, l.decideLocked(u, l.entries[u], WatchFailed, fmt.Errorf("subscriptions/listen refused: %w", err)))
		}
		l.mu.Unlock()
		l.tell(notes)
		return
	}
	if l.closed || (len(uris) == 0 && !st.control) {
		l.mu.Unlock()
		return
	}
	reason := "the stream ended without its complete result"
	switch {
	case err == nil:
		reason = "the server ended the stream (complete result)"
	case serverRefused:
		reason = "the server ended the stream with an error: " + err.Error()
	case err != nil:
		reason += ": " + err.Error()
	}
	next := l.newStreamLocked(uris, st.control)
	next.attempt = st.attempt + 1
	if st.acked && time.Since(st.opened) >= stableListen {
		next.attempt = 1 // it had been watching for a while: start the backoff over
	}
	for _, u := range uris {
		e := l.entries[u]
		e.stream = next
		if e.told {
			// Decided before: pending again until the re-opened stream is acknowledged. A
			// Watch from now on waits for that decision, so that a subscription
			// re-establishing after this epoch reads only once the stream watches again.
			e.state, e.told, e.redecide = WatchPending, false, true
			e.decided = make(chan struct{})
		}
	}
	if st.control {
		l.control = next
	}
	delay := l.backoff(next.attempt)
	l.mu.Unlock()
	if l.opts.OnEpoch != nil {
		l.opts.OnEpoch(ListenEpoch{URIs: uris, Control: st.control, Reason: reason})
	}
	time.AfterFunc(delay, func() { l.open(next) })
}

// stableListen is how long a stream must have lived for its end to restart the backoff (a
// server that acknowledges and then ends every stream at once is re-listened ever slower).
const stableListen = time.Minute

// backoff is the re-listen delay after attempt unexpected ends in a row: BackoffMin doubled
// per attempt, capped at BackoffMax, jittered down by up to half.
func (l *ListenSet) backoff(attempt int) time.Duration {
	d := l.opts.BackoffMin
	for i := 1; i < attempt && d < l.opts.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, l.opts.BackoffMax)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// metaID is the raw JSON of the subscription ID in a _meta, or "".
func metaID(m mcp.Meta) string {
	v, ok := m[mcp.MetaKeySubscriptionID]
	if !ok {
		return ""
	}
	return rawID(v)
}

// rawID renders a JSON-RPC ID (as decoded from JSON or as jsonrpc.ID.Raw) as its JSON text,
// so that 7, 7.0 and int64(7) compare equal.
func rawID(v any) string {
	switch x := v.(type) {
	case float64:
		if x == float64(int64(x)) {
			return strconv.FormatInt(int64(x), 10)
		}
	case int64:
		return strconv.FormatInt(x, 10)
	case json.Number:
		return x.String()
	case json.RawMessage:
		return strings.TrimSpace(string(x))
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// listenRequest is the part of an outgoing JSON-RPC message the taps read.
type listenRequest struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		Meta map[string]any `json:"_meta"`
	} `json:"params"`
}

// WrapHTTPClient returns an HTTP client for a StreamableClientTransport that taps the
// ListenSet's listen POSTs (base nil: http.DefaultTransport): it pairs each with its JSON-RPC
// ID and reads the SSE response along with the go-sdk to see how the stream ends.
func (l *ListenSet) WrapHTTPClient(base *http.Client) *http.Client {
	c := &http.Client{}
	if base != nil {
		*c = *base
	}
	rt := c.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	c.Transport = &listenTap{l: l, next: rt}
	return c
}

type listenTap struct {
	l    *ListenSet
	next http.RoundTripper
}

func (t *listenTap) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || req.GetBody == nil || discovery.LegacyRequest(req.Header) {
		return t.next.RoundTrip(req)
	}
	body, err := req.GetBody()
	if err != nil {
		return t.next.RoundTrip(req)
	}
	data, err := io.ReadAll(io.LimitReader(body, 1<<22))
	_ = body.Close()
	if err != nil {
		return t.next.RoundTrip(req)
	}
	if stamped, ok := stampNotificationVersion(req.Header, data); ok {
		return t.next.RoundTrip(withBody(req, stamped))
	}
	if !bytes.Contains(data, []byte(methodListen)) {
		return t.next.RoundTrip(req)
	}
	var msg listenRequest
	if json.Unmarshal(data, &msg) != nil || msg.Method != methodListen {
		return t.next.RoundTrip(req)
	}
	token, _ := msg.Params.Meta[listenTokenMeta].(string)
	if token == "" {
		return t.next.RoundTrip(req)
	}
	id := rawID(msg.ID)
	// The ListenSet may cancel the request (no acknowledgement in time), headers not yet
	// received included. Only the go-sdk's own context says the client gave the listen up:
	// the derived one is also cancelled when the go-sdk closes the body after a transport
	// drop, which is an end the ListenSet must see.
	sdkCtx := req.Context()
	ctx, cancel := context.WithCancel(sdkCtx)
	req = req.WithContext(ctx)
	t.l.sent(token, id, cancel)
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		if sdkCtx.Err() == nil {
			t.l.ended(token, id, err, false)
		}
		cancel()
		return resp, err
	}
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		t.l.ended(token, id, fmt.Errorf("HTTP %s", resp.Status), resp.StatusCode < 500)
		resp.Body = &tapBody{ReadCloser: resp.Body, r: resp.Body, cancel: cancel}
		return resp, nil
	}
	pr, pw := io.Pipe()
	tee := io.TeeReader(resp.Body, pw)
	resp.Body = &tapBody{ReadCloser: resp.Body, r: tee, pw: pw, cancel: cancel}
	go t.watch(sdkCtx, token, id, pr)
	return resp, nil
}

// tapBody hands the go-sdk the response body while a copy goes to the tap's reader.
type tapBody struct {
	io.ReadCloser
	r      io.Reader
	pw     *io.PipeWriter // nil: no reader beside the go-sdk
	cancel context.CancelFunc
}

func (b *tapBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && b.pw != nil {
		_ = b.pw.CloseWithError(err)
	}
	return n, err
}

func (b *tapBody) Close() error {
	if b.pw != nil {
		_ = b.pw.CloseWithError(io.ErrClosedPipe)
	}
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// tapEndHook, if set (tests), runs when a tap's reader has seen its stream's body end,
// before it decides how the stream ended.
var tapEndHook func()

// watch reads a listen's SSE events until the stream ends, and reports the end: a response
// with the listen's ID (complete, or the server's error), or none (an unexpected end). ctx is
// the go-sdk's context of the request: cancelled, the client gave the listen up.
func (t *listenTap) watch(ctx context.Context, token, id string, r *io.PipeReader) {
	defer func() { _, _ = io.Copy(io.Discard, r) }()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), 16<<20)
	var data bytes.Buffer
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if done := t.event(token, id, data.Bytes()); done {
				return
			}
			data.Reset()
			continue
		}
		if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.Write(bytes.TrimPrefix(v, []byte(" ")))
		}
	}
	if t.event(token, id, data.Bytes()) {
		return
	}
	if tapEndHook != nil {
		tapEndHook()
	}
	if ctx.Err() != nil {
		return // cancelled by the client
	}
	err := sc.Err()
	if err == nil {
		err = io.EOF
	}
	t.l.ended(token, id, fmt.Errorf("listen stream: %w", err), false)
}

// event inspects one SSE event's data; it reports true when it is the listen's response.
func (t *listenTap) event(token, id string, data []byte) bool {
	if len(data) == 0 {
		return false
	}
	if bytes.Contains(data, []byte(methodAck)) {
		t.l.ackMessage(data)
		return false
	}
	if !bytes.Contains(data, []byte(`"id"`)) {
		return false
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *jsonrpc.Error  `json:"error"`
	}
	if json.Unmarshal(data, &msg) != nil || len(msg.ID) == 0 || rawID(msg.ID) != id || (msg.Result == nil && msg.Error == nil) {
		return false
	}
	if msg.Error != nil {
		t.l.ended(token, id, msg.Error, true)
	} else {
		t.l.ended(token, id, nil, false)
	}
	return true
}

// ackMessage records the acknowledgement in a JSON-RPC notification's text.
func (l *ListenSet) ackMessage(data []byte) {
	var msg struct {
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if json.Unmarshal(data, &msg) == nil && msg.Method == methodAck {
		l.ackParams(msg.Params)
	}
}

// ackParams records the acknowledgement with these params.
func (l *ListenSet) ackParams(params json.RawMessage) {
	var p mcp.SubscriptionsAcknowledgedParams
	if json.Unmarshal(params, &p) == nil {
		l.acknowledged(metaID(p.Meta), p.Notifications)
	}
}

// WrapTransport returns t with a Connection that taps the ListenSet's listens, for stdio and
// in-memory transports (for streamable HTTP use WrapHTTPClient: its connection has methods a
// wrapper cannot pass on). It sees each listen request and the response that ends it.
func (l *ListenSet) WrapTransport(t mcp.Transport) mcp.Transport {
	return &tapTransport{l: l, t: t}
}

type tapTransport struct {
	l *ListenSet
	t mcp.Transport
}

func (t *tapTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &tapConn{Connection: c, l: t.l}, nil
}

type tapConn struct {
	mcp.Connection
	l *ListenSet
}

func (c *tapConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == methodListen && req.IsCall() {
		var p struct {
			Meta map[string]any `json:"_meta"`
		}
		if json.Unmarshal(req.Params, &p) == nil {
			if token, _ := p.Meta[listenTokenMeta].(string); token != "" {
				c.l.sent(token, rawID(req.ID.Raw()), nil)
			}
		}
	}
	return c.Connection.Write(ctx, msg)
}

func (c *tapConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil && req.Method == methodAck {
		c.l.ackParams(req.Params)
	}
	if resp, ok := msg.(*jsonrpc.Response); ok && err == nil && resp.ID.IsValid() {
		id := rawID(resp.ID.Raw())
		if c.l.current(id) {
			_, refused := errors.AsType[*jsonrpc.Error](resp.Error)
			c.l.ended("", id, resp.Error, resp.Error != nil && refused)
		}
	}
	return msg, err
}
