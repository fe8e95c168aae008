package ledger

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Reestablished returns those of the subscriptions ids that no longer wait to re-establish
// on session generation gen of their source (or a later one): ACTIVE or otherwise past
// subscribing on generation gen or later, or closing or closed on any generation. A
// subscription that is SUBSCRIBING or RECONCILIATION_REQUIRED, or still bound to an older
// generation, is not returned. One statement for all ids (ordered by id), so that a host pacing the
// SessionChanged signals of a new session (mcphost) checks a whole window at once. The
// answer is advisory (it fences nothing): the subscription's own transitions carry the fences.
func (s *Store) Reestablished(ctx context.Context, gen int64, ids []int64) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	waiting := []string{string(mcpsync.StateSubscribing), string(mcpsync.StateReconciliationRequired)}
	closing := []string{string(mcpsync.StateUnsubscribing), string(mcpsync.StateUnsubscribeUnknown), string(mcpsync.StateClosed)}
	rows, err := s.pool.Query(ctx, `SELECT id FROM subscriptions
		WHERE id = ANY($1)
		  AND ((session_generation >= $2 AND state <> ALL($3)) OR state = ANY($4))
		ORDER BY id`, ids, gen, waiting, closing)
	if err != nil {
		return nil, fmt.Errorf("ledger: reestablished subscriptions: %w", err)
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("ledger: reestablished subscriptions: %w", err)
		}
		out = append(out, id)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: reestablished subscriptions: %w", err)
	}
	return out, nil
}

// Watching returns the subscriptions of the source bound to session generation gen whose
// server URI is one of serverURIs and that are subscribing or live (SUBSCRIBING, ACTIVE,
// TOMBSTONE_PENDING), ordered by id: the ones a 2026-07-28 listen stream of that session
// carried, told of its end (issue 13 item 4). Advisory like Reestablished: each told
// subscription's own transitions carry the fences.
func (s *Store) Watching(ctx context.Context, sourceID, gen int64, serverURIs []string) ([]LiveSubscription, error) {
	if len(serverURIs) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT id, workflow_id, state FROM subscriptions
		WHERE source_id = $1 AND session_generation = $2 AND server_uri = ANY($3)
		  AND state IN ('SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING')
		ORDER BY id`, sourceID, gen, serverURIs)
	if err != nil {
		return nil, fmt.Errorf("ledger: watching subscriptions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LiveSubscription, error) {
		var l LiveSubscription
		err := r.Scan(&l.ID, &l.WorkflowID, &l.State)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: watching subscriptions: %w", err)
	}
	return out, nil
}
