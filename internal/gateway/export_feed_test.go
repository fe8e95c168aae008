package gateway

import (
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"
)

// NewTestNotifyQueue starts a notifyQueue of capacity whose deliveries call send with the
// method and, for resources/updated, the URI. push queues a notification; stop ends the
// queue's goroutine.
func NewTestNotifyQueue(capacity int, send func(method, uri string)) (push func(method, uri string), stop func()) {
	q := newNotifyQueue(capacity, func(method string, req mcp.Request) error {
		uri := ""
		if p, ok := req.GetParams().(*mcp.ResourceUpdatedNotificationParams); ok {
			uri = p.URI
		}
		send(method, uri)
		return nil
	}, func(meta mcp.Meta) mcp.Request {
		return &mcp.ServerRequest[*mcp.ResourceListChangedParams]{Params: &mcp.ResourceListChangedParams{Meta: meta}}
	}, zap.NewNop())
	push = func(method, uri string) {
		var req mcp.Request = &mcp.ServerRequest[*mcp.ResourceListChangedParams]{Params: &mcp.ResourceListChangedParams{}}
		if method == methodResourceUpdated {
			req = &mcp.ServerRequest[*mcp.ResourceUpdatedNotificationParams]{Params: &mcp.ResourceUpdatedNotificationParams{URI: uri}}
		}
		q.push(method, req)
	}
	return push, q.stop
}

// HoldSubscribeUntilAnnounced makes every subscribe return only once the feed announced a
// version of its URI while the subscribe was pending, until restore runs.
func HoldSubscribeUntilAnnounced() (restore func()) {
	holdSubscribeUntilAnnounced.Store(true)
	return func() { holdSubscribeUntilAnnounced.Store(false) }
}

// DelayVisibleSnapshot makes the snapshot of a principal's visible set, taken when its
// server is made, wait d first (a slow database), until restore runs.
func DelayVisibleSnapshot(d time.Duration) (restore func()) {
	recordVisibleDelay.Store(int64(d))
	return func() { recordVisibleDelay.Store(0) }
}
