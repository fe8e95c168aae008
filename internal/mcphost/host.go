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
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// ProtocolVersion is the legacy MCP revision (2025-11-25): what a capability receipt says when
// a session reports none. Which revision a session speaks is per source (--protocol, era.go).
const ProtocolVersion = mcpsync.ProtocolVersion20251125

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
	Store *ledger.Store
	// Signaler delivers signals; when it also implements Updater (a Temporal client does),
	// notifications go as workflow updates unless Delivery says otherwise.
	Signaler Signaler
	// Delivery is how notifications reach their subscriptions' workflows (deliver.go); the zero
	// value, DeliverUpdate, sends workflow updates.
	Delivery Delivery
	// Queue is this worker's host task queue; it names the lease holder in the ledger.
	Queue  string
	Logger *zap.Logger
	// Lease is how long a claimed source stays ours without renewal (default 15 s);
	// ClaimInterval is how often leases are renewed, sources claimed and shed to spread them
	// fairly across the live hosts (default 2 s).
	Lease         time.Duration
	ClaimInterval time.Duration
	// RenewGrace is how long the host keeps its sessions when no lease round succeeds (the
	// ledger is unreachable), counted from the start of the last successful round on the
	// local monotonic clock; then it closes every session, before the leases can expire and
	// another host open the sources (issue 12, defect 6). Default and upper bound: Lease/2,
	// leaving the other half of the lease for the sessions to close. It should be several
	// ClaimIntervals.
	RenewGrace time.Duration
	// ReconnectMin and ReconnectMax bound the jittered reconnect backoff (default 200 ms, 10 s).
	ReconnectMin, ReconnectMax time.Duration
	// KeepAlive is the ping interval that detects a peer that stopped answering (default
	// 2 s); two missed pings, each waited for KeepAlive/2, end the session.
	KeepAlive time.Duration
	// ConnectTimeout bounds connecting and initializing a session (default 30 s).
	ConnectTimeout time.Duration
	// ListenAckTimeout bounds the wait for a 2026-07-28 subscriptions/listen stream's
	// acknowledgement (default 10 s): its URIs are then a failed subscribe (issue 13 item 3).
	ListenAckTimeout time.Duration
	// Transport builds the transport of a source; nil means stdio child process or
	// streamable HTTP as the source says.
	Transport func(ctx context.Context, src ledger.Source) (mcp.Transport, error)
	// SourceEvents, if set, is told of every new session of a source and of list_changed
	// notifications on it (the worker signals the source's SourceWorkflow). Calls for one
	// session are sequential, outside the MCP client's handlers; list_changed notifications
	// that arrive while a call runs are coalesced into one call.
	SourceEvents func(ctx context.Context, ev SourceEvent)
	// OnHealth, if set, is told of every health report of a source this host holds, as it is
	// made (before the ledger write), and of the host letting the source go (an empty State);
	// the worker's metrics count sessions by state and reconnects with it (issue 17). It must
	// not block.
	OnHealth func(sourceID int64, r ledger.HealthReport)
}

// Host maintains the sessions of the sources it holds.
type Host struct {
	opts Options
	log  *zap.Logger

	mu      sync.Mutex
	conns   map[int64]*Conn
	running map[int64]*runner
	wg      sync.WaitGroup
	// renewedAt is when the last successful lease round started (monotonic); watchdog
	// drops every session RenewGrace after it (checkRenewal); stopped disarms it.
	renewedAt time.Time
	watchdog  *time.Timer
	stopped   bool
	// changed is closed and replaced whenever a session opens or ends, for waiters.
	changed chan struct{}
	// graceOver ends ShutdownDeliveryGrace after Run began to stop: the notification updates
	// still in flight then are abandoned (endGrace), not waited for up to their deadline.
	graceOver context.Context
	endGrace  context.CancelFunc
}

// ShutdownDeliveryGrace bounds how long a stopping host waits for the notification updates
// in flight: the worker of this process may have stopped already, so nothing accepts them
// here. One abandoned loses nothing: its notification is in the ledger, and the next session
// generation re-reads every subscription (R12).
const ShutdownDeliveryGrace = 5 * time.Second

// New returns a Host; call Run to start it.
func New(opts Options) *Host {
	if opts.Lease == 0 {
		opts.Lease = 15 * time.Second
	}
	if opts.ClaimInterval == 0 {
		opts.ClaimInterval = 2 * time.Second
	}
	if opts.RenewGrace <= 0 || opts.RenewGrace > opts.Lease/2 {
		opts.RenewGrace = opts.Lease / 2
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
	h := &Host{
		opts: opts, log: opts.Logger.Named("mcphost"),
		conns: map[int64]*Conn{}, running: map[int64]*runner{}, changed: make(chan struct{}),
	}
	h.graceOver, h.endGrace = context.WithCancel(context.Background())
	return h
}

// Queue returns the host's task queue.
func (h *Host) Queue() string { return h.opts.Queue }

// Run claims sources every ClaimInterval and keeps their sessions alive until ctx ends (see
// leases.go for the lease rules); then it closes every session, records their end, releases
// the leases and retires the host's heartbeat.
func (h *Host) Run(ctx context.Context) error {
	if h.opts.ClaimInterval >= h.opts.RenewGrace {
		h.log.Warn("the claim interval is not shorter than the renewal grace: sessions will be dropped between rounds",
			zap.Duration("claimInterval", h.opts.ClaimInterval), zap.Duration("renewGrace", h.opts.RenewGrace))
	}
	tick := time.NewTicker(h.opts.ClaimInterval)
	defer tick.Stop()
	for {
		h.claim(ctx)
		select {
		case <-ctx.Done():
			grace := time.AfterFunc(ShutdownDeliveryGrace, h.endGrace)
			defer grace.Stop()
			defer h.endGrace()
			h.mu.Lock()
			h.stopped = true
			if h.watchdog != nil {
				h.watchdog.Stop()
			}
			for _, r := range h.running {
				h.stopLocked(r, errHostStopping)
			}
			h.mu.Unlock()
			h.wg.Wait()
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := h.opts.Store.RetireHost(rctx, h.opts.Queue); err != nil {
				h.log.Warn("retiring the host's heartbeat failed", zap.Error(err))
			}
			return nil
		case <-tick.C:
		}
	}
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
