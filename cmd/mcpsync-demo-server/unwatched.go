package main

import (
	"context"
	"log/slog"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Unwatched resources (MCP 2026-07-28, issue 13 item 11). A 2026-07-28 server answers a
// subscriptions/listen with notifications/subscriptions/acknowledged listing the URIs it
// honours; a URI it leaves out is not watched and the client must poll it. The go-sdk server's
// own acknowledgement is all or nothing (every URI asked for, or the whole listen fails), so
// the demo rewrites it on the way out with a sending middleware, the way the fault-injecting
// server's ListenFaults.AckOnly does, but naming the URIs to leave out: by default
// demo://clock/now, a computed resource (the current time) that has nothing to announce, so
// the server declines to watch it. Since the URI is not watched, no
// notifications/resources/updated for it reaches a listen stream either. Legacy sessions
// (resources/subscribe, 2025-11-25 and older) are untouched: there a subscribe the server
// answered is watched.

const (
	methodAcknowledged = "notifications/subscriptions/acknowledged"
	methodUpdated      = "notifications/resources/updated"
)

// unwatchedMiddleware leaves the URIs in unwatched out of every listen acknowledgement and
// drops every updated notification for them that is addressed to a listen stream (one whose
// _meta carries a subscription ID). With no URIs it passes everything through.
func unwatchedMiddleware(unwatched []string, logger *slog.Logger) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		if len(unwatched) == 0 {
			return next
		}
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch method {
			case methodAcknowledged:
				if p, ok := req.GetParams().(*mcp.SubscriptionsAcknowledgedParams); ok && p != nil {
					asked := p.Notifications.ResourceSubscriptions
					kept := slices.DeleteFunc(slices.Clone(asked), func(u string) bool { return slices.Contains(unwatched, u) })
					if len(kept) < len(asked) {
						logger.Info("listen acknowledgement leaves out unwatched resources", "asked", len(asked), "acknowledged", len(kept))
					}
					p.Notifications.ResourceSubscriptions = kept
				}
			case methodUpdated:
				if p, ok := req.GetParams().(*mcp.ResourceUpdatedNotificationParams); ok && p != nil &&
					slices.Contains(unwatched, p.URI) && p.Meta[mcp.MetaKeySubscriptionID] != nil {
					return nil, nil
				}
			}
			return next(ctx, method, req)
		}
	}
}
