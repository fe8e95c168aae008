package ledger

import (
	"context"
	"fmt"
	"time"
)

// OutboxCursor is a position in the invalidation outbox: rows are read in (txid, id) order,
// and only rows of transactions older than every transaction still running are handed out,
// so a row that commits late is never skipped by a cursor that already moved past its id.
type OutboxCursor struct {
	TxID uint64
	ID   int64
}

// OutboxRow is one invalidation.
type OutboxRow struct {
	Cursor         OutboxCursor
	Kind           string
	IdempotencyKey string
	SubscriptionID *int64
	Principal      string
	SourceID       *int64
	URI            string
	Digest         string
	ReadOrdinal    *int64
	CreatedAt      time.Time
	// Shadow marks a version or tombstone invalidation accepted while its subscription was not
	// published under the roll-out (R30): consumers skip it.
	Shadow bool
}

// OutboxHead returns the cursor just past the newest row readable now, so a reader can start
// from "now".
func (s *Store) OutboxHead(ctx context.Context) (OutboxCursor, error) {
	var cur OutboxCursor
	var tx int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(txid), '0')::text::bigint, coalesce(max(id), 0)
		FROM invalidation_outbox WHERE txid < pg_snapshot_xmin(pg_current_snapshot())`).Scan(&tx, &cur.ID)
	if err != nil {
		return OutboxCursor{}, fmt.Errorf("ledger: outbox head: %w", err)
	}
	cur.TxID = uint64(tx)
	return cur, nil
}
