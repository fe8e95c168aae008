package consumers

import (
	"context"
	"time"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Waiter paces a reader that follows the outbox. After a read that found no rows the reader
// calls Wait: it returns at the next notification, after at most the poll interval, or, when
// the read reported rows held back behind a still-running older transaction, after a short
// retry that doubles up to the poll interval (that transaction's end may notify nobody).
// Without a listener it sleeps for the same times.
type Waiter struct {
	l     *ledger.OutboxListener
	poll  time.Duration
	retry time.Duration
}

// NewWaiter returns a Waiter on l (nil: no notifications, only the poll and the retries) with
// the poll interval poll.
func NewWaiter(l *ledger.OutboxListener, poll time.Duration) *Waiter {
	return &Waiter{l: l, poll: poll, retry: heldBackRetry}
}

// Delivered notes that a read returned rows: the next held-back retry starts short again.
func (w *Waiter) Delivered() { w.retry = heldBackRetry }

// Wait waits as the type's comment says and reports whether a notification woke it. It
// returns ctx's error when ctx ends, and the listener's error when its connection failed
// (the listener is unusable then).
func (w *Waiter) Wait(ctx context.Context, heldBack bool) (bool, error) {
	wait := w.poll
	if heldBack {
		// Committed rows wait behind an older transaction that will end soon.
		wait, w.retry = min(w.retry, w.poll), min(w.retry*2, w.poll)
	} else {
		w.retry = heldBackRetry
	}
	if w.l != nil {
		return w.l.Wait(ctx, wait)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, ctx.Err()
	case <-t.C:
		return false, nil
	}
}
