package mcphost

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/discovery"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// How the session host uses subscriptions/listen on a 2026-07-28 session (issue 13 items 2–4).
//
// Every session gets a ListenSet installed on its client and tapped into its transport before
// it connects (the era is known only after); on a 2026-07-28 session it is bound and carries
// the session's resource subscriptions, on a 2025-11-25 one it stays idle (it rewrites and
// observes only its own listens). Conn.Watch is the subscribe: the URI joins the set and the
// call returns once the stream carrying it is acknowledged (R9): listed → watched in real
// time; left out → WatchResult.NotAcknowledged, the subscription polls with its published
// staleness bound (R11) and status says so; no acknowledgement within the ack timeout, or the
// listen refused → an error, a failed subscribe the workflow retries.
//
// A stream that ends without its complete result is a new epoch (R12): onListenEpoch tells
// every subscription the stream carried (SessionChanged with ListenEpoch), each leaves ACTIVE
// through the ledger, subscribes again — its Watch waits for the re-opened stream's
// acknowledgement — and re-reads, since nothing sent meanwhile is replayed. The control stream
// (resourcesListChanged) ending counts as a list_changed: one may have been lost. An updated
// notification carrying the subscription ID of no current stream is audited
// NOTIFICATION_OLD_SESSION and routes nothing (onStaleListen).

// WatchResult is what Conn.Watch established for one URI.
type WatchResult struct {
	// NotAcknowledged (2026-07-28): the listen acknowledgement left the URI out, so the server
	// does not watch it; the caller polls it (R11).
	NotAcknowledged bool
}

// Watch makes sure the server watches serverURI on this session for subscriptionID and
// records it as one of the URI's holders: on a 2025-11-25 session by resources/subscribe
// (sent by the first holder only), on a 2026-07-28 session through the session's listen set
// (see above). On error it does not become a holder.
func (c *Conn) Watch(ctx context.Context, serverURI string, subscriptionID int64) (WatchResult, error) {
	if c.listen == nil {
		return WatchResult{}, c.subscribeLegacy(ctx, serverURI, subscriptionID)
	}
	us := c.uriSub(serverURI, true)
	us.mu.Lock()
	defer us.mu.Unlock()
	release := func() {
		if len(us.holders) == 0 {
			c.listen.Unwatch([]string{serverURI})
		}
	}
	states, err := c.listen.Watch(ctx, []string{serverURI})
	if err != nil {
		release()
		return WatchResult{}, fmt.Errorf("subscriptions/listen %s: %w", serverURI, err)
	}
	switch states[serverURI] {
	case WatchAcknowledged:
		us.holders[subscriptionID], us.confirmed = true, true
		return WatchResult{}, nil
	case WatchNotAcknowledged:
		us.holders[subscriptionID], us.confirmed = true, true
		return WatchResult{NotAcknowledged: true}, nil
	}
	err = c.listen.Err(serverURI)
	if err == nil {
		err = errors.New("not decided")
	}
	release()
	return WatchResult{}, fmt.Errorf("subscriptions/listen %s: %w", serverURI, err)
}

// newListenSet builds the listen set of a session about to connect; the host's callbacks
// reach c once the session is open.
func (c *Conn) newListenSet(log *zap.Logger) *ListenSet {
	return NewListenSet(ListenOptions{
		AckTimeout: c.host.opts.ListenAckTimeout,
		OnEpoch:    func(e ListenEpoch) { c.onListenEpoch(e, log) },
		OnStale:    func(uri, id string) { c.onStaleListen(uri, id, log) },
		OnState: func(uri string, st WatchState, err error) {
			// Only re-opened streams decide again, and their subscriptions were told of the
			// epoch: each learns the decision from its own subscribe.
			log.Debug("listen decision after an epoch", zap.String("uri", ledger.Bounded(uri, 256)),
				zap.Stringer("state", st), zap.Error(err))
		},
	})
}

// tapListen returns tr tapped for ls, and with 2026-07-28's empty list cursors carried
// through the go-sdk (discovery.TranslateEmptyCursors: "" is a valid cursor there, not the
// end of a listing, and the go-sdk cannot tell it from an absent one): a streamable HTTP
// transport through its HTTP client (its connection cannot be wrapped), any other through its
// connection.
func tapListen(ls *ListenSet, tr mcp.Transport) mcp.Transport {
	switch t := tr.(type) {
	case *httpSourceTransport:
		st := *t.StreamableClientTransport
		st.HTTPClient = ls.WrapHTTPClient(discovery.TranslateEmptyCursorsHTTP(st.HTTPClient))
		return &httpSourceTransport{StreamableClientTransport: &st, auth: t.auth}
	case *mcp.StreamableClientTransport:
		st := *t
		st.HTTPClient = ls.WrapHTTPClient(discovery.TranslateEmptyCursorsHTTP(orDefaultClient(st.HTTPClient)))
		return &st
	case *mcp.SSEClientTransport:
		return tr // 2024-11-05 only: never 2026-07-28
	}
	return ls.WrapTransport(discovery.TranslateEmptyCursors(tr))
}

func orDefaultClient(c *http.Client) *http.Client {
	if c == nil {
		return http.DefaultClient
	}
	return c
}

// onListenEpoch tells the subscriptions an ended stream carried that nothing was replayed
// (R12, issue 13 item 4); the control stream's end counts as a list_changed.
func (c *Conn) onListenEpoch(e ListenEpoch, log *zap.Logger) {
	if e.Control {
		log.Info("listen control stream ended; treating it as list_changed", zap.String("reason", ledger.HealthErrorText(e.Reason)))
		c.onListChanged(context.Background(), nil)
		return
	}
	epoch := c.listenEpochs.Add(1)
	log.Info("listen stream ended: new epoch", zap.Int64("epoch", epoch), zap.Int("uris", len(e.URIs)),
		zap.String("reason", ledger.HealthErrorText(e.Reason)))
	h := c.host
	h.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var subs []ledger.LiveSubscription
		err := retry(ctx, func(ctx context.Context) error {
			var err error
			subs, err = h.opts.Store.Watching(ctx, c.source.ID, c.gen, e.URIs)
			return err
		})
		if err != nil {
			log.Warn("listing the subscriptions of an ended listen stream failed; their backstop reads cover it", zap.Error(err))
			return
		}
		h.signalChanged(ctx, contract.SessionChanged{Generation: c.gen, ListenEpoch: epoch}, subs, log)
	})
}

// onStaleListen audits an updated notification of no current stream (NOTIFICATION_OLD_SESSION);
// it was not routed.
func (c *Conn) onStaleListen(uri, subscriptionID string, log *zap.Logger) {
	seq := c.staleSeq.Add(1)
	// Recorded beside the connection's reader, which must not wait for the ledger.
	c.host.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := retry(ctx, func(ctx context.Context) error {
			return c.host.opts.Store.AuditStaleListenNotification(ctx, c.source.ID, c.gen, seq, uri, subscriptionID)
		}); err != nil {
			log.Warn("auditing a stale listen notification failed", zap.Error(err))
		}
	})
}
