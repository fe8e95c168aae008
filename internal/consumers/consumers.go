// Package consumers delivers the invalidation outbox to named consumers, at least once and
// in commit-safe order. A consumer's offset is stored in the ledger and committed only after
// its batch was delivered, so a consumer that crashes replays at most the batch it had not
// committed; every row carries its idempotency key, by which the receiver drops replays.
// Wake-ups come from Postgres LISTEN/NOTIFY: a trigger notifies at the commit of every
// transaction that wrote outbox rows of a notifying kind — by default the revocation kinds
// (ledger.SetOutboxNotify). A poll every PollInterval delivers the other kinds and covers lost
// notifications, and rows held back behind a still-running older transaction are retried
// sooner.
package consumers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Options configure Run.
type Options struct {
	// Consumer names the consumer whose offset is read and committed. Required.
	Consumer string
	// Batch is the most rows delivered (and committed) at once; default 200.
	Batch int
	// Follow keeps delivering until ctx ends; otherwise Run returns once it has delivered
	// every row readable when it looked last.
	Follow bool
	// PollInterval is the fallback read period while following; default 1 s.
	PollInterval time.Duration
	// StartAtHead makes a consumer that does not exist yet start at the outbox's current head
	// instead of its beginning.
	StartAtHead bool
	// Limit, if positive, stops Run after delivering that many rows (tests, bounded reads).
	Limit int
	// Idle, if set, is called each time a follower has delivered every readable row and is
	// about to wait for a notification or its poll.
	Idle func()
}

// Deliver hands a batch to the receiver. Returning an error stops Run without committing the
// batch: it is delivered again next time.
type Deliver func(ctx context.Context, batch []ledger.OutboxEvent) error

// Stats counts what Run did.
type Stats struct {
	Delivered int // rows handed to Deliver and committed
	Shadowed  int // rows skipped because their version was not published (R30)
	Batches   int // batches committed
	Wakeups   int // notifications received
	Polls     int // reads started by the fallback timer or a held-back retry
	Cursor    ledger.OutboxCursor
}

const heldBackRetry = 5 * time.Millisecond

// Run delivers outbox rows to deliver under the consumer's stored offset. Without Follow it
// returns after the rows readable now; with Follow it returns when ctx ends, with ctx's error.
// It fails with ledger.ErrConsumerBusy when another process consumes under the same name.
func Run(ctx context.Context, st *ledger.Store, opts Options, deliver Deliver) (Stats, error) {
	var stats Stats
	if opts.Consumer == "" {
		return stats, fmt.Errorf("consumers: empty consumer name: %w", ledger.ErrInvalid)
	}
	if opts.Batch <= 0 {
		opts.Batch = 200
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = time.Second
	}
	// Listen (and lock the name) before reading, so no notification after the first read is lost.
	l, err := st.ListenOutbox(ctx, opts.Consumer)
	if err != nil {
		return stats, err
	}
	defer l.Close()
	off, err := st.EnsureConsumer(ctx, opts.Consumer, opts.StartAtHead)
	if err != nil {
		return stats, err
	}
	cur := off.Cursor
	stats.Cursor = cur
	w := NewWaiter(l, opts.PollInterval)
	for {
		limit := opts.Batch
		if opts.Limit > 0 && opts.Limit-stats.Delivered < limit {
			limit = opts.Limit - stats.Delivered
		}
		rows, heldBack, err := st.OutboxBatch(ctx, cur, limit)
		if err != nil {
			return stats, err
		}
		if len(rows) > 0 {
			// Invalidations of versions not published under the roll-out (shadow mode, R30)
			// never reach consumers; the offset moves past them all the same.
			published := rows[:0:0]
			for _, r := range rows {
				if !r.Shadow {
					published = append(published, r)
				}
			}
			if len(published) > 0 {
				if err := deliver(ctx, published); err != nil {
					return stats, fmt.Errorf("consumers: deliver to %s: %w", opts.Consumer, err)
				}
			}
			last := rows[len(rows)-1].Cursor
			if _, err := st.CommitConsumer(context.WithoutCancel(ctx), opts.Consumer, last, len(published)); err != nil {
				return stats, err
			}
			cur = last
			stats.Cursor, stats.Delivered, stats.Batches = cur, stats.Delivered+len(published), stats.Batches+1
			stats.Shadowed += len(rows) - len(published)
			if opts.Limit > 0 && stats.Delivered >= opts.Limit {
				return stats, nil
			}
			w.Delivered()
			continue
		}
		if !opts.Follow {
			return stats, nil
		}
		if opts.Idle != nil {
			opts.Idle()
		}
		woke, err := w.Wait(ctx, heldBack)
		if err != nil {
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				return stats, ctx.Err()
			}
			return stats, err
		}
		if woke {
			stats.Wakeups++
		} else {
			stats.Polls++
		}
	}
}
