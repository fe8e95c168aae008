package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// CapabilityReceipt is what a session negotiated (R1): the protocol version, the resources
// capability and its two independent sub-capabilities, the snapshot-ID extension (R5) and the
// server's implementation name and version.
type CapabilityReceipt struct {
	ProtocolVersion string
	Resources       bool
	Subscribe       bool
	ListChanged     bool
	SnapshotIDs     bool
	ServerName      string
	ServerVersion   string
	Raw             json.RawMessage // the server's capabilities object as received, if known
}

// Session is one MCP connection of a source: its generation, the queue of the worker that
// holds it, and its capability receipt.
type Session struct {
	SourceID   int64
	Generation int64
	HostQueue  string
	Caps       CapabilityReceipt
	StartedAt  time.Time
	EndedAt    *time.Time
	EndReason  string
}

// LiveSubscription names a subscription that is not CLOSED, for signalling its workflow.
type LiveSubscription struct {
	ID         int64
	WorkflowID string
	State      mcpsync.State
}

// OpenSession allocates the next session generation of a source for a new connection and
// stores its capability receipt, in one transaction that also fences every older session
// (R12): the previous session ends; subscriptions that were SUBSCRIBING, ACTIVE or
// TOMBSTONE_PENDING move to RECONCILIATION_REQUIRED (their notifications may have been lost,
// and reads of the old session can no longer be accepted); subscriptions whose unsubscribe was
// in flight or unknown are CLOSED, because the session that carried them is gone (R20). It
// fails with ErrLeaseLost unless hostQueue holds an unexpired lease on the source and the
// source is not removed (issue 12, defect 6: the WHERE of the generation bump carries the
// lease, so a host whose lease expired while it was cut off can never open a generation next
// to the new holder's). It returns the new session and every live subscription of the
// source, to be told SessionChanged.
func (s *Store) OpenSession(ctx context.Context, sourceID int64, hostQueue string, caps CapabilityReceipt) (Session, []LiveSubscription, error) {
	var sess Session
	var live []LiveSubscription
	caps = safeCaps(caps)
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var gen int64
		err := tx.QueryRow(ctx, `UPDATE sources SET current_generation = current_generation + 1
			WHERE id = $1 AND host_queue = $2 AND lease_until > now() AND removed_at IS NULL
			RETURNING current_generation`, sourceID, hostQueue).Scan(&gen)
		if err == pgx.ErrNoRows {
			return fmt.Errorf("source %d, host %s: %w", sourceID, hostQueue, ErrLeaseLost)
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE sessions SET ended_at = now(), end_reason = 'superseded'
			WHERE source_id = $1 AND ended_at IS NULL`, sourceID); err != nil {
			return err
		}
		raw := caps.Raw
		if err := tx.QueryRow(ctx, `INSERT INTO sessions (source_id, generation, host_queue,
				protocol_version, cap_resources, cap_subscribe, cap_list_changed, cap_snapshot_ids,
				server_name, server_version, capabilities)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING started_at`,
			sourceID, gen, hostQueue, caps.ProtocolVersion, caps.Resources, caps.Subscribe,
			caps.ListChanged, caps.SnapshotIDs, caps.ServerName, caps.ServerVersion, raw).Scan(&sess.StartedAt); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, session_generation, detail)
			VALUES ($1, 'SESSION_OPENED', $2, $3, jsonb_build_object('host_queue', $4::text))`,
			fmt.Sprintf("session-open/%d/%d", sourceID, gen), sourceID, gen, hostQueue); err != nil {
			return err
		}
		if err := fenceOldSessions(ctx, tx, sourceID, gen, gen, fmt.Sprintf("session changed to generation %d", gen)); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT id, workflow_id, state FROM subscriptions
			WHERE source_id = $1 AND state <> 'CLOSED' ORDER BY id`, sourceID)
		if err != nil {
			return err
		}
		live, err = pgx.CollectRows(rows, pgx.RowToStructByPos[LiveSubscription])
		if err != nil {
			return err
		}
		sess.SourceID, sess.Generation, sess.HostQueue, sess.Caps = sourceID, gen, hostQueue, caps
		return nil
	})
	if err != nil {
		return Session{}, nil, fmt.Errorf("ledger: open session: %w", err)
	}
	return sess, live, nil
}

// safeCaps returns caps with every server-supplied string made storable (SafeText, SafeJSON):
// a server's serverInfo or capabilities must never make OpenSession fail.
func safeCaps(caps CapabilityReceipt) CapabilityReceipt {
	caps.ProtocolVersion = SafeText(caps.ProtocolVersion)
	caps.ServerName = SafeText(caps.ServerName)
	caps.ServerVersion = SafeText(caps.ServerVersion)
	caps.Raw = SafeJSON(caps.Raw)
	return caps
}

// fenceOldSessions moves every subscription of the source bound to a session generation below
// below out of the states in which that session could still change them (R12, R20), writing
// one receipt per subscription moved, in one statement. newGen names the session that replaced
// them (0 when the session just ended).
func fenceOldSessions(ctx context.Context, tx pgx.Tx, sourceID, below, newGen int64, reason string) error {
	_, err := tx.Exec(ctx, `
		WITH moved AS (
			UPDATE subscriptions SET
				state = CASE WHEN state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN') THEN 'CLOSED'
				             ELSE 'RECONCILIATION_REQUIRED' END,
				ended_at = CASE WHEN state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN') THEN now()
				                ELSE ended_at END,
				state_reason = CASE WHEN state IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN')
				                    THEN 'session ended; its subscriptions ended with it'
				                    ELSE $3 END,
				updated_at = now()
			WHERE source_id = $1 AND session_generation < $2
			  AND state IN ('SUBSCRIBING', 'ACTIVE', 'TOMBSTONE_PENDING', 'UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN')
			RETURNING id, state, generation, session_generation, uri)
		INSERT INTO receipts (kind, source_id, subscription_id, generation, session_generation, uri, detail)
		SELECT CASE WHEN state = 'CLOSED' THEN 'CLOSED_WITH_SESSION' ELSE 'SESSION_CHANGED' END,
		       $1, id, generation, session_generation, uri,
		       jsonb_build_object('new_session_generation', $4::bigint, 'state', state)
		FROM moved`, sourceID, below, reason, newGen)
	return err
}

// EndSession records that a session's connection ended; see CloseSession. Ending a session
// twice, or one that a newer session already superseded, does nothing.
func (s *Store) EndSession(ctx context.Context, sourceID, generation int64, reason string) error {
	_, err := s.CloseSession(ctx, sourceID, generation, reason)
	return err
}

// CloseSession ends session generation generation of a source, only if it is the source's
// current, live session (R12): in one transaction it marks the session ended, writes its
// SESSION_ENDED receipt and fences its subscriptions as OpenSession does — live ones need
// reconciliation, in-flight or unknown unsubscribes are CLOSED (R20). It returns Transitioned;
// AlreadyDone when that session had already ended; OldSession when a newer session superseded
// it; Refused for a generation the source never had. Only Transitioned writes anything.
func (s *Store) CloseSession(ctx context.Context, sourceID, generation int64, reason string) (mcpsync.Outcome, error) {
	var out mcpsync.Outcome
	reason = SafeText(reason) // often a server's or transport's error text
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE sessions se SET ended_at = now(), end_reason = $3
			FROM sources so
			WHERE se.source_id = $1 AND se.generation = $2 AND se.ended_at IS NULL
			  AND so.id = se.source_id AND so.current_generation = $2`, sourceID, generation, reason)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			var current int64
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT so.current_generation,
					EXISTS (SELECT 1 FROM sessions WHERE source_id = $1 AND generation = $2)
				FROM sources so WHERE so.id = $1`, sourceID, generation).Scan(&current, &exists); err != nil {
				return notFound(err, fmt.Sprintf("source %d", sourceID))
			}
			switch {
			case !exists:
				out = mcpsync.OutcomeRefused
			case generation < current:
				out = mcpsync.OutcomeOldSession
			default:
				out = mcpsync.OutcomeAlreadyDone
			}
			return nil
		}
		out = mcpsync.OutcomeTransitioned
		if _, err := tx.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, session_generation, detail)
			VALUES ($1, 'SESSION_ENDED', $2, $3, jsonb_build_object('reason', $4::text))`,
			fmt.Sprintf("session-end/%d/%d", sourceID, generation), sourceID, generation, reason); err != nil {
			return err
		}
		// Everything bound to this generation or older loses its session.
		return fenceOldSessions(ctx, tx, sourceID, generation+1, 0, "session ended: "+reason)
	})
	if err != nil {
		return "", fmt.Errorf("ledger: end session %d/%d: %w", sourceID, generation, err)
	}
	return out, nil
}

// CurrentSession returns the source's newest session if it is still live, or ErrNoSession.
func (s *Store) CurrentSession(ctx context.Context, sourceID int64) (Session, error) {
	sp, err := s.CurrentSessionAndPeriods(ctx, sourceID)
	return sp.Session, err
}

// SessionAndPeriods is a source's live session with the source's refresh periods and
// definition version as they are when it is read.
type SessionAndPeriods struct {
	Session
	BackstopSeconds, PollSeconds int
	DefinitionVersion            int64
}

// CurrentSessionAndPeriods is CurrentSession with the source's periods and definition version,
// read by the same statement (a subscription establishing itself needs both: one round trip).
func (s *Store) CurrentSessionAndPeriods(ctx context.Context, sourceID int64) (SessionAndPeriods, error) {
	var sp SessionAndPeriods
	sess := &sp.Session
	var raw []byte
	err := s.pool.QueryRow(ctx, `SELECT se.source_id, se.generation, se.host_queue,
			se.protocol_version, se.cap_resources, se.cap_subscribe, se.cap_list_changed,
			se.cap_snapshot_ids, se.server_name, se.server_version, se.capabilities,
			se.started_at, se.ended_at, coalesce(se.end_reason, ''),
			so.backstop_seconds, so.poll_seconds, so.definition_version
		FROM sources so JOIN sessions se ON se.source_id = so.id AND se.generation = so.current_generation
		WHERE so.id = $1`, sourceID).Scan(&sess.SourceID, &sess.Generation, &sess.HostQueue,
		&sess.Caps.ProtocolVersion, &sess.Caps.Resources, &sess.Caps.Subscribe,
		&sess.Caps.ListChanged, &sess.Caps.SnapshotIDs, &sess.Caps.ServerName,
		&sess.Caps.ServerVersion, &raw, &sess.StartedAt, &sess.EndedAt, &sess.EndReason,
		&sp.BackstopSeconds, &sp.PollSeconds, &sp.DefinitionVersion)
	if err == pgx.ErrNoRows {
		return SessionAndPeriods{}, fmt.Errorf("ledger: source %d: %w", sourceID, ErrNoSession)
	}
	if err != nil {
		return SessionAndPeriods{}, fmt.Errorf("ledger: current session of source %d: %w", sourceID, err)
	}
	if sess.EndedAt != nil {
		return sp, fmt.Errorf("ledger: source %d generation %d ended (%s): %w", sourceID, sess.Generation, sess.EndReason, ErrNoSession)
	}
	sess.Caps.Raw = raw
	return sp, nil
}
