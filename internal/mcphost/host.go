// Package mcphost is the session host that runs inside each worker. It keeps one live MCP
// client session per source it holds the lease of, gives every (re)connection a new session
// generation from the ledger with its capability receipt (R1, R9, R12), stamps every
// notifications/resources/updated with a per-session sequence number, normalizes its URI and
// signals the matching subscription workflows; notifications that match nothing live are
// audited in the ledger, never dropped silently. Session-bound activities reach the live
// session through Conn, which refuses a stale generation with ErrStaleSession.
package mcphost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// ProtocolVersion is the MCP protocol version every session is pinned to. Under 2026-07-28
// the go-sdk makes subscribe fire-and-forget and may serve reads from a cache; 2025-11-25
// keeps subscribe acknowledged and every read a real resources/read.
const ProtocolVersion = "2025-11-25"

// SnapshotCapability is the experimental server capability that negotiates the snapshot-ID
// extension (R5): a server that declares it puts a snapshot ID in each list result's _meta.
const SnapshotCapability = "mcpsync/snapshot"

// ErrStaleSession is returned for a call that carries a session generation this host does not
// hold (the session ended, was replaced, or lives on another worker).
var ErrStaleSession = errors.New("mcphost: stale session")

// Signaler delivers signals to workflows; a Temporal client satisfies it.
type Signaler interface {
	SignalWorkflow(ctx context.Context, workflowID, runID, signalName string, arg any) error
}

// Options configure a Host.
type Options struct {
	Store    *ledger.Store
	Signaler Signaler
	// Queue is this worker's host task queue; it names the lease holder in the ledger.
	Queue  string
	Logger *zap.Logger
	// Lease is how long a claimed source stays ours without renewal (default 15 s);
	// ClaimInterval is how often leases are renewed and new sources claimed (default 2 s).
	Lease         time.Duration
	ClaimInterval time.Duration
	// ReconnectMin and ReconnectMax bound the jittered reconnect backoff (default 200 ms, 10 s).
	ReconnectMin, ReconnectMax time.Duration
	// KeepAlive is the ping interval that detects a peer that stopped answering (default
	// 2 s); two missed pings, each waited for KeepAlive/2, end the session.
	KeepAlive time.Duration
	// ConnectTimeout bounds connecting and initializing a session (default 30 s).
	ConnectTimeout time.Duration
	// Transport builds the transport of a source; nil means stdio child process or
	// streamable HTTP as the source says.
	Transport func(ctx context.Context, src ledger.Source) (mcp.Transport, error)
	// SourceEvents, if set, is told of every new session of a source and of list_changed
	// notifications on it (the worker signals the source's SourceWorkflow). Calls for one
	// session are sequential, outside the MCP client's handlers; list_changed notifications
	// that arrive while a call runs are coalesced into one call.
	SourceEvents func(ctx context.Context, ev SourceEvent)
}

// Host maintains the sessions of the sources it holds.
type Host struct {
	opts Options
	log  *zap.Logger

	mu      sync.Mutex
	conns   map[int64]*Conn
	running map[int64]context.CancelCauseFunc
	wg      sync.WaitGroup
	// changed is closed and replaced whenever a session opens or ends, for waiters.
	changed chan struct{}
}

// New returns a Host; call Run to start it.
func New(opts Options) *Host {
	if opts.Lease == 0 {
		opts.Lease = 15 * time.Second
	}
	if opts.ClaimInterval == 0 {
		opts.ClaimInterval = 2 * time.Second
	}
	if opts.ReconnectMin == 0 {
		opts.ReconnectMin = 200 * time.Millisecond
	}
	if opts.ReconnectMax == 0 {
		opts.ReconnectMax = 10 * time.Second
	}
	if opts.KeepAlive == 0 {
		opts.KeepAlive = 2 * time.Second
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = 30 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Transport == nil {
		opts.Transport = DefaultTransport
	}
	return &Host{
		opts: opts, log: opts.Logger.Named("mcphost"),
		conns: map[int64]*Conn{}, running: map[int64]context.CancelCauseFunc{}, changed: make(chan struct{}),
	}
}

// Queue returns the host's task queue.
func (h *Host) Queue() string { return h.opts.Queue }

// Run claims sources and keeps their sessions alive until ctx ends; then it closes every
// session, records their end and releases the leases.
func (h *Host) Run(ctx context.Context) error {
	tick := time.NewTicker(h.opts.ClaimInterval)
	defer tick.Stop()
	for {
		h.claim(ctx)
		select {
		case <-ctx.Done():
			h.mu.Lock()
			for _, cancel := range h.running {
				cancel(errHostStopping)
			}
			h.mu.Unlock()
			h.wg.Wait()
			return nil
		case <-tick.C:
		}
	}
}

func (h *Host) claim(ctx context.Context) {
	held, err := h.opts.Store.ClaimSources(ctx, h.opts.Queue, h.opts.Lease)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("claiming sources failed", zap.Error(err))
		}
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[int64]bool{}
	for _, src := range held {
		seen[src.ID] = true
		if _, ok := h.running[src.ID]; ok {
			continue
		}
		sctx, cancel := context.WithCancelCause(ctx)
		h.running[src.ID] = cancel
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.maintain(sctx, src)
		}()
	}
	for id, cancel := range h.running {
		if !seen[id] {
			h.log.Warn("lease lost; dropping source", zap.Int64("source", id))
			cancel(errLeaseLost)
			delete(h.running, id)
		}
	}
}

// Causes of a session's context ending, recorded as the session's end reason.
var (
	errHostStopping = errors.New("host stopping")
	errLeaseLost    = errors.New("lease lost to another host")
)

// maintain connects a source, records each connection as a new generation and reconnects
// with jittered backoff until ctx ends. A session that ends before it lived ReconnectMax counts
// as a failure, so a server that dies right after initializing is not reconnected in a tight
// loop.
func (h *Host) maintain(ctx context.Context, src ledger.Source) {
	log := h.log.With(zap.String("source", src.Name))
	failures := 0
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := h.opts.Store.ReleaseSource(rctx, src.ID, h.opts.Queue); err != nil {
			log.Warn("releasing lease failed", zap.Error(err))
		}
	}()
	for ctx.Err() == nil {
		started := time.Now()
		reason, err := h.session(ctx, src, log)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			failures++
			log.Warn("session failed", zap.Error(err), zap.Int("failures", failures))
		case time.Since(started) < h.opts.ReconnectMax:
			failures++
			log.Info("session ended early; reconnecting", zap.String("reason", reason), zap.Int("failures", failures))
		default:
			failures = 0
			log.Info("session ended; reconnecting", zap.String("reason", reason))
		}
		d := h.opts.ReconnectMin << min(max(failures-1, 0), 10)
		if d > h.opts.ReconnectMax || d <= 0 {
			d = h.opts.ReconnectMax
		}
		d = d/2 + rand.N(d/2+1) // jitter
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// session runs one connection from connect to end: it connects, records the new generation
// and its capability receipt, tells every live subscription of the source that the session
// changed, routes notifications until the connection ends, and records the end.
func (h *Host) session(ctx context.Context, src ledger.Source, log *zap.Logger) (string, error) {
	tr, err := h.opts.Transport(ctx, src)
	if err != nil {
		return "", fmt.Errorf("transport: %w", err)
	}
	c := &Conn{source: src, host: h, wake: make(chan struct{}, 1), uris: map[string]*uriSubscription{}}
	client := mcp.NewClient(&mcp.Implementation{Name: "mcpsync", Version: "0.1.0"}, &mcp.ClientOptions{
		Capabilities:               &mcp.ClientCapabilities{},
		ResourceUpdatedHandler:     c.onUpdated,
		ResourceListChangedHandler: c.onListChanged,
		KeepAlive:                  h.opts.KeepAlive,
		KeepAliveFailureThreshold:  2,
	})
	cctx, cancel := context.WithTimeout(ctx, h.opts.ConnectTimeout)
	cs, err := client.Connect(cctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	cancel()
	if err != nil {
		return "", fmt.Errorf("connect: %w", err)
	}
	c.cs = cs
	c.caps = receipt(cs)
	if !c.caps.Resources {
		log.Warn("server does not declare the resources capability", zap.String("server", c.caps.ServerName))
	}
	sess, live, err := h.opts.Store.OpenSession(ctx, src.ID, h.opts.Queue, c.caps)
	if err != nil {
		_ = cs.Close()
		return "", fmt.Errorf("open session: %w", err)
	}
	c.gen = sess.Generation
	log = log.With(zap.Int64("generation", c.gen))
	log.Info("session open", zap.String("protocol", c.caps.ProtocolVersion),
		zap.Bool("subscribe", c.caps.Subscribe), zap.Bool("listChanged", c.caps.ListChanged),
		zap.String("server", c.caps.ServerName+" "+c.caps.ServerVersion))
	h.setConn(src.ID, c)
	h.startSourceEvents(ctx, c)
	routed := make(chan struct{})
	stopRouting := make(chan struct{})
	go func() {
		defer close(routed)
		c.route(stopRouting, log)
	}()
	// Signalled in the background, so that a slow Temporal never delays noticing the end.
	h.wg.Go(func() { h.signalSessionChanged(ctx, c.gen, live, log) })
	done := make(chan error, 1)
	go func() { done <- cs.Wait() }()
	reason := "connection closed"
	select {
	case <-ctx.Done():
		reason = "host stopping"
		if cause := context.Cause(ctx); cause != nil && cause != context.Canceled {
			reason = cause.Error()
		}
		_ = cs.Close()
		<-done
	case err := <-done:
		if err != nil {
			reason = "connection closed: " + err.Error()
		}
		// Release the transport: reaps a dead stdio child, ends the keep-alive.
		_ = cs.Close()
	}
	h.clearConn(src.ID, c)
	h.stopSourceEvents(c)
	// Route what arrived before the end under this generation, then record the end.
	close(stopRouting)
	<-routed
	ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer ecancel()
	if err := h.opts.Store.EndSession(ectx, src.ID, c.gen, reason); err != nil {
		log.Warn("recording session end failed", zap.Error(err))
	}
	return reason, nil
}

// signalParallelism bounds the concurrent SessionChanged signals of one new session.
const signalParallelism = 8

// signalSessionChanged tells every live subscription of the source that its session changed
// to generation gen (R12). A signal that cannot be delivered is retried a few times; the
// subscription is fenced in the ledger anyway, so its next read is refused and it
// re-establishes itself.
func (h *Host) signalSessionChanged(ctx context.Context, gen int64, live []ledger.LiveSubscription, log *zap.Logger) {
	work := make(chan ledger.LiveSubscription)
	var wg sync.WaitGroup
	for range min(signalParallelism, len(live)) {
		wg.Go(func() {
			for sub := range work {
				err := retry(ctx, func(ctx context.Context) error {
					return h.opts.Signaler.SignalWorkflow(ctx, sub.WorkflowID, "", contract.SignalSessionChanged,
						contract.SessionChanged{Generation: gen})
				})
				if err != nil {
					log.Warn("session-changed signal not delivered", zap.String("workflow", sub.WorkflowID), zap.Error(err))
				}
			}
		})
	}
	for _, sub := range live {
		work <- sub
	}
	close(work)
	wg.Wait()
}

// retry runs f up to three times with a short backoff, each attempt bounded by 10 s.
func retry(ctx context.Context, f func(context.Context) error) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (after %d attempts; last error: %w)", ctx.Err(), attempt, err)
			case <-time.After(time.Duration(100<<attempt) * time.Millisecond):
			}
		}
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f(actx)
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

func receipt(cs *mcp.ClientSession) ledger.CapabilityReceipt {
	r := ledger.CapabilityReceipt{ProtocolVersion: ProtocolVersion}
	ir := cs.InitializeResult()
	if ir == nil {
		return r
	}
	r.ProtocolVersion = ir.ProtocolVersion
	if ir.ServerInfo != nil {
		r.ServerName, r.ServerVersion = ir.ServerInfo.Name, ir.ServerInfo.Version
	}
	if caps := ir.Capabilities; caps != nil {
		if caps.Resources != nil {
			r.Resources, r.Subscribe, r.ListChanged = true, caps.Resources.Subscribe, caps.Resources.ListChanged
		}
		_, r.SnapshotIDs = caps.Experimental[SnapshotCapability]
		r.Raw, _ = json.Marshal(caps)
	}
	return r
}

func (h *Host) setConn(sourceID int64, c *Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns[sourceID] = c
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *Host) clearConn(sourceID int64, c *Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conns[sourceID] == c {
		delete(h.conns, sourceID)
		close(h.changed)
		h.changed = make(chan struct{})
	}
}

// Conn returns the live session of a source if it has generation gen, or an error wrapping
// ErrStaleSession.
func (h *Host) Conn(sourceID, gen int64) (*Conn, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.conns[sourceID]
	if c == nil {
		return nil, fmt.Errorf("source %d has no session on host %s: %w", sourceID, h.opts.Queue, ErrStaleSession)
	}
	if c.gen != gen {
		return nil, fmt.Errorf("source %d: call for generation %d, live generation is %d: %w", sourceID, gen, c.gen, ErrStaleSession)
	}
	return c, nil
}

// Current returns the live session of a source, if any.
func (h *Host) Current(sourceID int64) (*Conn, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c, ok := h.conns[sourceID]
	return c, ok
}

// WaitSession blocks until the source has a live session with a generation above after, or
// ctx ends.
func (h *Host) WaitSession(ctx context.Context, sourceID, after int64) (*Conn, error) {
	for {
		h.mu.Lock()
		c, ch := h.conns[sourceID], h.changed
		h.mu.Unlock()
		if c != nil && c.gen > after {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-ch:
		}
	}
}

// Conn is one live MCP session of a source.
type Conn struct {
	host   *Host
	source ledger.Source
	cs     *mcp.ClientSession
	gen    int64
	caps   ledger.CapabilityReceipt
	// listChanged counts notifications/resources/list_changed received on this session.
	listChanged atomic.Int64
	events      atomic.Pointer[sourceEvents] // forwarder of Options.SourceEvents, if any

	// nmu guards the notification queue. Notifications are stamped with seq in arrival order
	// (the go-sdk calls the handler for one notification at a time) and queued without
	// blocking the connection; route drains the queue in order.
	nmu   sync.Mutex
	seq   int64
	queue []notification
	ended bool // route has finished: later arrivals are recorded by the handler itself
	wake  chan struct{}
	// lanes serialize record per lane: notifications of one normalized URI always take the
	// same lane, so their order is kept while different URIs are routed in parallel.
	lanes [routeLanes]sync.Mutex

	mu sync.Mutex
	// uris holds, per server URI, the server-side subscription of this session and the
	// subscriptions holding it.
	uris map[string]*uriSubscription
}

type notification struct {
	seq       int64
	serverURI string
	// receivedAt is when the (latest merged) notification arrived, on this host's clock.
	receivedAt time.Time
	// pulses is how many notifications of the same URI this one stands for (routeBatch
	// merges a burst of them into one signal).
	pulses int
}

// uriSubscription is the server-side subscription of one URI on one session. Its mutex
// serializes resources/subscribe and resources/unsubscribe of the URI, so that a subscribe
// can never be overtaken by the unsubscribe of the last previous holder.
type uriSubscription struct {
	mu      sync.Mutex
	holders map[int64]bool
	// confirmed: the server acknowledged resources/subscribe and no unsubscribe has been
	// sent since. After an unsubscribe whose acknowledgement was lost the server side is
	// unknown, so the next subscriber sends resources/subscribe again.
	confirmed bool
}

// Session returns the MCP client session, for session-bound calls; its lifetime belongs to
// the host (do not Close it).
func (c *Conn) Session() *mcp.ClientSession { return c.cs }

// Generation returns the session generation.
func (c *Conn) Generation() int64 { return c.gen }

// Caps returns the capability receipt.
func (c *Conn) Caps() ledger.CapabilityReceipt { return c.caps }

// Source returns the source this session belongs to.
func (c *Conn) Source() ledger.Source { return c.source }

// ListChangedCount returns how many list_changed notifications this session has received.
func (c *Conn) ListChangedCount() int64 { return c.listChanged.Load() }

// Holders returns the IDs of the subscriptions holding the server-side subscription of
// serverURI on this session, sorted.
func (c *Conn) Holders(serverURI string) []int64 {
	us := c.uriSub(serverURI, false)
	if us == nil {
		return nil
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	out := make([]int64, 0, len(us.holders))
	for id := range us.holders {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (c *Conn) onUpdated(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	if req == nil || req.Params == nil {
		return
	}
	c.nmu.Lock()
	c.seq++
	n := notification{seq: c.seq, serverURI: req.Params.URI, receivedAt: time.Now(), pulses: 1}
	if c.ended {
		c.nmu.Unlock()
		// The session is over and its router gone: record it here, still under its own
		// generation, so that the ledger audits it rather than it being lost.
		c.record(n, c.host.log)
		return
	}
	c.queue = append(c.queue, n)
	c.nmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Conn) onListChanged(context.Context, *mcp.ResourceListChangedRequest) {
	c.listChanged.Add(1)
	c.kickSourceEvents()
}

// route records the queued notifications in order until stop is closed and the queue is
// empty.
func (c *Conn) route(stop <-chan struct{}, log *zap.Logger) {
	for {
		c.nmu.Lock()
		batch := c.queue
		c.queue = nil
		stopping := false
		if len(batch) == 0 {
			select {
			case <-stop:
				stopping = true
				c.ended = true
			default:
			}
		}
		c.nmu.Unlock()
		if stopping {
			return
		}
		c.routeBatch(batch, log)
		if len(batch) == 0 {
			select {
			case <-c.wake:
			case <-stop:
			}
		}
	}
}

// routeLanes is how many notifications of different URIs a session routes at once.
const routeLanes = 8

// lane picks the routing lane of a notification by its normalized URI (its raw string when
// it does not parse), so that all notifications of one subscription share a lane.
func lane(norm, raw string) int {
	key := norm
	if key == "" {
		key = raw
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % routeLanes)
}

// routeBatch records a batch: each lane in order, the lanes in parallel. Notifications of the
// same server URI within the batch are merged into one (the newest sequence number and
// arrival time, and the count of pulses), so a burst of duplicates costs one ledger write and
// one signal per subscription (R13). It returns when the whole batch is recorded, so the next
// batch cannot overtake it.
func (c *Conn) routeBatch(batch []notification, log *zap.Logger) {
	if len(batch) == 1 {
		c.record(batch[0], log)
		return
	}
	var byLane [routeLanes][]notification
	type at struct{ lane, index int }
	merged := map[string]at{}
	for _, n := range batch {
		if p, ok := merged[n.serverURI]; ok {
			m := &byLane[p.lane][p.index]
			m.seq, m.receivedAt, m.pulses = n.seq, n.receivedAt, m.pulses+n.pulses
			continue
		}
		norm, _ := uri.Normalize(n.serverURI)
		i := lane(norm, n.serverURI)
		byLane[i] = append(byLane[i], n)
		merged[n.serverURI] = at{i, len(byLane[i]) - 1}
	}
	var wg sync.WaitGroup
	for _, ns := range byLane {
		if len(ns) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, n := range ns {
				c.record(n, log)
			}
		}()
	}
	wg.Wait()
}

// record normalizes a notification's URI, records it in the ledger and signals the
// subscriptions it matches. The ledger writes an audit receipt instead when it matches
// nothing live (old session, unknown URI, closed subscription, repeated sequence number).
func (c *Conn) record(n notification, log *zap.Logger) {
	norm, err := uri.Normalize(n.serverURI)
	mu := &c.lanes[lane(norm, n.serverURI)]
	mu.Lock()
	defer mu.Unlock()
	store, sig := c.host.opts.Store, c.host.opts.Signaler
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err != nil {
		if aerr := retry(ctx, func(ctx context.Context) error {
			_, err := store.AuditMalformedNotification(ctx, c.source.ID, c.gen, n.seq, n.serverURI, err.Error())
			return err
		}); aerr != nil {
			log.Warn("auditing malformed notification failed", zap.String("uri", n.serverURI), zap.Error(aerr))
		}
		return
	}
	var targets []ledger.NotificationTarget
	var audit string
	err = retry(ctx, func(ctx context.Context) error {
		var err error
		targets, audit, err = store.RecordNotification(ctx, ledger.Notification{
			SourceID: c.source.ID, SessionGeneration: c.gen, Seq: n.seq, URI: norm, ServerURI: n.serverURI,
		})
		return err
	})
	if err != nil {
		log.Warn("recording notification failed", zap.String("uri", n.serverURI), zap.Int64("seq", n.seq), zap.Error(err))
		return
	}
	if audit != "" {
		log.Debug("notification audited", zap.String("uri", n.serverURI), zap.String("audit", audit))
	}
	for _, t := range targets {
		if err := retry(ctx, func(ctx context.Context) error {
			return sig.SignalWorkflow(ctx, t.WorkflowID, "", contract.SignalResourceUpdated, contract.ResourceUpdated{
				SessionGeneration: c.gen, Seq: n.seq, ServerURI: n.serverURI, Pulses: n.pulses, ReceivedAt: n.receivedAt,
			})
		}); err != nil {
			log.Warn("signalling subscription failed", zap.String("workflow", t.WorkflowID), zap.Error(err))
		}
	}
}

// uriSub returns the server-side subscription record of serverURI, creating it if asked.
func (c *Conn) uriSub(serverURI string, create bool) *uriSubscription {
	c.mu.Lock()
	defer c.mu.Unlock()
	us := c.uris[serverURI]
	if us == nil && create {
		us = &uriSubscription{holders: map[int64]bool{}}
		c.uris[serverURI] = us
	}
	return us
}

// Subscribe makes sure the server-side subscription of serverURI exists on this session and
// records subscriptionID as one of its holders. Only a subscriber that finds no confirmed
// server-side subscription sends resources/subscribe; on error it does not become a holder.
func (c *Conn) Subscribe(ctx context.Context, serverURI string, subscriptionID int64) error {
	us := c.uriSub(serverURI, true)
	us.mu.Lock()
	defer us.mu.Unlock()
	if !us.confirmed {
		if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: serverURI}); err != nil {
			return fmt.Errorf("resources/subscribe %s: %w", serverURI, err)
		}
		us.confirmed = true
	}
	us.holders[subscriptionID] = true
	return nil
}

// Unsubscribe releases subscriptionID's hold on serverURI. The last holder sends
// resources/unsubscribe (sent=true) and stays a holder until the server acknowledges, so that
// a retry after a lost acknowledgement sends again (R20). Others only drop their hold; a
// subscription that holds nothing on this session sends nothing.
func (c *Conn) Unsubscribe(ctx context.Context, serverURI string, subscriptionID int64) (sent bool, err error) {
	us := c.uriSub(serverURI, false)
	if us == nil {
		return false, nil
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	if !us.holders[subscriptionID] {
		return false, nil
	}
	if len(us.holders) > 1 {
		delete(us.holders, subscriptionID)
		return false, nil
	}
	// Whatever the answer, the server side is no longer known to be subscribed.
	us.confirmed = false
	if err := c.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: serverURI}); err != nil {
		return true, fmt.Errorf("resources/unsubscribe %s: %w", serverURI, err)
	}
	delete(us.holders, subscriptionID)
	return true, nil
}

// DefaultTransport starts a stdio source as a child process (stderr passed through, killed
// with its parent) or connects a streamable HTTP source with a single reconnect retry of its
// event stream, so that a dead or restarted HTTP server ends the session within seconds (the
// go-sdk default of five retries takes ~17 s); keep-alive pings catch a peer that hangs.
func DefaultTransport(_ context.Context, src ledger.Source) (mcp.Transport, error) {
	switch src.Transport {
	case ledger.TransportStdio:
		if len(src.Command) == 0 {
			return nil, fmt.Errorf("source %q has no command", src.Name)
		}
		cmd := exec.Command(src.Command[0], src.Command[1:]...)
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return &mcp.CommandTransport{Command: cmd, TerminateDuration: 2 * time.Second}, nil
	case ledger.TransportHTTP:
		return &mcp.StreamableClientTransport{Endpoint: src.URL, MaxRetries: 1}, nil
	default:
		return nil, fmt.Errorf("source %q: unknown transport %q", src.Name, src.Transport)
	}
}
