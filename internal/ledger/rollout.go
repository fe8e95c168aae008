package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Roll-out modes (R30).
const (
	// RolloutShadow: scans, subscriptions, reads and every fence run, but no version reaches a
	// consumer (get refuses, outbox consumers skip version and tombstone invalidations).
	RolloutShadow = "shadow"
	// RolloutLive: versions of subscriptions inside the refresh percentage reach consumers.
	RolloutLive = "live"
)

// ErrNotPublished: the subscription's versions do not reach consumers under the current
// roll-out (shadow mode, or outside the refresh percentage).
var ErrNotPublished = errors.New("ledger: not published under the current roll-out")

// Rollout is the roll-out state, and what it kept: a roll-back changes only who sees
// versions, never the ledger's watermarks or close receipts.
type Rollout struct {
	Mode           string
	RefreshPercent int
	Reason         string
	UpdatedAt      time.Time
	// Watermarks and CloseReceipts count the subscriptions with an accepted watermark and the
	// close-fence receipts now; a roll-back leaves both as they were.
	Watermarks    int64
	CloseReceipts int64
}

// Rollout returns the current roll-out state.
func (s *Store) Rollout(ctx context.Context) (Rollout, error) {
	var r Rollout
	err := s.pool.QueryRow(ctx, `SELECT mode, refresh_percent, reason, updated_at,
			(SELECT count(*) FROM subscriptions WHERE last_accepted_ordinal > 0),
			(SELECT count(*) FROM receipts WHERE kind = 'CLOSE_FENCE')
		FROM rollout`).Scan(&r.Mode, &r.RefreshPercent, &r.Reason, &r.UpdatedAt, &r.Watermarks, &r.CloseReceipts)
	if err != nil {
		return Rollout{}, fmt.Errorf("ledger: rollout: %w", err)
	}
	return r, nil
}

// SetRollout changes the roll-out mode and refresh percentage in one transaction that also
// records the change, with the watermark and close-receipt counts it kept, in the history.
// It touches no subscription, watermark, dispatch or receipt: old reads keep their fences.
func (s *Store) SetRollout(ctx context.Context, mode string, percent int, reason string) (Rollout, error) {
	if (mode != RolloutShadow && mode != RolloutLive) || percent < 0 || percent > 100 {
		return Rollout{}, fmt.Errorf("ledger: rollout mode %q percent %d: %w", mode, percent, ErrInvalid)
	}
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE rollout SET mode = $1, refresh_percent = $2, reason = $3, updated_at = now()`, mode, percent, reason); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO rollout_history (mode, refresh_percent, reason, watermarks, close_receipts)
			SELECT $1, $2, $3, (SELECT count(*) FROM subscriptions WHERE last_accepted_ordinal > 0),
			       (SELECT count(*) FROM receipts WHERE kind = 'CLOSE_FENCE')`, mode, percent, reason)
		return err
	})
	if err != nil {
		return Rollout{}, fmt.Errorf("ledger: set rollout: %w", err)
	}
	return s.Rollout(ctx)
}

// Published reports whether a subscription's versions reach consumers now.
func (s *Store) Published(ctx context.Context, workflowID string) (bool, error) {
	var ok bool
	if err := s.pool.QueryRow(ctx, `SELECT mcpsync_published($1)`, workflowID).Scan(&ok); err != nil {
		return false, fmt.Errorf("ledger: published: %w", err)
	}
	return ok, nil
}
