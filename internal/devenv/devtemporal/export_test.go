package devtemporal

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
)

// ServerLockKey is the advisory lock a server holds on its main database.
const ServerLockKey = serverLockKey

// LockDatabase takes the server lock on dbURL as Start does.
func LockDatabase(ctx context.Context, dbURL string) (*pgx.Conn, error) {
	return lockDatabase(ctx, dbURL)
}

// UnlockDatabase releases the server lock as Stop does.
func UnlockDatabase(conn *pgx.Conn) { unlockDatabase(conn) }

// SearchAttributeRefresh is the embedded server's search attribute cache switch.
type SearchAttributeRefresh = searchAttributeRefresh

// SearchAttributeCacheTTL is how long after a change the refresh stays forced.
const SearchAttributeCacheTTL = searchAttributeCacheTTL

// NewSearchAttributeRefresh returns a switch over an empty static config.
func NewSearchAttributeRefresh() *SearchAttributeRefresh { return newSearchAttributeRefresh(nil) }

// Forced reports whether the refresh is forced now.
func (c *searchAttributeRefresh) Forced() bool { return c.forced() }

// Pass lets d go by for the switch (its clock moves d ahead).
func (c *searchAttributeRefresh) Pass(d time.Duration) { c.start = c.start.Add(-d) }

// Intercept runs the switch's frontend interceptor around a call of fullMethod.
func (c *searchAttributeRefresh) Intercept(fullMethod string) {
	_, _ = c.interceptor(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: fullMethod},
		func(context.Context, any) (any, error) { return nil, nil })
}

// SearchAttributeCache is s's switch (nil when Options.DynamicConfig sets the key).
func SearchAttributeCache(s *Server) *SearchAttributeRefresh { return s.saCache }

// End closes the window now, as if the last change were more than SearchAttributeCacheTTL ago.
func (c *searchAttributeRefresh) End() { c.until.Store(0) }

// NullableSlotIndexes lists the visibility indexes leanVisibilityIndexes would make partial.
const NullableSlotIndexes = nullableSlotIndexes

// LeanVisibilityIndexes runs the visibility index tuning on dbURL as Start does.
func LeanVisibilityIndexes(ctx context.Context, dbURL string) (int, error) {
	return leanVisibilityIndexes(ctx, dbURL)
}
