package ledger

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Notification is a notifications/resources/updated as the session host saw it: the session
// generation it arrived on, the host's per-session sequence number, the normalized URI and the
// URI string the server sent.
type Notification struct {
	SourceID          int64
	SessionGeneration int64
	Seq               int64
	URI               string // normalized
	ServerURI         string
}

// NotificationTarget is a subscription a notification must be signalled to.
type NotificationTarget struct {
	SubscriptionID int64
	WorkflowID     string
	Generation     int64
	State          mcpsync.State
}

// auditNotificationRecordedFmt is the idempotency key of a notification's audit receipt.
const auditNotificationRecordedFmt = "notification/%d/%d/%d"

// RecordNotification matches a notification to the subscriptions of its source and URI and
// records (session generation, sequence) on each, in one statement, only when the notification
// comes from the source's current session and the subscription is not closing (R12, R19). It
// returns the subscriptions to signal. It is idempotent: the session host retries it when the
// reply to its commit is lost, and a retry of the same (source, session generation, sequence
// number, URI) finds the pair it recorded and returns the same targets again, recording
// nothing new, so the retry still routes the signal (a workflow ignores a signal whose
// sequence number it has already seen). The sequence number is per session, so an equal pair
// on the subscription's row can only be this notification's. A notification that matches none
// is not dropped silently: one audit receipt says why (old session, unknown URI, closed
// subscription, or a sequence number below the last one recorded) and the returned audit kind
// names it. The source row is locked FOR SHARE with the generation check, so a new session
// committing concurrently (OpenSession updates that row) is seen: the statement waits for it
// and then finds the generation moved on, and an old session's notification routes nothing.
func (s *Store) RecordNotification(ctx context.Context, n Notification) (targets []NotificationTarget, audit mcpsync.ReceiptKind, err error) {
	rows, err := s.pool.Query(ctx, `
		WITH so AS MATERIALIZED (
			SELECT id FROM sources WHERE id = $1 AND current_generation = $2 FOR SHARE)
		UPDATE subscriptions s SET last_notification_gen = $2, last_notification_seq = $3
		FROM so
		WHERE s.source_id = $1 AND s.uri = $4 AND so.id = s.source_id
		  AND s.state NOT IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED')
		  AND (s.last_notification_gen, s.last_notification_seq) <= ($2::bigint, $3::bigint)
		RETURNING s.id, s.workflow_id, s.generation, s.state`, n.SourceID, n.SessionGeneration, n.Seq, n.URI)
	if err != nil {
		return nil, "", fmt.Errorf("ledger: record notification: %w", err)
	}
	targets, err = pgx.CollectRows(rows, pgx.RowToStructByPos[NotificationTarget])
	if err != nil {
		return nil, "", fmt.Errorf("ledger: record notification: %w", err)
	}
	if len(targets) > 0 {
		return targets, "", nil
	}
	var current int64
	var total, open int
	if err := s.pool.QueryRow(ctx, `SELECT so.current_generation,
			count(s.id), count(s.id) FILTER (WHERE s.state NOT IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED'))
		FROM sources so LEFT JOIN subscriptions s ON s.source_id = so.id AND s.uri = $2
		WHERE so.id = $1 GROUP BY so.current_generation`, n.SourceID, n.URI).Scan(&current, &total, &open); err != nil {
		return nil, "", notFound(err, fmt.Sprintf("ledger: source %d", n.SourceID))
	}
	switch {
	case n.SessionGeneration != current:
		audit = mcpsync.ReceiptNotificationOld
	case total == 0:
		audit = mcpsync.ReceiptNotificationUnknown
	case open == 0:
		audit = mcpsync.ReceiptNotificationClosed
	default:
		audit = mcpsync.ReceiptNotificationOrder
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, session_generation, uri, detail)
		VALUES ($1, $2, $3, $4, $5, jsonb_build_object('seq', $6::bigint, 'server_uri', $7::text, 'current_generation', $8::bigint))
		ON CONFLICT (idem_key) DO NOTHING`,
		fmt.Sprintf(auditNotificationRecordedFmt, n.SourceID, n.SessionGeneration, n.Seq), audit,
		n.SourceID, n.SessionGeneration, n.URI, n.Seq, n.ServerURI, current)
	if err != nil {
		return nil, audit, fmt.Errorf("ledger: audit notification: %w", err)
	}
	return nil, audit, nil
}

// RecordNotifications records notifications that arrived on one session (sourceID,
// sessionGen) in one statement, as RecordNotification records each of them in turn: on every
// subscription of the source and a notification's URI (normalized) that is not closing, only
// while sessionGen is the source's current session (the source row locked FOR SHARE, R12,
// R19) and while the subscription has not recorded a later (session generation, sequence
// number), it records the pair. Where several of ns name one URI, the one with the highest
// sequence number is recorded: taken in order, each would have recorded its pair over the one
// before. It returns, per URI, the subscriptions to signal. A URI that matched nothing is
// absent and nothing is written for it: the caller records that notification alone
// (RecordNotification), which writes the audit receipt that says why. A retry after a lost
// reply returns the same subscriptions (the recorded pairs are equal, not below) and writes
// nothing new. The subscription rows are locked in ID order, so that two statements that
// update several of the same rows wait for each other instead of deadlocking.
func (s *Store) RecordNotifications(ctx context.Context, sourceID, sessionGen int64, ns []Notification) (map[string][]NotificationTarget, error) {
	latest := map[string]int64{}
	for _, n := range ns {
		if n.SourceID != sourceID || n.SessionGeneration != sessionGen {
			return nil, fmt.Errorf("ledger: record notifications of source %d session %d: one of source %d session %d: %w",
				sourceID, sessionGen, n.SourceID, n.SessionGeneration, ErrInvalid)
		}
		if seq, ok := latest[n.URI]; !ok || n.Seq > seq {
			latest[n.URI] = n.Seq
		}
	}
	uris, seqs := make([]string, 0, len(latest)), make([]int64, 0, len(latest))
	for u, seq := range latest {
		uris, seqs = append(uris, u), append(seqs, seq)
	}
	rows, err := s.pool.Query(ctx, `
		WITH so AS MATERIALIZED (
			SELECT id FROM sources WHERE id = $1 AND current_generation = $2 FOR SHARE),
		n AS (SELECT * FROM unnest($3::text[], $4::bigint[]) AS n(uri, seq)),
		l AS MATERIALIZED (
			SELECT s.id, n.seq FROM subscriptions s JOIN n ON s.uri = n.uri JOIN so ON so.id = s.source_id
			WHERE s.source_id = $1
			ORDER BY s.id FOR NO KEY UPDATE OF s)
		UPDATE subscriptions s SET last_notification_gen = $2, last_notification_seq = l.seq
		FROM l
		WHERE s.id = l.id
		  AND s.state NOT IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED')
		  AND (s.last_notification_gen, s.last_notification_seq) <= ($2::bigint, l.seq)
		RETURNING s.uri, s.id, s.workflow_id, s.generation, s.state`, sourceID, sessionGen, uris, seqs)
	if err != nil {
		return nil, fmt.Errorf("ledger: record notifications: %w", err)
	}
	targets := map[string][]NotificationTarget{}
	var u string
	var t NotificationTarget
	_, err = pgx.ForEachRow(rows, []any{&u, &t.SubscriptionID, &t.WorkflowID, &t.Generation, &t.State}, func() error {
		targets[u] = append(targets[u], t)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: record notifications: %w", err)
	}
	for _, ts := range targets {
		slices.SortFunc(ts, func(a, b NotificationTarget) int { return cmp.Compare(a.SubscriptionID, b.SubscriptionID) })
	}
	return targets, nil
}

// AuditCount returns how many receipts of kind exist for a source (0 = all sources).
func (s *Store) AuditCount(ctx context.Context, sourceID int64, kind mcpsync.ReceiptKind) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM receipts WHERE kind = $1 AND ($2 = 0 OR source_id = $2)`, kind, sourceID).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("ledger: count receipts: %w", err)
	}
	return n, nil
}

// AuditMalformedNotification records a notification whose URI could not be normalized: it
// matches nothing and causes no action, but it is not dropped silently.
func (s *Store) AuditMalformedNotification(ctx context.Context, sourceID, sessionGen, seq int64, serverURI, problem string) (mcpsync.ReceiptKind, error) {
	_, err := s.pool.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, session_generation, uri, detail)
		VALUES ($1, $2, $3, $4, $5, jsonb_build_object('seq', $6::bigint, 'problem', $7::text))
		ON CONFLICT (idem_key) DO NOTHING`,
		fmt.Sprintf(auditNotificationRecordedFmt, sourceID, sessionGen, seq), mcpsync.ReceiptNotificationMalformedURI,
		sourceID, sessionGen, SafeText(serverURI), seq, SafeText(problem))
	if err != nil {
		return "", fmt.Errorf("ledger: audit malformed notification: %w", err)
	}
	return mcpsync.ReceiptNotificationMalformedURI, nil
}

// AuditStaleListenNotification records a notifications/resources/updated that arrived on a
// 2026-07-28 session carrying the subscription ID of no current subscriptions/listen stream
// (an ended epoch's, or one the client never opened): NOTIFICATION_OLD_SESSION, like a
// notification of an older session generation (R12, issue 13 item 4). It routes nothing.
// seq numbers the audits of the session, so that a retried audit is recorded once.
func (s *Store) AuditStaleListenNotification(ctx context.Context, sourceID, sessionGen, seq int64, serverURI, subscriptionID string) error {
	_, err := s.pool.Exec(ctx, `INSERT INTO receipts (idem_key, kind, source_id, session_generation, uri, detail)
		VALUES ($1, $2, $3, $4, $5, jsonb_build_object('seq', $6::bigint, 'listenSubscriptionId', $7::text,
			'problem', 'subscription ID of no current subscriptions/listen stream'))
		ON CONFLICT (idem_key) DO NOTHING`,
		fmt.Sprintf("audit-stale-listen:%d:%d:%d", sourceID, sessionGen, seq), mcpsync.ReceiptNotificationOld,
		sourceID, sessionGen, SafeText(serverURI), seq, SafeText(Bounded(subscriptionID, 64)))
	if err != nil {
		return fmt.Errorf("ledger: audit stale listen notification: %w", err)
	}
	return nil
}
