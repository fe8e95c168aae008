package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Outbox kinds the feed turns into notifications. The acceptance point writes "version" with
// every accepted version whose digest changed (ledger/reads.go) and "tombstone" with every
// confirmed deletion (ledger/tombstone.go); revocations write ledger.OutboxRevocation.
const (
	outboxVersion   = "version"
	outboxTombstone = "tombstone"
)

// Feed tunables. They are constants (not Options) so that the gateway's options stay the
// ones its issue names; each says what it bounds.
const (
	// feedBatch is how many outbox rows one read takes.
	feedBatch = 500
	// feedFallbackPoll is how long the feed waits for a NOTIFY before it reads the outbox
	// anyway: rows of a kind that does not notify (outbox_notify_kinds) arrive within it.
	feedFallbackPoll = time.Second
	// feedHeldBackRetry is how soon the feed reads again when rows committed past its cursor
	// are held back behind an older transaction that is still running.
	feedHeldBackRetry = 10 * time.Millisecond
	// visiblePoll is how often the feed compares each connected principal's visible set
	// (standing grants, latest catalogs, subscriptions) with the last one it saw, and the
	// token states of open streams: grants and catalogs notify no channel, so a change of
	// them reaches agents as list_changed within this period.
	visiblePoll = 2 * time.Second
	// feedRetry is the pause before the feed reconnects after a database error.
	feedRetry = time.Second
)

// feedState is the gateway's notification state: which principal's server to notify, which
// gateway URIs each principal subscribed to, the open streams and sessions of every token
// and the per-session notification queues. Its zero value is ready to use.
type feedState struct {
	mu      sync.Mutex
	servers map[string]*mcp.Server // principal → its MCP server (instrumentServer)
	watched map[watchKey]*watch    // (principal, source, normalized URI) → gateway URIs
	tokens  map[string]*tokenStreams
	queues  map[*mcp.ServerSession]*notifyQueue
	visible map[string]string // principal → fingerprint of its visible set
	// sessionToken maps each live 2025 session to the token that opened it.
	sessionToken map[*mcp.ServerSession]string
	// pending are subscriptions whose handler ran but which the SDK may not have registered
	// yet (it does after the handler returns): a version accepted in between is sent again
	// once the registration is confirmed, so the first version is never missed.
	pending map[pendingKey]*pendingSub
}

// pendingKey names one subscribe of a principal to a gateway URI.
type pendingKey struct{ principal, uri string }

// pendingSub is the state of subscribes not yet confirmed (count), until when they count as
// pending, and whether a notification was sent for the URI meanwhile.
type pendingSub struct {
	n        int
	until    time.Time
	deferred bool
}

// pendingWindow bounds how long a subscribe counts as unconfirmed (a listen whose
// acknowledgement never went out, e.g. because another URI of it failed).
const pendingWindow = 30 * time.Second

// watchKey names an upstream resource as one principal sees it.
type watchKey struct{ principal, source, uri string }

// watch is what the feed needs to notify one watchKey: the source's ID (revocations name
// sources by ID) and every gateway URI string the principal subscribed with (the SDK
// notifies sessions subscribed to the exact string).
type watch struct {
	sourceID int64
	uris     map[string]struct{}
}

func (f *feedState) initLocked() {
	if f.servers == nil {
		f.servers = map[string]*mcp.Server{}
		f.watched = map[watchKey]*watch{}
		f.tokens = map[string]*tokenStreams{}
		f.queues = map[*mcp.ServerSession]*notifyQueue{}
		f.visible = map[string]string{}
		f.sessionToken = map[*mcp.ServerSession]string{}
		f.pending = map[pendingKey]*pendingSub{}
	}
}

// server returns principal's MCP server, nil if it has none yet (no session ever connected,
// so nobody to notify).
func (f *feedState) server(principal string) *mcp.Server {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	return f.servers[principal]
}

// addWatch records that principal subscribed to gatewayURI, naming (source, norm).
func (f *feedState) addWatch(principal, source string, sourceID int64, norm, gatewayURI string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	k := watchKey{principal, source, norm}
	w := f.watched[k]
	if w == nil {
		w = &watch{sourceID: sourceID, uris: map[string]struct{}{}}
		f.watched[k] = w
	}
	w.uris[gatewayURI] = struct{}{}
}

// beginSubscribe records a subscribe of principal to gatewayURI about to be registered.
func (f *feedState) beginSubscribe(principal, gatewayURI string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	k := pendingKey{principal, gatewayURI}
	p := f.pending[k]
	if p == nil {
		p = &pendingSub{}
		f.pending[k] = p
	}
	p.n++
	p.until = time.Now().Add(pendingWindow)
}

// notePending marks a notification sent for gatewayURI while a subscribe to it is pending.
func (f *feedState) notePending(principal, gatewayURI string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	if p := f.pending[pendingKey{principal, gatewayURI}]; p != nil && time.Now().Before(p.until) {
		p.deferred = true
	}
}

// awaitDeferred waits (at most 30 s) until a notification was sent for gatewayURI while a
// subscribe of principal to it was pending (tests only: holdSubscribeUntilAnnounced).
func (f *feedState) awaitDeferred(ctx context.Context, principal, gatewayURI string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		f.mu.Lock()
		p := f.pending[pendingKey{principal, gatewayURI}]
		done := p != nil && p.deferred
		f.mu.Unlock()
		if done {
			return
		}
		sleepCtx(ctx, 10*time.Millisecond)
	}
}

// endSubscribe ends one pending subscribe; it reports whether a notification went out while
// it was pending and registered is set (the caller sends it again).
func (f *feedState) endSubscribe(principal, gatewayURI string, registered bool) (resend bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	k := pendingKey{principal, gatewayURI}
	p := f.pending[k]
	if p == nil {
		return false
	}
	resend = registered && p.deferred
	p.n--
	if p.n <= 0 || time.Now().After(p.until) {
		delete(f.pending, k)
	}
	return resend
}

// watchers returns the gateway URIs principal subscribed to for (source, norm).
func (f *feedState) watchers(principal, source, norm string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	w := f.watched[watchKey{principal, source, norm}]
	if w == nil {
		return nil
	}
	out := make([]string, 0, len(w.uris))
	for u := range w.uris {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// dropWatches forgets every subscription of principal on the sources (all when sources is
// empty): after a revocation nothing more is sent for them (item 4). It reports how many
// resources were dropped.
func (f *feedState) dropWatches(principal string, sources []int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.initLocked()
	n := 0
	for k, w := range f.watched {
		if k.principal != principal {
			continue
		}
		if len(sources) > 0 && !containsID(sources, w.sourceID) {
			continue
		}
		delete(f.watched, k)
		n++
	}
	return n
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// feedListenerConn is the feed's dedicated connection: it listens on the outbox channel and
// on the token channel (ledger.TokenChannel).
type feedListenerConn struct{ conn *pgx.Conn }

func (g *Gateway) listenFeed(ctx context.Context) (*feedListenerConn, error) {
	pc, err := g.opts.Store.Pool().Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("gateway feed: connect: %w", err)
	}
	l := &feedListenerConn{conn: pc.Hijack()}
	for _, ch := range []string{ledger.OutboxChannel, ledger.TokenChannel} {
		if _, err := l.conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			l.close()
			return nil, fmt.Errorf("gateway feed: listen %s: %w", ch, err)
		}
	}
	return l, nil
}

func (l *feedListenerConn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.conn.Close(ctx)
}

// wait returns the notification that arrived within timeout (nil when none did). An error
// means the connection is unusable.
func (l *feedListenerConn) wait(ctx context.Context, timeout time.Duration) (*pgconnNotification, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n, err := l.conn.WaitForNotification(wctx)
	switch {
	case err == nil:
		return &pgconnNotification{Channel: n.Channel, Payload: n.Payload}, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case wctx.Err() != nil && !l.conn.IsClosed():
		return nil, nil
	}
	return nil, fmt.Errorf("gateway feed: wait: %w", err)
}

// pgconnNotification is one NOTIFY the feed received.
type pgconnNotification struct{ Channel, Payload string }

// FeedNotifyKinds are the outbox kinds the gateway makes notify at commit when it starts
// (ledger.SetOutboxNotify), so that a notification reaches agents within milliseconds of
// the acceptance instead of on the fallback poll. It costs the accept path the commit-order
// lock the notify trigger takes (dbschema 0003 measured 611 vs 1,131 accepts/s with fsync).
var FeedNotifyKinds = []string{outboxVersion, outboxTombstone}

// runFeed turns the invalidation outbox into notifications until ctx ends (issue 15 items 3
// and 4). It starts at the outbox head as of its start: a gateway has nothing to replay,
// because a client that was connected to a previous gateway process lost its session or
// listen stream with it and re-reads when it reconnects (2026-07-28 has no resumption; a
// 2025-11-25 session does not outlive the process). Each version or confirmed tombstone of
// principal P is sent as notifications/resources/updated, with the gateway URI P
// subscribed with, through P's own server only, after the row committed (the outbox row is
// written in the accept transaction). A revocation row drops P's subscriptions on the
// revoked sources (no further updates) and tells P list_changed. A NOTIFY on
// ledger.TokenChannel ends every stream and session of that token. Database errors are
// logged and retried; the cursor survives reconnects, so no row is skipped.
func (g *Gateway) runFeed(ctx context.Context) error {
	log := g.opts.Logger.Named("feed")
	for _, k := range FeedNotifyKinds {
		if err := g.opts.Store.SetOutboxNotify(ctx, k, true); err != nil {
			log.Warn("outbox rows will reach agents on the fallback poll only", zap.String("kind", k), zap.Error(err))
		}
	}
	var cur ledger.OutboxCursor
	started := false
	for ctx.Err() == nil {
		if !started {
			head, err := g.opts.Store.OutboxHead(ctx)
			if err != nil {
				log.Warn("outbox head", zap.Error(err))
				sleepCtx(ctx, feedRetry)
				continue
			}
			cur, started = head, true
		}
		err := g.followFeed(ctx, &cur)
		if ctx.Err() != nil {
			break
		}
		log.Warn("feed interrupted; reconnecting", zap.Error(err))
		sleepCtx(ctx, feedRetry)
	}
	return nil
}

// followFeed listens and reads the outbox from *cur until an error or ctx ends.
func (g *Gateway) followFeed(ctx context.Context, cur *ledger.OutboxCursor) error {
	l, err := g.listenFeed(ctx)
	if err != nil {
		return err
	}
	defer l.close()
	// Listening now: every token revoked from here on is heard; the ones revoked before
	// (while disconnected) are found by the sweep.
	g.sweepTokens(ctx)
	nextPoll := time.Now().Add(visiblePoll)
	for {
		heldBack, err := g.drainOutbox(ctx, cur)
		if err != nil {
			return err
		}
		if time.Now().After(nextPoll) {
			g.pollVisible(ctx)
			g.sweepTokens(ctx)
			nextPoll = time.Now().Add(visiblePoll)
		}
		timeout := feedFallbackPoll
		if heldBack {
			timeout = feedHeldBackRetry
		}
		if d := time.Until(nextPoll); d < timeout {
			timeout = max(d, time.Millisecond)
		}
		n, err := l.wait(ctx, timeout)
		if err != nil {
			return err
		}
		if n != nil && n.Channel == ledger.TokenChannel {
			g.endToken(n.Payload, "token revoked")
		}
	}
}

// drainOutbox handles every readable outbox row after *cur.
func (g *Gateway) drainOutbox(ctx context.Context, cur *ledger.OutboxCursor) (heldBack bool, err error) {
	for {
		rows, held, err := g.opts.Store.OutboxBatch(ctx, *cur, feedBatch)
		if err != nil {
			return false, err
		}
		for _, r := range rows {
			*cur = r.Cursor
			g.handleOutbox(ctx, r)
		}
		if len(rows) < feedBatch {
			return held, nil
		}
	}
}

// handleOutbox turns one outbox row into the notifications it means.
func (g *Gateway) handleOutbox(ctx context.Context, r ledger.OutboxEvent) {
	if r.Shadow || r.Principal == "" {
		return // R30: a shadow version is not published; rows without a principal concern no agent
	}
	switch r.Kind {
	case outboxVersion, outboxTombstone:
		srv := g.feed.server(r.Principal)
		if srv == nil {
			return
		}
		for _, u := range g.feed.watchers(r.Principal, r.SourceName, r.URI) {
			if err := srv.ResourceUpdated(ctx, &mcp.ResourceUpdatedNotificationParams{URI: u}); err != nil {
				g.opts.Logger.Warn("resources/updated", zap.String("principal", r.Principal), zap.Error(err))
			}
			// After the send: a session that registered before it got it, one that registers
			// after this mark gets it again from Gateway.subscribed.
			g.feed.notePending(r.Principal, u)
		}
		if r.Kind == outboxTombstone {
			g.listChanged(r.Principal) // the resource left the list
		}
	case ledger.OutboxRevocation:
		var d struct {
			Sources []int64 `json:"sources"`
		}
		if len(r.Detail) > 0 {
			_ = json.Unmarshal(r.Detail, &d)
		}
		if len(d.Sources) == 0 && r.SourceID != nil {
			d.Sources = []int64{*r.SourceID}
		}
		if len(d.Sources) == 0 {
			return // a revocation that ended no grant changes nothing
		}
		g.feed.dropWatches(r.Principal, d.Sources)
		g.listChanged(r.Principal)
	}
}

// pollVisible sends list_changed to every connected principal whose visible set changed
// since the last poll: a grant given or revoked, a new catalog, a subscription opened or
// closed, a source removed. The first poll that sees a principal only records it.
func (g *Gateway) pollVisible(ctx context.Context) {
	g.feed.mu.Lock()
	g.feed.initLocked()
	principals := make([]string, 0, len(g.feed.servers))
	for p := range g.feed.servers {
		principals = append(principals, p)
	}
	g.feed.mu.Unlock()
	if len(principals) == 0 {
		return
	}
	fps, err := visibleFingerprints(ctx, g.opts.Store.Pool(), principals)
	if err != nil {
		g.opts.Logger.Warn("visible-set poll", zap.Error(err))
		return
	}
	var changed []string
	g.feed.mu.Lock()
	for _, p := range principals {
		fp := fps[p]
		old, seen := g.feed.visible[p]
		g.feed.visible[p] = fp
		if seen && old != fp {
			changed = append(changed, p)
		}
	}
	g.feed.mu.Unlock()
	for _, p := range changed {
		g.listChanged(p)
	}
}

// recordVisibleDelay (tests) delays every recordVisible, as a loaded database would.
var recordVisibleDelay atomic.Int64

// recordVisible records principal's visible set as it is when its server is made (before
// its first session is answered), so that the first change after it is announced.
func (g *Gateway) recordVisible(principal string) {
	if d := recordVisibleDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d)) // test hook: a slow database
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fps, err := visibleFingerprints(ctx, g.opts.Store.Pool(), []string{principal})
	if err != nil {
		g.opts.Logger.Warn("visible-set snapshot", zap.String("principal", principal), zap.Error(err))
		return
	}
	g.feed.mu.Lock()
	defer g.feed.mu.Unlock()
	g.feed.initLocked()
	if _, seen := g.feed.visible[principal]; !seen {
		g.feed.visible[principal] = fps[principal]
	}
}

// visibleFingerprints returns, per principal, a digest of what its resources/list depends
// on: each grant (source, epoch, standing), the source's latest catalog, its removal, and
// the principal's subscriptions on it (count, closed count, newest).
func visibleFingerprints(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, principals []string) (map[string]string, error) {
	rows, err := q.Query(ctx, `
		SELECT g.principal, string_agg(concat_ws(':', g.source_id, g.epoch, g.revoked_at IS NULL, so.removed_at IS NULL,
			(SELECT coalesce(max(c.id), 0) FROM catalogs c WHERE c.source_id = g.source_id),
			(SELECT concat_ws('/', count(*), count(*) FILTER (WHERE s.state = 'CLOSED'), coalesce(max(s.id), 0))
			   FROM subscriptions s WHERE s.principal = g.principal AND s.source_id = g.source_id)), ',' ORDER BY g.source_id)
		FROM grants g JOIN sources so ON so.id = g.source_id
		WHERE g.principal = ANY($1) GROUP BY g.principal`, principals)
	if err != nil {
		return nil, fmt.Errorf("gateway: visible sets: %w", err)
	}
	out := map[string]string{}
	var p, fp string
	if _, err := pgx.ForEachRow(rows, []any{&p, &fp}, func() error { out[p] = fp; return nil }); err != nil {
		return nil, fmt.Errorf("gateway: visible sets: %w", err)
	}
	return out, nil
}

// listChangedSentinel is a resource added to and at once removed from a principal's server
// to make the SDK send notifications/resources/list_changed to its sessions (the SDK sends
// it only on a change of its own resource set; it has no call to send it otherwise). The
// receiving middleware hides it from resources/list and refuses to read it.
const listChangedSentinel = "mcpsync-gateway:list-changed"

// listChanged tells principal's sessions notifications/resources/list_changed (debounced
// by the SDK, 10 ms).
func (g *Gateway) listChanged(principal string) {
	srv := g.feed.server(principal)
	if srv == nil {
		return
	}
	srv.AddResource(&mcp.Resource{URI: listChangedSentinel, Name: "list-changed"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return nil, mcp.ResourceNotFoundError(listChangedSentinel)
	})
	srv.RemoveResources(listChangedSentinel)
}

// sweepTokens ends the streams of every token that no longer authenticates (revoked while
// the feed was not listening, or expired since).
func (g *Gateway) sweepTokens(ctx context.Context) {
	ids := g.feed.tokenIDs()
	if len(ids) == 0 {
		return
	}
	toks, err := g.opts.Store.Tokens(ctx)
	if err != nil {
		g.opts.Logger.Warn("token sweep", zap.Error(err))
		return
	}
	known := map[string]ledger.Token{}
	for _, t := range toks {
		known[t.ID] = t
	}
	now := time.Now()
	for _, id := range ids {
		t, ok := known[id]
		switch {
		case !ok:
			g.endToken(id, "token unknown")
		case t.Status(now) != ledger.TokenActive:
			g.endToken(id, "token "+t.Status(now))
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
