package mcphost

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// Conn is one live MCP session of a source.
type Conn struct {
	host   *Host
	source ledger.Source
	cs     *mcp.ClientSession
	gen    int64
	caps   ledger.CapabilityReceipt
	// listChanged counts notifications/resources/list_changed received on this session.
	listChanged atomic.Int64
	// violations numbers the protocol violations audited on this session (auditProtocol).
	violations atomic.Int64
	events     atomic.Pointer[sourceEvents] // forwarder of Options.SourceEvents, if any

	// nmu guards the notification queue. Notifications are stamped with seq in arrival order
	// (the go-sdk calls the handler for one notification at a time) and queued without
	// blocking the connection; route drains the queue in order.
	nmu   sync.Mutex
	seq   int64
	queue []notification
	ended bool // route has finished: later arrivals are recorded by the handler itself
	wake  chan struct{}
	// overflow stands for the notifications that found the queue full (route.go).
	overflow queueOverflow
	// lanes serialize record per lane: notifications of one normalized URI always take the
	// same lane, so their order is kept while different URIs are routed in parallel.
	lanes [routeLanes]sync.Mutex

	// lastPulse holds, per normalized URI, when its latest notification arrived and how many
	// arrived in its current burst (guarded by nmu); AwaitQuiet reads it.
	lastPulse map[string]pulseRun

	// slots bounds the notification updates in flight (DefaultUpdatesInFlight, deliver.go);
	// deliveries counts them, and dclosed (under dmu) sends any later one synchronously once
	// route has waited for them.
	slots chan struct{}
	// slotWaits counts the deliveries waiting for a free slot.
	slotWaits  atomic.Int64
	dmu        sync.Mutex
	dclosed    bool
	deliveries sync.WaitGroup

	// smu guards signals: per normalized URI, when the last resources/read of it was sent on
	// this session and which subscriptions hold a signal no read has answered yet
	// (signalPending, route.go).
	smu     sync.Mutex
	signals map[string]*uriSignals

	// listen carries the resource subscriptions of a 2026-07-28 session on
	// subscriptions/listen streams (listenhost.go); nil on a 2025-11-25 session.
	listen *ListenSet
	// listenEpochs numbers the listen epochs of this session (SessionChanged.ListenEpoch);
	// staleSeq numbers its audited stale listen notifications.
	listenEpochs, staleSeq atomic.Int64

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

// Subscribe is Watch without its result: it makes sure the server-side subscription of
// serverURI exists on this session and records subscriptionID as one of its holders. Only a
// subscriber that finds no confirmed server-side subscription sends resources/subscribe; on
// error it does not become a holder.
func (c *Conn) Subscribe(ctx context.Context, serverURI string, subscriptionID int64) error {
	_, err := c.Watch(ctx, serverURI, subscriptionID)
	return err
}

// subscribeLegacy is Watch on a 2025-11-25 session: resources/subscribe.
func (c *Conn) subscribeLegacy(ctx context.Context, serverURI string, subscriptionID int64) error {
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
	if c.listen != nil {
		// 2026-07-28: the URI leaves the listen set; a stream left without URIs is cancelled
		// (its end is our own, no epoch).
		c.listen.Unwatch([]string{serverURI})
		delete(us.holders, subscriptionID)
		return true, nil
	}
	if err := c.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: serverURI}); err != nil {
		return true, fmt.Errorf("resources/unsubscribe %s: %w", serverURI, err)
	}
	delete(us.holders, subscriptionID)
	return true, nil
}

// Read quieting (R13, R27). A server may repeat one change's notification many times a few
// milliseconds apart; copies that arrive after a read was sent cannot be told from a new
// change, so each would cost a follow-up read. A read therefore waits until its URI has been
// quiet (at most readQuietMax): the copies then reach the host before the read is sent, and
// the workflow counts them as covered by it. The quiet period is readQuiet; once burstPulses
// notifications of the URI have arrived in a row, each within burstQuiet of the one before,
// the URI is in a burst and the read waits for burstQuiet of quiet instead: on a loaded
// machine (the server's, or ours) the copies of a burst reach the host with pauses far longer
// than the server's spacing, and a read sent in such a pause costs a follow-up read for the
// copies after it.
//
// The waits are paid in latency. On the local-read path a lone notification reaches its read
// within a few milliseconds, so readQuiet is most of a lone update's latency, and a read in a
// burst waits at least burstQuiet (the throughput bench prints both, as e2e-p50-lone and
// e2e-p99-burst). Two notifications of a URI close together are as often two changes of the
// resource as a change and its copy: at 150 changes/s over 1,000 resources, 3.7 % of the
// changes follow another change of their resource within burstQuiet, and with a burst begun
// at the second notification each of them waited burstQuiet, which set the p99 of every
// update above 250 ms. A storm of copies shows itself by the third notification: only a pause
// before it can still send a read early (one follow-up read for that change), while three
// independent changes in a row, each within burstQuiet, are rare (0.14 % of the changes there).
const (
	readQuiet    = 50 * time.Millisecond
	burstQuiet   = 250 * time.Millisecond
	burstPulses  = 3
	readQuietMax = time.Second
	// lastPulseCap bounds lastPulse; older entries than readQuietMax are pruned beyond it.
	lastPulseCap = 4096
)

// ReadQuieting returns the quiet periods a read waits for (R13, R27): lone, unless a burst of
// notifications of its URI is under way (pulses of them in a row, each within burst of the
// one before), then burst.
// For the benchmarks, which report what the waits cost.
func ReadQuieting() (lone, burst time.Duration, pulses int) {
	return readQuiet, burstQuiet, burstPulses
}

// pulseRun is what the host knows of a URI's latest notifications: when the last arrived, and
// how many arrived in a row each within burstQuiet of the one before.
type pulseRun struct {
	last   time.Time
	pulses int
}

// quiet is how long the URI must be quiet before a read is sent: burstQuiet in a burst (at
// least burstPulses in a row), readQuiet otherwise.
func (r pulseRun) quiet() time.Duration {
	if r.pulses >= burstPulses {
		return burstQuiet
	}
	return readQuiet
}

// pulseKey is serverURI's key in lastPulse: its normal form, or the string itself when it
// cannot be normalized.
func pulseKey(serverURI string) string {
	if key, err := uri.Normalize(serverURI); err == nil {
		return key
	}
	return serverURI
}

// pulseRunAt returns what is known of the latest notifications of the URI with key.
func (c *Conn) pulseRunAt(key string) (pulseRun, bool) {
	c.nmu.Lock()
	defer c.nmu.Unlock()
	r, ok := c.lastPulse[key]
	return r, ok
}

// notePulse records that a notification for serverURI arrived at at. Called with c.nmu held.
func (c *Conn) notePulse(serverURI string, at time.Time) {
	key := pulseKey(serverURI)
	if c.lastPulse == nil {
		c.lastPulse = map[string]pulseRun{}
	}
	if len(c.lastPulse) >= lastPulseCap {
		for k, r := range c.lastPulse {
			if at.Sub(r.last) > readQuietMax {
				delete(c.lastPulse, k)
			}
		}
	}
	r := c.lastPulse[key]
	if r.pulses > 0 && at.Sub(r.last) <= burstQuiet {
		r.pulses++
	} else {
		r.pulses = 1
	}
	r.last = at
	c.lastPulse[key] = r
}

// AwaitQuiet returns once no notification for serverURI has arrived for its quiet period
// (readQuiet, or burstQuiet while the URI is in a burst), or readQuietMax after it was called,
// or when ctx ends: the read sent next covers every copy of a burst of notifications (R13,
// R27).
func (c *Conn) AwaitQuiet(ctx context.Context, serverURI string) {
	key := pulseKey(serverURI)
	deadline := time.Now().Add(readQuietMax)
	for {
		r, ok := c.pulseRunAt(key)
		now, quiet := time.Now(), r.quiet()
		if !ok || now.Sub(r.last) >= quiet || !now.Before(deadline) {
			return
		}
		wait := min(r.last.Add(quiet).Sub(now), deadline.Sub(now))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
