package devtemporal

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"go.temporal.io/server/common/dynamicconfig"
	"google.golang.org/grpc"
)

// searchAttributeCacheTTL is how long the server's search attribute cache serves a value it
// read from the database before reading again (cacheRefreshInterval in
// common/searchattribute/manager.go of go.temporal.io/server v1.32.1), plus a margin for the
// server's clock.
const searchAttributeCacheTTL = 60*time.Second + 5*time.Second

// searchAttributeRefresh is the embedded server's dynamic config: a static map, with
// system.forceSearchAttributesCacheRefreshOnRead true only while a change to the search
// attributes may still be missing from a cache, and false otherwise.
//
// With the setting always true (as the Temporal CLI's dev server has it), every read of the
// search attributes (every workflow start, every upsert command, every visibility task) reads
// the cluster metadata from the database first, one caller at a time under the cache's mutex:
// at 2,500 bulk subscriptions that cost a fifth of the start rate (issue 16 item 4). With it
// always false, a search attribute added at run time stays unknown to a cache loaded just
// before, for up to a minute, and a start that names it fails.
//
// So the setting is true until searchAttributeCacheTTL after the last call that changes search
// attributes (Add or Remove, on any frontend service) has returned, whatever its outcome, and
// false before any such call. Every cache loaded before that change expires within the window,
// and every read inside the window reads the database, so once the window ends every cache
// holds the change. A cache starts empty and reads the database on first use, so the search
// attributes stored before the server started (the namespace's, and what Start registers
// through the frontend) need no window of their own; and no other server changes them while
// this one runs, since it holds its database (ErrDataDirInUse, ErrDatabaseInUse).
type searchAttributeRefresh struct {
	static dynamicconfig.StaticClient
	key    dynamicconfig.Key
	start  time.Time    // the monotonic base of until
	until  atomic.Int64 // nanoseconds after start until which the refresh is forced
	on     []dynamicconfig.ConstrainedValue
	off    []dynamicconfig.ConstrainedValue
}

// newSearchAttributeRefresh wraps static, with the window closed.
func newSearchAttributeRefresh(static dynamicconfig.StaticClient) *searchAttributeRefresh {
	return &searchAttributeRefresh{
		static: static,
		key:    dynamicconfig.ForceSearchAttributesCacheRefreshOnRead.Key(),
		start:  time.Now(),
		// The same slices every time: the server caches converted values by slice.
		on:  []dynamicconfig.ConstrainedValue{{Value: true}},
		off: []dynamicconfig.ConstrainedValue{{Value: false}},
	}
}

// GetValue answers the forced-refresh setting from the window and every other key from the
// static map.
func (c *searchAttributeRefresh) GetValue(key dynamicconfig.Key) []dynamicconfig.ConstrainedValue {
	if key != c.key {
		return c.static.GetValue(key)
	}
	if c.forced() {
		return c.on
	}
	return c.off
}

// forced reports whether the window is open now.
func (c *searchAttributeRefresh) forced() bool {
	return int64(time.Since(c.start)) < c.until.Load()
}

// extend opens the window for searchAttributeCacheTTL from now.
func (c *searchAttributeRefresh) extend() {
	until := int64(time.Since(c.start) + searchAttributeCacheTTL)
	for {
		cur := c.until.Load()
		if cur >= until || c.until.CompareAndSwap(cur, until) {
			return
		}
	}
}

// changesSearchAttributes reports whether the gRPC method fullMethod (e.g.
// /temporal.api.operatorservice.v1.OperatorService/AddSearchAttributes) changes the search
// attributes.
func changesSearchAttributes(fullMethod string) bool {
	method := fullMethod[strings.LastIndexByte(fullMethod, '/')+1:]
	return method == "AddSearchAttributes" || method == "RemoveSearchAttributes"
}

// interceptor is the frontend interceptor that opens the window when a call that changes the
// search attributes returns.
func (c *searchAttributeRefresh) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if changesSearchAttributes(info.FullMethod) {
		defer c.extend()
	}
	return handler(ctx, req)
}
