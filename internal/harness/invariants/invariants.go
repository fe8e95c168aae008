// Package invariants checks SPEC R24 on a whole ledger, from the ledger's own tables: every
// guarded transition leaves a receipt, and receipts of one subscription are numbered in the
// order the subscription row's lock was taken (each transition updates the row before it
// inserts its receipt), so "after the close fence" and "after a newer session or generation"
// are questions about receipt order. The checks never trust the writers' bookkeeping.
package invariants

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Report counts violations of R24 (all must be zero) and what was checked.
type Report struct {
	Subscriptions int
	Versions      int
	Receipts      int

	// VersionRegressions: an accepted version (or revalidation) whose read ordinal is not
	// above the previous accepted one of the same subscription, i.e. an older read
	// overwrote a newer version.
	VersionRegressions int
	// AcceptedAfterClose: versions, revalidations or tombstone-pendings accepted after the
	// close fence of their generation (R19, R24).
	AcceptedAfterClose int
	// OutboxAfterClose: invalidations written after the close fence of their generation for a
	// version (tombstone and revocation invalidations are written at the fence).
	OutboxAfterClose int
	// NonActiveAcceptances: acceptances while the subscription was in any state other than
	// ACTIVE (DISCOVERED, SUBSCRIBING, RECONCILIATION_REQUIRED, TOMBSTONE_PENDING, or the
	// closing states) that AcceptedAfterClose does not already count (R16, R24). The state is
	// the one its receipts left it in: the last state-changing receipt before the acceptance.
	NonActiveAcceptances int
	// OldSessionAcceptances: acceptances carrying a session generation that had already lost
	// the subscription (R12): at or below the session a SESSION_CHANGED receipt fenced, or
	// below the session that replaced it — whether a newer session opened or the session just
	// ended (CloseSession, whose receipts name no new session).
	OldSessionAcceptances int
	// OldGenerationAcceptances: acceptances carrying a subscription generation older than one
	// already opened (R12).
	OldGenerationAcceptances int
	// OrphanOutbox: version invalidations without their accepted version (the two are written
	// in one statement).
	OrphanOutbox int
	// Examples describes up to ten violations.
	Examples []string
}

// Violations is the total of every violation counter.
func (r Report) Violations() int {
	return r.VersionRegressions + r.AcceptedAfterClose + r.OutboxAfterClose + r.NonActiveAcceptances +
		r.OldSessionAcceptances + r.OldGenerationAcceptances + r.OrphanOutbox
}

// String renders the report in one line.
func (r Report) String() string {
	s := fmt.Sprintf("subscriptions=%d versions=%d receipts=%d regressions=%d acceptedAfterClose=%d outboxAfterClose=%d nonActive=%d oldSession=%d oldGeneration=%d orphanOutbox=%d",
		r.Subscriptions, r.Versions, r.Receipts, r.VersionRegressions, r.AcceptedAfterClose, r.OutboxAfterClose,
		r.NonActiveAcceptances, r.OldSessionAcceptances, r.OldGenerationAcceptances, r.OrphanOutbox)
	if len(r.Examples) > 0 {
		s += "; e.g. " + strings.Join(r.Examples, "; ")
	}
	return s
}

// acceptKinds are the receipts that changed a subscription's watermark or state on behalf of
// a read.
const acceptKinds = `('ACCEPTED', 'REVALIDATED', 'TOMBSTONE_PENDING')`

// closeKinds are the receipts of a close fence: an unsubscribe's, or a confirmed tombstone's
// (ConfirmTombstone passes the fence in the statement that writes the tombstone).
const closeKinds = `('CLOSE_FENCE', 'TOMBSTONE_CONFIRMED')`

// stateKinds are the receipts written while the subscription row is locked by a transition
// that sets its state (every acceptance kind among them); activeKinds are those after which
// the subscription is ACTIVE. Every other receipt (refusals, audits) records no state.
const (
	stateKinds = `('SUBSCRIPTION_OPENED', 'SUBSCRIBING', 'ACTIVATED', 'TOMBSTONE_CLEARED', 'RECONCILIATION_REQUIRED',
		'SESSION_CHANGED', 'CLOSE_FENCE', 'TOMBSTONE_CONFIRMED', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED', 'CLOSED_WITH_SESSION',
		'ACCEPTED', 'REVALIDATED', 'TOMBSTONE_PENDING')`
	activeKinds = `('ACTIVATED', 'TOMBSTONE_CLEARED', 'ACCEPTED', 'REVALIDATED')`
)

// checks are the violation queries; each returns one row per violation as a description.
var checks = []struct {
	name  string
	field func(*Report) *int
	query string
}{
	{"version regression", func(r *Report) *int { return &r.VersionRegressions }, `
		SELECT format('subscription %s: %s at ordinal %s after ordinal %s', subscription_id, kind, read_ordinal, prev)
		FROM (SELECT subscription_id, kind, read_ordinal,
		             lag(read_ordinal) OVER (PARTITION BY subscription_id ORDER BY id) AS prev
		      FROM receipts WHERE kind IN ` + acceptKinds + `) x
		WHERE prev IS NOT NULL AND read_ordinal <= prev`},
	{"accepted after close", func(r *Report) *int { return &r.AcceptedAfterClose }, `
		SELECT format('subscription %s generation %s: %s of ordinal %s after the close fence (receipt %s > %s)',
		              a.subscription_id, a.generation, a.kind, a.read_ordinal, a.id, c.id)
		FROM receipts a JOIN LATERAL (SELECT c.id FROM receipts c WHERE c.subscription_id = a.subscription_id
		     AND c.generation = a.generation AND c.kind IN ` + closeKinds + ` AND c.id < a.id ORDER BY c.id LIMIT 1) c ON true
		WHERE a.kind IN ` + acceptKinds},
	{"non-ACTIVE acceptance", func(r *Report) *int { return &r.NonActiveAcceptances }, `
		SELECT format('subscription %s generation %s: %s of ordinal %s after %s (receipt %s), i.e. while not ACTIVE',
		              x.subscription_id, x.generation, x.kind, x.read_ordinal, coalesce(x.prev, 'no state receipt'), x.id)
		FROM (SELECT id, subscription_id, generation, kind, read_ordinal,
		             lag(kind) OVER (PARTITION BY subscription_id ORDER BY id) AS prev
		      FROM receipts WHERE kind IN ` + stateKinds + ` AND subscription_id IS NOT NULL) x
		WHERE x.kind IN ` + acceptKinds + ` AND (x.prev IS NULL OR x.prev NOT IN ` + activeKinds + `)
		  AND NOT EXISTS (SELECT 1 FROM receipts c WHERE c.subscription_id = x.subscription_id
		                  AND c.generation = x.generation AND c.kind IN ` + closeKinds + ` AND c.id < x.id)`},
	{"outbox after close", func(r *Report) *int { return &r.OutboxAfterClose }, `
		SELECT format('subscription %s: invalidation of ordinal %s written after the close fence of generation %s',
		              o.subscription_id, o.read_ordinal, v.generation)
		FROM invalidation_outbox o
		JOIN resource_versions v ON v.subscription_id = o.subscription_id AND v.read_ordinal = o.read_ordinal AND v.kind = 'content'
		JOIN receipts a ON a.subscription_id = o.subscription_id AND a.read_ordinal = o.read_ordinal AND a.kind = 'ACCEPTED'
		WHERE o.kind = 'version' AND EXISTS (SELECT 1 FROM receipts c WHERE c.subscription_id = o.subscription_id
		      AND c.generation = v.generation AND c.kind IN ` + closeKinds + ` AND c.id < a.id)`},
	{"old-session acceptance", func(r *Report) *int { return &r.OldSessionAcceptances }, `
		SELECT format('subscription %s: %s at session %s after session %s lost it (receipt %s, new session %s)',
		              a.subscription_id, a.kind, a.session_generation, s.session_generation, s.id,
		              coalesce(nullif(s.detail->>'new_session_generation', '0'), 'none: the session ended'))
		FROM receipts a JOIN LATERAL (SELECT s.id, s.session_generation, s.detail FROM receipts s
		     WHERE s.subscription_id = a.subscription_id AND s.kind = 'SESSION_CHANGED' AND s.id < a.id
		       AND a.session_generation < greatest(coalesce((s.detail->>'new_session_generation')::bigint, 0), s.session_generation + 1)
		     ORDER BY s.id LIMIT 1) s ON true
		WHERE a.kind IN ` + acceptKinds},
	{"old-generation acceptance", func(r *Report) *int { return &r.OldGenerationAcceptances }, `
		SELECT format('subscription %s: %s of generation %s after generation %s opened',
		              a.subscription_id, a.kind, a.generation, g.generation)
		FROM receipts a JOIN receipts g ON g.subscription_id = a.subscription_id AND g.kind = 'SUBSCRIPTION_OPENED'
		     AND g.id < a.id AND g.generation > a.generation
		WHERE a.kind IN ` + acceptKinds},
	{"orphan invalidation", func(r *Report) *int { return &r.OrphanOutbox }, `
		SELECT format('invalidation %s of subscription %s ordinal %s has no accepted version', o.id, o.subscription_id, o.read_ordinal)
		FROM invalidation_outbox o
		WHERE o.kind = 'version' AND NOT EXISTS (SELECT 1 FROM resource_versions v
			WHERE v.subscription_id = o.subscription_id AND v.read_ordinal = o.read_ordinal AND v.digest = o.digest)`},
}

// Check evaluates every R24 check on the ledger behind pool.
func Check(ctx context.Context, pool *pgxpool.Pool) (Report, error) {
	var r Report
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM subscriptions), (SELECT count(*) FROM resource_versions),
		(SELECT count(*) FROM receipts)`).Scan(&r.Subscriptions, &r.Versions, &r.Receipts); err != nil {
		return r, fmt.Errorf("invariants: counting: %w", err)
	}
	for _, c := range checks {
		rows, err := pool.Query(ctx, c.query)
		if err != nil {
			return r, fmt.Errorf("invariants: %s: %w", c.name, err)
		}
		for rows.Next() {
			var desc string
			if err := rows.Scan(&desc); err != nil {
				rows.Close()
				return r, fmt.Errorf("invariants: %s: %w", c.name, err)
			}
			*c.field(&r)++
			if len(r.Examples) < 10 {
				r.Examples = append(r.Examples, c.name+": "+desc)
			}
		}
		if err := rows.Err(); err != nil {
			return r, fmt.Errorf("invariants: %s: %w", c.name, err)
		}
	}
	return r, nil
}
