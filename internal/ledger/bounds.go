package ledger

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Bounds against a hostile server (issue 14 item 6): what a server says is bounded before it
// reaches a Temporal payload (activity inputs and results, signals, failures: 2 MB each, and
// every byte of them kept in history) or the ledger's notification fan-out.

// MaxPayloadString is the longest server-supplied string (server name, MIME type, snapshot ID,
// URI in a signal, error message) that reaches a Temporal payload; longer ones go through
// Bounded.
const MaxPayloadString = 4 << 10

// boundedMin is the smallest bound Bounded honours: the digest suffix must fit.
const boundedMin = 128

// Bounded returns s when it is at most limit bytes long; otherwise a prefix of s cut at a UTF-8
// boundary, followed by "…[sha256:<hex of the whole s>, <N> bytes]", at most limit bytes
// in all. The same string is always bounded the same way, and two different long strings stay
// different (their digests differ), so comparing bounded strings compares the originals
// (barring a short string that spells a long one's bounded form). A limit below 128 is taken
// as 128.
func Bounded(s string, limit int) string {
	limit = max(limit, boundedMin)
	if len(s) <= limit {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	suffix := "…[sha256:" + hex.EncodeToString(sum[:]) + ", " + strconv.Itoa(len(s)) + " bytes]"
	return mcpsync.CutAtRune(s, limit-len(suffix)) + suffix
}

// BoundedText is Bounded(SafeText(s), MaxPayloadString): a server string fit for both a
// Temporal payload and a text column, at most MaxPayloadString bytes.
func BoundedText(s string) string { return Bounded(SafeText(s), MaxPayloadString) }

// Overflow is a burst of notifications/resources/updated that the session host did not queue
// one by one because its per-session queue was full: Dropped notifications arrived with
// sequence numbers FirstSeq..LastSeq on the session of SessionGeneration. Nothing of them is
// lost: every live subscription of the source is told to re-read.
type Overflow struct {
	SourceID          int64
	SessionGeneration int64
	FirstSeq          int64
	LastSeq           int64
	Dropped           int64
	QueueCap          int
}

// OverflowTarget is a subscription an overflow must be signalled to, with the server URI the
// signal names.
type OverflowTarget struct {
	SubscriptionID int64
	WorkflowID     string
	Generation     int64
	State          mcpsync.State
	ServerURI      string
}

// RecordNotificationOverflow records a notification queue overflow (issue 14 item 6) in one
// statement: one NOTIFICATION_OVERFLOW audit receipt (idempotent on source, session generation
// and last sequence number) and, only while the overflow's session is the source's current
// one (the source row locked FOR SHARE, as RecordNotification does, R12), the last sequence
// number on every subscription of the source that is not closing (R19) and has not recorded a
// later one; those subscriptions are returned, to be signalled as if each had been notified
// at LastSeq, so each re-reads its resource. A retry after a lost reply writes nothing new and
// returns the same subscriptions again (the pair it recorded is equal, not below).
func (s *Store) RecordNotificationOverflow(ctx context.Context, o Overflow) ([]OverflowTarget, error) {
	if o.Dropped <= 0 || o.FirstSeq > o.LastSeq {
		return nil, fmt.Errorf("ledger: notification overflow %+v: %w", o, ErrInvalid)
	}
	rows, err := s.pool.Query(ctx, `
		WITH so AS MATERIALIZED (
			SELECT id FROM sources WHERE id = $1 AND current_generation = $2 FOR SHARE),
		t AS (
			UPDATE subscriptions s SET last_notification_gen = $2, last_notification_seq = $4
			FROM so
			WHERE s.source_id = so.id
			  AND s.state NOT IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED')
			  AND (s.last_notification_gen, s.last_notification_seq) <= ($2::bigint, $4::bigint)
			RETURNING s.id, s.workflow_id, s.generation, s.state, s.server_uri),
		a AS (
			INSERT INTO receipts (idem_key, kind, source_id, session_generation, detail)
			VALUES ('notification-overflow/' || $1::bigint || '/' || $2::bigint || '/' || $4::bigint, $7, $1, $2,
			        jsonb_build_object('first_seq', $3::bigint, 'last_seq', $4::bigint, 'dropped', $5::bigint,
			                           'queue_cap', $6::int, 'current', EXISTS (SELECT 1 FROM so),
			                           'subscriptions', (SELECT count(*) FROM t)))
			ON CONFLICT (idem_key) DO NOTHING)
		SELECT id, workflow_id, generation, state, server_uri FROM t`,
		o.SourceID, o.SessionGeneration, o.FirstSeq, o.LastSeq, o.Dropped, o.QueueCap, mcpsync.ReceiptNotificationOverflow)
	if err != nil {
		return nil, fmt.Errorf("ledger: record notification overflow: %w", err)
	}
	targets, err := pgx.CollectRows(rows, pgx.RowToStructByPos[OverflowTarget])
	if err != nil {
		return nil, fmt.Errorf("ledger: record notification overflow: %w", err)
	}
	return targets, nil
}
