package mcphost

import (
	"context"
	"hash/fnv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/tracing"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// notificationQueueCap bounds the notifications queued per session (issue 14 item 6); tests
// lower it through export_bounds_test.go.
var notificationQueueCap = DefaultNotificationQueueCap

// DefaultNotificationQueueCap is how many notifications a session queues for routing before
// further ones are folded into one overflow (queueOverflow): a server flooding notifications
// faster than the ledger records them costs bounded memory, and loses nothing.
const DefaultNotificationQueueCap = 10000

// queueOverflow stands for the notifications that arrived while the queue was full: their
// count, the first and last sequence numbers, and when the last arrived. Route records it as
// one NOTIFICATION_OVERFLOW audit and signals every live subscription of the source to re-read
// (ledger.RecordNotificationOverflow), since which URIs they named is not kept.
type queueOverflow struct {
	dropped     int64
	first, last int64
	at          time.Time
}

// onUpdated stamps a notifications/resources/updated with the session's next sequence number
// and queues it for route without blocking the connection. The queue holds at most
// notificationQueueCap notifications; later ones only extend the overflow until route drains
// it. A URI longer than ledger.MaxPayloadString is kept normalized, or else bounded
// (ledger.Bounded: no subscribed URI is that long, so it matches nothing and is audited as
// malformed), so the queue's memory and every signal stay bounded too.
func (c *Conn) onUpdated(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
	if req == nil || req.Params == nil {
		return
	}
	raw := req.Params.URI
	if len(raw) > ledger.MaxPayloadString {
		if norm, err := uri.Normalize(raw); err == nil && len(norm) <= ledger.MaxPayloadString {
			raw = norm
		} else {
			raw = ledger.Bounded(raw, ledger.MaxPayloadString)
		}
	}
	c.nmu.Lock()
	c.seq++
	n := notification{seq: c.seq, serverURI: raw, receivedAt: time.Now(), pulses: 1}
	c.notePulse(raw, n.receivedAt)
	if c.ended {
		c.nmu.Unlock()
		// The session is over and its router gone: record it here, still under its own
		// generation, so that the ledger audits it rather than it being lost.
		c.record(n, c.host.log)
		return
	}
	if len(c.queue) >= notificationQueueCap {
		o := &c.overflow
		if o.dropped == 0 {
			o.first = n.seq
		}
		o.dropped++
		o.last, o.at = n.seq, n.receivedAt
	} else {
		c.queue = append(c.queue, n)
	}
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
		batch, over := c.queue, c.overflow
		c.queue, c.overflow = nil, queueOverflow{}
		idle := len(batch) == 0 && over.dropped == 0
		stopping := false
		if idle {
			select {
			case <-stop:
				stopping = true
				c.ended = true
			default:
			}
		}
		c.nmu.Unlock()
		if stopping {
			c.endDeliveries()
			return
		}
		c.routeBatch(batch, log)
		// Every overflowed notification arrived after the whole batch (the queue was full).
		c.routeOverflow(over, log)
		if idle {
			select {
			case <-c.wake:
			case <-stop:
			}
		}
	}
}

// routeOverflow records an overflow (if any) and signals each subscription the ledger returns
// as notified at the overflow's last sequence number, so that every live subscription of the
// source re-reads: what the dropped notifications announced is covered (issue 14 item 6).
func (c *Conn) routeOverflow(o queueOverflow, log *zap.Logger) {
	if o.dropped == 0 {
		return
	}
	log.Warn("notification queue full: the source's subscriptions are re-read",
		zap.Int64("source", c.source.ID), zap.Int64("generation", c.gen), zap.Int64("dropped", o.dropped),
		zap.Int("queueCap", notificationQueueCap))
	store := c.host.opts.Store
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var targets []ledger.OverflowTarget
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		targets, err = store.RecordNotificationOverflow(ctx, ledger.Overflow{
			SourceID: c.source.ID, SessionGeneration: c.gen, FirstSeq: o.first, LastSeq: o.last,
			Dropped: o.dropped, QueueCap: notificationQueueCap,
		})
		return err
	})
	if err != nil {
		log.Warn("recording notification overflow failed", zap.Int64("dropped", o.dropped), zap.Error(err))
		return
	}
	// Signals, each durable when its call returns: what an overflow calls for is not noted
	// pending (noteSignalled), so later notifications of the URIs are delivered as usual.
	for _, t := range targets {
		c.signal(ctx, t.WorkflowID, contract.ResourceUpdated{
			SessionGeneration: c.gen, Seq: o.last, ServerURI: t.ServerURI, Pulses: 1, ReceivedAt: o.at,
		}, log)
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

// routeBatch records a batch and signals its subscriptions: each lane in order, the lanes in
// parallel. Notifications of the same server URI within the batch are merged into one (the
// newest sequence number and arrival time, and the count of pulses), so a burst of duplicates
// costs one ledger write and one signal per subscription (R13). Every notification whose URI
// parses is recorded in one ledger statement first (ledger.RecordNotifications): a batch is
// what queued while the batch before it was routed, so the busier the session, the more
// notifications share one write, instead of each lane writing its notifications one by one
// behind each other (issue 16). One that statement matched to nothing, a malformed URI, or
// every notification when the statement failed, is recorded alone (record), which audits it
// or retries it. It returns when the whole batch is recorded, so the next batch cannot
// overtake it.
func (c *Conn) routeBatch(batch []notification, log *zap.Logger) {
	if len(batch) == 1 {
		c.record(batch[0], log)
		return
	}
	var byLane [routeLanes][]routed
	type at struct{ lane, index int }
	merged := map[string]at{}
	for _, n := range batch {
		if p, ok := merged[n.serverURI]; ok {
			m := &byLane[p.lane][p.index].n
			m.seq, m.receivedAt, m.pulses = n.seq, n.receivedAt, m.pulses+n.pulses
			continue
		}
		norm, err := uri.Normalize(n.serverURI)
		i := lane(norm, n.serverURI)
		byLane[i] = append(byLane[i], routed{n: n, norm: norm, parsed: err == nil})
		merged[n.serverURI] = at{i, len(byLane[i]) - 1}
	}
	targets := c.recordBatch(byLane[:], log)
	var wg sync.WaitGroup
	for _, rs := range byLane {
		if len(rs) == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, r := range rs {
				if ts, ok := targets[r.norm]; r.parsed && ok {
					c.signalRecorded(r.n, r.norm, ts, log)
				} else {
					c.record(r.n, log)
				}
			}
		}()
	}
	wg.Wait()
}

// routed is a notification of a batch with its normalized URI (parsed false: it does not
// parse, and norm is empty).
type routed struct {
	n      notification
	norm   string
	parsed bool
}

// recordBatch records the notifications of lanes whose URI parses in one ledger statement and
// returns the subscriptions to signal per normalized URI; nil when the statement failed after
// its retries (each notification is then recorded alone).
func (c *Conn) recordBatch(lanes [][]routed, log *zap.Logger) (targets map[string][]ledger.NotificationTarget) {
	var ns []ledger.Notification
	for _, rs := range lanes {
		for _, r := range rs {
			if r.parsed {
				ns = append(ns, ledger.Notification{SourceID: c.source.ID, SessionGeneration: c.gen, Seq: r.n.seq, URI: r.norm, ServerURI: r.n.serverURI})
			}
		}
	}
	if len(ns) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		targets, err = c.host.opts.Store.RecordNotifications(ctx, c.source.ID, c.gen, ns)
		return err
	})
	if err != nil {
		log.Warn("recording a batch of notifications failed; recording them one by one", zap.Int("notifications", len(ns)), zap.Error(err))
		return nil
	}
	return targets
}

// record normalizes a notification's URI, records it in the ledger and signals the
// subscriptions it matches (signalTargets). The ledger writes an audit receipt instead when
// it matches nothing live (old session, unknown URI, closed subscription, older sequence
// number); a retry after a lost reply gets the same targets again, so the signal is still
// sent.
func (c *Conn) record(n notification, log *zap.Logger) {
	norm, err := uri.Normalize(n.serverURI)
	mu := &c.lanes[lane(norm, n.serverURI)]
	mu.Lock()
	defer mu.Unlock()
	store := c.host.opts.Store
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
	var audit mcpsync.ReceiptKind
	// One trace per routed notification: its signals carry it into the workflow (issue 17).
	ctx, span := c.traceNotification(ctx, n)
	defer func() { span.SetAttributes(tracing.AttrTargets.Int(len(targets))); tracing.End(span, err) }()
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
		log.Debug("notification audited", zap.String("uri", n.serverURI), zap.String("audit", string(audit)))
	}
	c.signalTargets(ctx, n, norm, targets, log)
}

// signalRecorded signals the subscriptions a batch's statement recorded n on (recordBatch),
// in n's lane, with n's trace.
func (c *Conn) signalRecorded(n notification, norm string, targets []ledger.NotificationTarget, log *zap.Logger) {
	mu := &c.lanes[lane(norm, n.serverURI)]
	mu.Lock()
	defer mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctx, span := c.traceNotification(ctx, n)
	defer func() { span.SetAttributes(tracing.AttrTargets.Int(len(targets))); tracing.End(span, nil) }()
	c.signalTargets(ctx, n, norm, targets, log)
}

// signalTargets delivers n to the subscriptions it was recorded on (deliver), but for those
// whose pending signal's read covers it (signalPending).
func (c *Conn) signalTargets(ctx context.Context, n notification, norm string, targets []ledger.NotificationTarget, log *zap.Logger) {
	for _, t := range targets {
		if c.signalPending(norm, t) {
			continue // its pending signal's read covers this notification (R13)
		}
		c.deliver(ctx, norm, t, contract.ResourceUpdated{
			SessionGeneration: c.gen, Seq: n.seq, ServerURI: n.serverURI, Pulses: n.pulses, ReceivedAt: n.receivedAt,
		}, log)
	}
}

// uriSignals is what a session knows of one URI's signals (signalPending): when the last
// resources/read of it was sent, and, per subscription (ID and generation), when the latest
// notification it was signalled arrived.
type uriSignals struct {
	readAt    time.Time
	signalled map[signalTarget]time.Time
}

type signalTarget struct{ subscription, generation int64 }

// signalPending reports whether a notification of the normalized URI norm, arriving now,
// needs no signal to t (R13): t was signalled an earlier notification of norm that arrived
// after the last resources/read of norm sent on this session. The subscription reads because
// of that signal — the read it has sent so far went out before that notification arrived, so
// neither its read nor its follow-up rule (resolvePulses, coveredByLastRead) counts it covered,
// and a subscription not yet live reads when it is — and no read of norm has been sent since,
// so that read goes out after this notification arrived and sees what it announces.
// Suppressing the signal spares a signal and a workflow task of the subscription; the
// notification is still recorded in the ledger. Every clock reading is this host's, on one
// session; a new session starts with nothing pending.
func (c *Conn) signalPending(norm string, t ledger.NotificationTarget) bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	u := c.signals[norm]
	if u == nil {
		return false
	}
	at, ok := u.signalled[signalTarget{t.SubscriptionID, t.Generation}]
	return ok && at.After(u.readAt)
}

// noteSignalled records that t was signalled a notification of norm that arrived at
// receivedAt (after the signal was delivered, or as its update is sent: a read sent in
// between is later than receivedAt and so still counts).
func (c *Conn) noteSignalled(norm string, t ledger.NotificationTarget, receivedAt time.Time) {
	c.smu.Lock()
	defer c.smu.Unlock()
	u := c.uriSignals(norm)
	if u.signalled == nil {
		u.signalled = map[signalTarget]time.Time{}
	}
	k := signalTarget{t.SubscriptionID, t.Generation}
	if receivedAt.After(u.signalled[k]) {
		u.signalled[k] = receivedAt
	}
}

// forgetSignalled undoes noteSignalled(norm, t, receivedAt) for an update that was not
// delivered, unless a later notification was noted since.
func (c *Conn) forgetSignalled(norm string, t ledger.NotificationTarget, receivedAt time.Time) {
	c.smu.Lock()
	defer c.smu.Unlock()
	if u := c.signals[norm]; u != nil {
		k := signalTarget{t.SubscriptionID, t.Generation}
		if at, ok := u.signalled[k]; ok && at.Equal(receivedAt) {
			delete(u.signalled, k)
		}
	}
}

// noteReadSent records that a resources/read of the server URI raw is being sent on this
// session now. It runs before the request is written (sending middleware, session.go), so a
// notification that finds it not yet recorded arrived before the read went out.
func (c *Conn) noteReadSent(raw string) {
	norm, err := uri.Normalize(raw)
	if err != nil {
		norm = raw
	}
	now := time.Now()
	c.smu.Lock()
	defer c.smu.Unlock()
	u := c.uriSignals(norm)
	u.readAt = now
	clear(u.signalled) // each signal before now is answered by this read or came after it
}

// stampReads is sending middleware that records each resources/read of the session as sent
// (noteReadSent) before passing it on, for signalPending.
func (c *Conn) stampReads(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "resources/read" {
			if p, ok := req.GetParams().(*mcp.ReadResourceParams); ok && p != nil {
				c.noteReadSent(p.URI)
			}
		}
		return next(ctx, method, req)
	}
}

// uriSignals returns norm's entry, made when missing; c.smu must be held. Entries are made
// only for URIs read or signalled on this session: its subscriptions' URIs.
func (c *Conn) uriSignals(norm string) *uriSignals {
	if c.signals == nil {
		c.signals = map[string]*uriSignals{}
	}
	u := c.signals[norm]
	if u == nil {
		u = &uriSignals{}
		c.signals[norm] = u
	}
	return u
}
