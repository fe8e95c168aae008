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
	"math/rand/v2"
	"os"
	"os/exec"
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
	// KeepAlive is the ping interval that detects a dead HTTP peer (default 2 s).
	KeepAlive time.Duration
	// Transport builds the transport of a source; nil means stdio child process or
	// streamable HTTP as the source says.
	Transport func(ctx context.Context, src ledger.Source) (mcp.Transport, error)
}

// Host maintains the sessions of the sources it holds.
type Host struct {
	opts Options
	log  *zap.Logger

	mu      sync.Mutex
	conns   map[int64]*Conn
	running map[int64]context.CancelFunc
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
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Transport == nil {
		opts.Transport = DefaultTransport
	}
	return &Host{
		opts: opts, log: opts.Logger.Named("mcphost"),
		conns: map[int64]*Conn{}, running: map[int64]context.CancelFunc{}, changed: make(chan struct{}),
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
				cancel()
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
		sctx, cancel := context.WithCancel(ctx)
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
			cancel()
			delete(h.running, id)
		}
	}
}

// maintain connects a source, records each connection as a new generation and reconnects
// with jittered backoff until ctx ends.
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
		reason, err := h.session(ctx, src, log)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			log.Warn("session failed", zap.Error(err), zap.Int("failures", failures))
		} else {
			failures = 0
			log.Info("session ended; reconnecting", zap.String("reason", reason))
		}
		d := h.opts.ReconnectMin << min(failures, 10)
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

// session runs one connection from connect to end.
func (h *Host) session(ctx context.Context, src ledger.Source, log *zap.Logger) (string, error) {
	tr, err := h.opts.Transport(ctx, src)
	if err != nil {
		return "", fmt.Errorf("transport: %w", err)
	}
	c := &Conn{source: src, notes: make(chan notification, 4096), host: h}
	client := mcp.NewClient(&mcp.Implementation{Name: "mcpsync", Version: "0.1.0"}, &mcp.ClientOptions{
		Capabilities:               &mcp.ClientCapabilities{},
		ResourceUpdatedHandler:     c.onUpdated,
		ResourceListChangedHandler: c.onListChanged,
		KeepAlive:                  h.opts.KeepAlive,
		KeepAliveFailureThreshold:  2,
	})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
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
		cs.Close()
		return "", fmt.Errorf("open session: %w", err)
	}
	c.gen = sess.Generation
	log = log.With(zap.Int64("generation", c.gen))
	log.Info("session open", zap.String("protocol", c.caps.ProtocolVersion),
		zap.Bool("subscribe", c.caps.Subscribe), zap.Bool("listChanged", c.caps.ListChanged),
		zap.String("server", c.caps.ServerName+" "+c.caps.ServerVersion))
	h.setConn(src.ID, c)
	routed := make(chan struct{})
	go func() {
		defer close(routed)
		c.route(log)
	}()
	for _, sub := range live {
		if err := h.opts.Signaler.SignalWorkflow(ctx, sub.WorkflowID, "", contract.SignalSessionChanged,
			contract.SessionChanged{Generation: c.gen}); err != nil {
			log.Debug("session-changed signal not delivered", zap.String("workflow", sub.WorkflowID), zap.Error(err))
		}
	}
	done := make(chan error, 1)
	go func() { done <- cs.Wait() }()
	reason := "connection closed"
	select {
	case <-ctx.Done():
		reason = "host stopping"
		cs.Close()
		<-done
	case err := <-done:
		if err != nil {
			reason = "connection closed: " + err.Error()
		}
	}
	h.clearConn(src.ID, c)
	close(c.notes)
	<-routed
	ectx, ecancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer ecancel()
	if err := h.opts.Store.EndSession(ectx, src.ID, c.gen, reason); err != nil {
		log.Warn("recording session end failed", zap.Error(err))
	}
	return reason, nil
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
	seq    atomic.Int64
	notes  chan notification
	// listChanged counts notifications/resources/list_changed received on this session.
	listChanged atomic.Int64

	mu sync.Mutex
	// holders maps a server URI to the subscriptions holding its server-side subscription.
	holders map[string]map[int64]bool
}

type notification struct {
	seq       int64
	serverURI string
}

// Session returns the MCP client session.
func (c *Conn) Session() *mcp.ClientSession { return c.cs }

// Generation returns the session generation.
func (c *Conn) Generation() int64 { return c.gen }

// Caps returns the capability receipt.
func (c *Conn) Caps() ledger.CapabilityReceipt { return c.caps }

// Source returns the source this session belongs to.
func (c *Conn) Source() ledger.Source { return c.source }

// ListChangedCount returns how many list_changed notifications this session has received.
func (c *Conn) ListChangedCount() int64 { return c.listChanged.Load() }

func (c *Conn) onUpdated(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	if req == nil || req.Params == nil {
		return
	}
	// Stamped in arrival order; the router keeps that order.
	n := notification{seq: c.seq.Add(1), serverURI: req.Params.URI}
	defer func() { recover() }() // the channel closes when the session ends
	c.notes <- n
}

func (c *Conn) onListChanged(context.Context, *mcp.ResourceListChangedRequest) {
	c.listChanged.Add(1)
}

// route records each notification in the ledger and signals the subscriptions it matches.
func (c *Conn) route(log *zap.Logger) {
	store, sig := c.host.opts.Store, c.host.opts.Signaler
	for n := range c.notes {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		norm, err := uri.Normalize(n.serverURI)
		if err != nil {
			if _, aerr := store.AuditMalformedNotification(ctx, c.source.ID, c.gen, n.seq, n.serverURI, err.Error()); aerr != nil {
				log.Warn("auditing malformed notification failed", zap.Error(aerr))
			}
			cancel()
			continue
		}
		targets, audit, err := store.RecordNotification(ctx, ledger.Notification{
			SourceID: c.source.ID, SessionGeneration: c.gen, Seq: n.seq, URI: norm, ServerURI: n.serverURI,
		})
		if err != nil {
			log.Warn("recording notification failed", zap.String("uri", n.serverURI), zap.Error(err))
		} else if audit != "" {
			log.Debug("notification audited", zap.String("uri", n.serverURI), zap.String("audit", audit))
		}
		for _, t := range targets {
			if err := sig.SignalWorkflow(ctx, t.WorkflowID, "", contract.SignalResourceUpdated, contract.ResourceUpdated{
				SessionGeneration: c.gen, Seq: n.seq, ServerURI: n.serverURI,
			}); err != nil {
				log.Warn("signalling subscription failed", zap.String("workflow", t.WorkflowID), zap.Error(err))
			}
		}
		cancel()
	}
}

// Subscribe makes sure the server-side subscription of serverURI exists on this session and
// records subscriptionID as one of its holders. Only the first holder sends
// resources/subscribe.
func (c *Conn) Subscribe(ctx context.Context, serverURI string, subscriptionID int64) error {
	c.mu.Lock()
	if c.holders == nil {
		c.holders = map[string]map[int64]bool{}
	}
	hs := c.holders[serverURI]
	if len(hs) > 0 {
		hs[subscriptionID] = true
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if err := c.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: serverURI}); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holders[serverURI] == nil {
		c.holders[serverURI] = map[int64]bool{}
	}
	c.holders[serverURI][subscriptionID] = true
	return nil
}

// Unsubscribe releases subscriptionID's hold on serverURI. The last holder sends
// resources/unsubscribe (sent=true) and stays a holder until the server acknowledges, so that
// a retry after a lost acknowledgement sends again (R20). Others only drop their hold.
func (c *Conn) Unsubscribe(ctx context.Context, serverURI string, subscriptionID int64) (sent bool, err error) {
	c.mu.Lock()
	hs := c.holders[serverURI]
	if !hs[subscriptionID] {
		c.mu.Unlock()
		return false, nil
	}
	if len(hs) > 1 {
		delete(hs, subscriptionID)
		c.mu.Unlock()
		return false, nil
	}
	c.mu.Unlock()
	if err := c.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: serverURI}); err != nil {
		return true, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.holders[serverURI], subscriptionID)
	return true, nil
}

// DefaultTransport starts a stdio source as a child process (stderr passed through, killed
// with its parent) or connects a streamable HTTP source with few reconnect retries and
// keep-alive, so a dead peer is noticed within seconds.
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
