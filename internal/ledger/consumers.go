package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// OutboxChannel is the LISTEN/NOTIFY channel a trigger on invalidation_outbox notifies at the
// commit of every transaction that inserted rows of a notifying kind (SetOutboxNotify).
const OutboxChannel = "mcpsync_outbox"

// SetOutboxNotify makes rows of kind wake outbox consumers at commit (on) or not (off). By
// default only the revocation kinds notify: a notifying transaction holds a server-wide lock
// through its commit, so notifying on every accepted version would serialize the accept path
// (see dbschema/migrations/0003_consumers.sql).
func (s *Store) SetOutboxNotify(ctx context.Context, kind string, on bool) error {
	q := `DELETE FROM outbox_notify_kinds WHERE kind = $1`
	if on {
		q = `INSERT INTO outbox_notify_kinds (kind) VALUES ($1) ON CONFLICT (kind) DO NOTHING`
	}
	if _, err := s.pool.Exec(ctx, q, kind); err != nil {
		return fmt.Errorf("ledger: outbox notify for %q: %w", kind, err)
	}
	return nil
}

// ErrConsumerBusy: another process is consuming under the same consumer name.
var ErrConsumerBusy = errors.New("ledger: consumer is held by another process")

// OutboxEvent is one outbox row as a consumer receives it, with its detail document.
type OutboxEvent struct {
	OutboxRow
	SourceName string
	Detail     json.RawMessage // nil when the row has none
}

// ConsumerOffset is a named consumer's committed position in the outbox.
type ConsumerOffset struct {
	Name      string
	Cursor    OutboxCursor
	Delivered int64 // rows committed so far
	CreatedAt time.Time
	UpdatedAt time.Time
	Lag       int64 // rows readable now past the cursor (ConsumerOffsets only)
}

// EnsureConsumer returns the consumer's committed offset, creating the consumer when it does
// not exist: at the start of the outbox, or at its current head when atHead is set.
func (s *Store) EnsureConsumer(ctx context.Context, name string, atHead bool) (ConsumerOffset, error) {
	if name == "" {
		return ConsumerOffset{}, fmt.Errorf("ledger: consumer: empty name: %w", ErrInvalid)
	}
	var start OutboxCursor
	if atHead {
		var err error
		if start, err = s.OutboxHead(ctx); err != nil {
			return ConsumerOffset{}, err
		}
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO outbox_consumers (name, txid, last_id) VALUES ($1, $2::text::xid8, $3)
		ON CONFLICT (name) DO NOTHING`, name, strconv.FormatUint(start.TxID, 10), start.ID); err != nil {
		return ConsumerOffset{}, fmt.Errorf("ledger: create consumer %q: %w", name, err)
	}
	return s.consumer(ctx, name)
}

func (s *Store) consumer(ctx context.Context, name string) (ConsumerOffset, error) {
	c, err := scanConsumer(s.pool.QueryRow(ctx, `SELECT name, txid::text, last_id, delivered, created_at, updated_at, 0::bigint
		FROM outbox_consumers WHERE name = $1`, name))
	if err != nil {
		return ConsumerOffset{}, notFound(err, fmt.Sprintf("ledger: consumer %q", name))
	}
	return c, nil
}

func scanConsumer(row pgx.Row) (ConsumerOffset, error) {
	var c ConsumerOffset
	var tx string
	if err := row.Scan(&c.Name, &tx, &c.Cursor.ID, &c.Delivered, &c.CreatedAt, &c.UpdatedAt, &c.Lag); err != nil {
		return ConsumerOffset{}, err
	}
	var err error
	c.Cursor.TxID, err = strconv.ParseUint(tx, 10, 64)
	return c, err
}

// ConsumerOffsets returns every consumer with its committed offset and its lag.
func (s *Store) ConsumerOffsets(ctx context.Context) ([]ConsumerOffset, error) {
	rows, err := s.pool.Query(ctx, `SELECT c.name, c.txid::text, c.last_id, c.delivered, c.created_at, c.updated_at,
			(SELECT count(*) FROM invalidation_outbox o WHERE (o.txid, o.id) > (c.txid, c.last_id)
			   AND o.txid < pg_snapshot_xmin(pg_current_snapshot()))
		FROM outbox_consumers c ORDER BY c.name`)
	if err != nil {
		return nil, fmt.Errorf("ledger: consumers: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ConsumerOffset, error) { return scanConsumer(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: consumers: %w", err)
	}
	return out, nil
}

// CommitConsumer moves the consumer's committed offset forward to cur, counting delivered
// rows. The offset only moves forward (one compare-and-set): committing an older cursor, e.g.
// from a replayed batch, changes nothing and reports false.
func (s *Store) CommitConsumer(ctx context.Context, name string, cur OutboxCursor, delivered int) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE outbox_consumers SET txid = $2::text::xid8, last_id = $3,
			delivered = delivered + $4, updated_at = now()
		WHERE name = $1 AND (txid, last_id) < ($2::text::xid8, $3::bigint)`,
		name, strconv.FormatUint(cur.TxID, 10), cur.ID, delivered)
	if err != nil {
		return false, fmt.Errorf("ledger: commit consumer %q: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// OutboxBatch returns up to limit outbox rows after cur in commit-safe (txid, id) order, with
// their source's name and their detail. heldBack reports rows that committed past cur but are not
// readable yet because an older transaction is still running: read again soon.
func (s *Store) OutboxBatch(ctx context.Context, cur OutboxCursor, limit int) (rows []OutboxEvent, heldBack bool, err error) {
	tx := strconv.FormatUint(cur.TxID, 10)
	q, err := s.pool.Query(ctx, `
		WITH horizon AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS xmin),
		held AS (
			SELECT EXISTS (SELECT 1 FROM invalidation_outbox
			               WHERE (txid, id) > ($1::text::xid8, $2::bigint) AND txid >= (SELECT xmin FROM horizon)) AS flag),
		batch AS (
			SELECT * FROM invalidation_outbox
			WHERE (txid, id) > ($1::text::xid8, $2::bigint) AND txid < (SELECT xmin FROM horizon)
			ORDER BY txid, id LIMIT $3)
		SELECT held.flag, o.txid::text, o.id, o.kind, o.idempotency_key, o.subscription_id, coalesce(o.principal, ''),
		       o.source_id, coalesce(o.uri, ''), coalesce(o.digest, ''), o.read_ordinal, o.created_at,
		       coalesce(so.name, ''), o.detail, coalesce(o.shadow, false)
		FROM held LEFT JOIN batch o ON true LEFT JOIN sources so ON so.id = o.source_id
		ORDER BY o.txid, o.id`, tx, cur.ID, limit)
	if err != nil {
		return nil, false, fmt.Errorf("ledger: read outbox: %w", err)
	}
	defer q.Close()
	for q.Next() {
		var e OutboxEvent
		var txid, kind, key *string
		var id *int64
		var created *time.Time
		var detail []byte
		if err := q.Scan(&heldBack, &txid, &id, &kind, &key, &e.SubscriptionID, &e.Principal,
			&e.SourceID, &e.URI, &e.Digest, &e.ReadOrdinal, &created, &e.SourceName, &detail, &e.Shadow); err != nil {
			return nil, false, fmt.Errorf("ledger: read outbox: %w", err)
		}
		if txid == nil {
			continue // no rows: only the held-back flag
		}
		if e.Cursor.TxID, err = strconv.ParseUint(*txid, 10, 64); err != nil {
			return nil, false, fmt.Errorf("ledger: read outbox: txid %q: %w", *txid, err)
		}
		e.Cursor.ID, e.Kind, e.IdempotencyKey, e.CreatedAt = *id, *kind, *key, *created
		if detail != nil {
			e.Detail = json.RawMessage(detail)
		}
		rows = append(rows, e)
	}
	if err := q.Err(); err != nil {
		return nil, false, fmt.Errorf("ledger: read outbox: %w", err)
	}
	return rows, heldBack, nil
}

// OutboxListener is a dedicated connection that listens on OutboxChannel and holds the
// session advisory lock of one consumer name, so that one process at a time consumes under
// that name. Close releases both.
type OutboxListener struct {
	conn *pgx.Conn
}

// ListenOutbox opens a dedicated connection, takes the advisory lock of consumer (failing
// with ErrConsumerBusy when another process holds it) and starts listening on OutboxChannel.
// Notifications sent after it returns are delivered to Wait. An empty consumer takes no lock:
// a reader that keeps no offset (mcpsync watch) listens beside any number of others.
func (s *Store) ListenOutbox(ctx context.Context, consumer string) (*OutboxListener, error) {
	pc, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("ledger: listen: %w", err)
	}
	conn := pc.Hijack()
	l := &OutboxListener{conn: conn}
	got := true
	if consumer != "" {
		if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended('mcpsync.outbox-consumer:' || $1, 0))`, consumer).Scan(&got); err != nil {
			l.Close()
			return nil, fmt.Errorf("ledger: lock consumer %q: %w", consumer, err)
		}
	}
	if !got {
		l.Close()
		return nil, fmt.Errorf("consumer %q: %w", consumer, ErrConsumerBusy)
	}
	if _, err := conn.Exec(ctx, "LISTEN "+OutboxChannel); err != nil {
		l.Close()
		return nil, fmt.Errorf("ledger: listen: %w", err)
	}
	return l, nil
}

// Wait blocks until a notification arrives (true), the timeout passes (false, nil) or ctx
// ends. A connection error is returned; the listener is then unusable.
func (l *OutboxListener) Wait(ctx context.Context, timeout time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := l.conn.WaitForNotification(wctx)
	switch {
	case err == nil:
		return true, nil
	case ctx.Err() != nil:
		return false, ctx.Err()
	case wctx.Err() != nil && !l.conn.IsClosed():
		return false, nil
	}
	return false, fmt.Errorf("ledger: wait for outbox notification: %w", err)
}

// Close releases the consumer's lock and ends the listener's connection. The lock is released
// by a statement first: a closed connection's server process lets go of its locks only some
// time after the client has moved on.
func (l *OutboxListener) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if !l.conn.IsClosed() {
		_, _ = l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`)
	}
	_ = l.conn.Close(ctx)
}
