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
	"github.com/mcpsync/mcpsync/internal/uri"
)

// onUpdated stamps a notifications/resources/updated with the session's next sequence number
// and queues it for route without blocking the connection.
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
// nothing live (old session, unknown URI, closed subscription, older sequence number); a
// retry after a lost reply gets the same targets again, so the signal is still sent.
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
	var audit mcpsync.ReceiptKind
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
