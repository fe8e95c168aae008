package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
}

// OutboxAfter returns up to limit outbox rows after cur, in commit-safe order.
func (s *Store) OutboxAfter(ctx context.Context, cur OutboxCursor, limit int) ([]OutboxRow, error) {
	rows, err := s.pool.Query(ctx, `
		SELECT txid::text::numeric::bigint, id, kind, idempotency_key, subscription_id,
		       coalesce(principal, ''), source_id, coalesce(uri, ''), coalesce(digest, ''),
		       read_ordinal, created_at
		FROM invalidation_outbox
		WHERE (txid::text::numeric, id) > ($1::numeric, $2::bigint)
		  AND txid < pg_snapshot_xmin(pg_current_snapshot())
		ORDER BY txid, id
		LIMIT $3`, fmt.Sprint(cur.TxID), cur.ID, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: read outbox: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OutboxRow, error) {
		var o OutboxRow
		var tx int64
		err := r.Scan(&tx, &o.Cursor.ID, &o.Kind, &o.IdempotencyKey, &o.SubscriptionID, &o.Principal,
			&o.SourceID, &o.URI, &o.Digest, &o.ReadOrdinal, &o.CreatedAt)
		o.Cursor.TxID = uint64(tx)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: read outbox: %w", err)
	}
	return out, nil
}

// OutboxHead returns the cursor just past the newest row readable now, so a reader can start
// from "now".
func (s *Store) OutboxHead(ctx context.Context) (OutboxCursor, error) {
	var cur OutboxCursor
	var tx int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(max(txid::text::numeric), 0)::bigint, coalesce(max(id), 0)
		FROM invalidation_outbox WHERE txid < pg_snapshot_xmin(pg_current_snapshot())`).Scan(&tx, &cur.ID)
	if err != nil {
		return OutboxCursor{}, fmt.Errorf("ledger: outbox head: %w", err)
	}
	cur.TxID = uint64(tx)
	return cur, nil
}
