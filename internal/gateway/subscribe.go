package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.temporal.io/sdk/converter"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/launch"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/uri"
)

// Subscribe tunables.
const (
	// subscribeStartTimeout bounds starting the subscription workflow.
	subscribeStartTimeout = 15 * time.Second
	// subscribeSettle is the longest the handler waits for a workflow it started to open
	// its ledger row; the subscription goes on either way (the handler does not wait for
	// ACTIVE: the first accepted version is announced by the feed like any other).
	subscribeSettle = 2 * time.Second
	// subscribeEndedRunWait is the longest the handler waits for the run that closed the
	// previous generation of the subscription to finish, before it starts the next one.
	subscribeEndedRunWait = 5 * time.Second
	// maxSearchAttributeBytes is Temporal's limit on one search attribute value, which the
	// normalized URI must fit (as internal/cli's normalizeURI checks).
	maxSearchAttributeBytes = 2048
)

// subscribe is the SubscribeHandler of every principal's server: the go-sdk calls it for
// resources/subscribe (2025-11-25) and for each URI of subscriptions/listen (2026-07-28).
// It parses the gateway URI, finds the source, checks the principal's standing grant, and
// starts (idempotently: workflow ID contract.SubscriptionWorkflowID, conflict policy
// USE_EXISTING) the principal's SubscriptionWorkflow for the upstream resource, exactly as
// `mcpsync subscribe` does. A bad URI, an unknown or removed source or a missing grant is an
// MCP error and starts nothing. It returns once the start is accepted (waiting at most
// subscribeSettle for the ledger row); notifications/resources/updated follow each accepted
// version (runFeed).
func (g *Gateway) subscribe(ctx context.Context, req *mcp.SubscribeRequest) error {
	principal, _, ok := principalFromExtra(req.Extra)
	if !ok {
		// subscriptions/listen calls this with a request of its own making (no Extra); its
		// context is the listen request's.
		if principal, _, ok = principalFrom(ctx); !ok {
			return errNoPrincipal
		}
	}
	gwURI := req.Params.URI
	u, err := ParseURI(gwURI)
	if err != nil {
		return refuse(ReasonBadURI, gwURI, "subscribe: %v", err)
	}
	norm, err := normalizeUpstream(u.Upstream)
	if err != nil {
		return refuse(ReasonBadURI, gwURI, "subscribe %s: %v", gwURI, err)
	}
	st := g.opts.Store
	src, err := st.SourceByName(ctx, u.Source)
	if errors.Is(err, ledger.ErrNotFound) {
		return refuse(ReasonNoGrant, gwURI, "subscribe %s: principal %q holds no standing grant on a source named %q", gwURI, principal, u.Source)
	}
	if err != nil {
		return fmt.Errorf("gateway: subscribe %s: %w", gwURI, err)
	}
	if src.RemovedAt != nil {
		return refuse(ReasonNoGrant, gwURI, "subscribe %s: source %q was removed", gwURI, u.Source)
	}
	if err := st.CheckGrant(ctx, principal, src.ID); err != nil {
		var ge *ledger.GrantError
		if errors.As(err, &ge) && ge.RevocationID != 0 {
			return refuse(ReasonRevoked, gwURI, "subscribe %s: the grant of principal %q on source %q was revoked", gwURI, principal, src.Name)
		}
		if errors.Is(err, ledger.ErrNoGrant) {
			return refuse(ReasonNoGrant, gwURI, "subscribe %s: principal %q holds no standing grant on source %q", gwURI, principal, src.Name)
		}
		return fmt.Errorf("gateway: subscribe %s: %w", gwURI, err)
	}
	wfID := contract.SubscriptionWorkflowID(principal, src.Name, norm)
	prev, err := st.SubscriptionByKey(ctx, principal, src.Name, norm)
	existed := err == nil && prev.State != mcpsync.StateClosed
	if err != nil && !errors.Is(err, ledger.ErrNotFound) {
		return fmt.Errorf("gateway: subscribe %s: %w", gwURI, err)
	}
	if err == nil && prev.State == mcpsync.StateClosed {
		// The run that closed the previous generation may still be settling; a start now
		// would join it and never reopen (as in `mcpsync subscribe`).
		if err := g.awaitEndedRun(ctx, wfID); err != nil {
			return err
		}
	}
	// Watched (and pending) before the start, so that no version accepted from the start on
	// goes unannounced; the SDK registers the session once this handler returns
	// (Gateway.subscribed confirms it).
	g.feed.addWatch(principal, src.Name, src.ID, norm, gwURI)
	g.feed.beginSubscribe(principal, gwURI)
	sctx, cancel := context.WithTimeout(ctx, subscribeStartTimeout)
	defer cancel()
	if _, err := launch.Subscription(sctx, g.opts.Temporal, g.opts.Namespace, wfID, contract.SubscriptionInput{
		Principal: principal, Source: src.Name, SourceID: src.ID, URI: norm, ServerURI: u.Upstream,
		BackstopSeconds: src.BackstopSeconds, PollSeconds: src.PollSeconds,
	}); err != nil {
		return fmt.Errorf("gateway: starting subscription workflow %s: %w", wfID, err)
	}
	if holdSubscribeUntilAnnounced.Load() {
		g.feed.awaitDeferred(ctx, principal, gwURI)
	}
	if !existed {
		g.awaitRow(ctx, principal, src.Name, norm, prev.Generation)
		g.listChanged(principal) // a new subscription joins the principal's list
	}
	return nil
}

// holdSubscribeUntilAnnounced (tests only) makes subscribe return only once the feed has
// announced a version of the URI while the subscribe was pending: the race in which a first
// version is accepted before the SDK registered the session's subscription.
var holdSubscribeUntilAnnounced atomic.Bool

// unsubscribe is the UnsubscribeHandler: the SDK stops sending this session updates for the
// URI. The subscription workflow goes on: it is the principal's, possibly shared with its
// other sessions and with `mcpsync get`; `mcpsync unsubscribe` ends it.
func (g *Gateway) unsubscribe(ctx context.Context, req *mcp.UnsubscribeRequest) error {
	if _, err := ParseURI(req.Params.URI); err != nil {
		return refuse(ReasonBadURI, req.Params.URI, "unsubscribe: %v", err)
	}
	return nil
}

// normalizeUpstream normalizes an upstream URI the way `mcpsync subscribe` does
// (internal/cli normalizeURI): uri.Normalize, and a normalized form that fits a Temporal
// search attribute value once JSON-encoded.
func normalizeUpstream(raw string) (string, error) {
	if len(raw) > maxSearchAttributeBytes {
		return "", fmt.Errorf("upstream URI of %d bytes is too long: at most %d bytes", len(raw), maxSearchAttributeBytes)
	}
	norm, err := uri.Normalize(raw)
	if err != nil {
		return "", err
	}
	p, err := converter.GetDefaultDataConverter().ToPayload(norm)
	if err != nil {
		return "", err
	}
	if n := len(p.GetData()); n > maxSearchAttributeBytes {
		return "", fmt.Errorf("upstream URI is too long: %d bytes once encoded for Temporal's search attribute, at most %d", n, maxSearchAttributeBytes)
	}
	return norm, nil
}

// awaitEndedRun waits up to subscribeEndedRunWait for a running run of wfID (the one that
// closed the previous generation) to end.
func (g *Gateway) awaitEndedRun(ctx context.Context, wfID string) error {
	err := launch.AwaitEndedRun(ctx, g.opts.Temporal, wfID, subscribeEndedRunWait)
	if errors.Is(err, launch.ErrStillRunning) {
		return fmt.Errorf("the subscription's previous generation is still closing (workflow %s); subscribe again in a few seconds", wfID)
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return err
}

// awaitRow waits up to subscribeSettle for the subscription's ledger row of a generation
// after prevGen, so that a resources/list right after the subscribe shows it.
func (g *Gateway) awaitRow(ctx context.Context, principal, source, norm string, prevGen int64) {
	deadline := time.Now().Add(subscribeSettle)
	for time.Now().Before(deadline) {
		if s, err := g.opts.Store.SubscriptionByKey(ctx, principal, source, norm); err == nil && s.Generation > prevGen {
			return
		}
		sleepCtx(ctx, 50*time.Millisecond)
		if ctx.Err() != nil {
			return
		}
	}
}
