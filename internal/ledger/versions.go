package ledger

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Version is a stored resourceVersion.v1 (R15).
type Version struct {
	ID                int64
	SubscriptionID    int64
	Principal         string
	SourceID          int64
	URI               string
	Kind              string // "content" or "tombstone"
	MIMEType          string
	Digest            string
	Size              int64
	ReadOrdinal       int64
	Generation        int64
	SessionGeneration int64
	RequestID         string
	AuthSubject       string
	ServerName        string
	ServerVersion     string
	LastModified      string
	AcceptedAt        time.Time
}

const versionColumns = `id, subscription_id, principal, source_id, uri, kind, mime_type,
	coalesce(digest, ''), size, read_ordinal, generation, session_generation, request_id,
	auth_subject, server_name, server_version, coalesce(last_modified, ''), accepted_at`

func scanVersion(row pgx.Row) (Version, error) {
	var v Version
	err := row.Scan(&v.ID, &v.SubscriptionID, &v.Principal, &v.SourceID, &v.URI, &v.Kind,
		&v.MIMEType, &v.Digest, &v.Size, &v.ReadOrdinal, &v.Generation, &v.SessionGeneration,
		&v.RequestID, &v.AuthSubject, &v.ServerName, &v.ServerVersion, &v.LastModified, &v.AcceptedAt)
	return v, err
}

// LatestVersion returns the newest accepted version (or tombstone) of a subscription, or
// ErrNotFound when none was ever accepted.
func (s *Store) LatestVersion(ctx context.Context, subscriptionID int64) (Version, error) {
	v, err := scanVersion(s.pool.QueryRow(ctx, `SELECT `+versionColumns+` FROM resource_versions
		WHERE subscription_id = $1 ORDER BY read_ordinal DESC LIMIT 1`, subscriptionID))
	if err != nil {
		return Version{}, notFound(err, fmt.Sprintf("ledger: version of subscription %d", subscriptionID))
	}
	return v, nil
}

// Versions returns every accepted version of a subscription in acceptance order.
func (s *Store) Versions(ctx context.Context, subscriptionID int64) ([]Version, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+versionColumns+` FROM resource_versions
		WHERE subscription_id = $1 ORDER BY id`, subscriptionID)
	if err != nil {
		return nil, fmt.Errorf("ledger: versions of subscription %d: %w", subscriptionID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Version, error) { return scanVersion(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: versions of subscription %d: %w", subscriptionID, err)
	}
	return out, nil
}

// Receipt is one recorded outcome or audited event.
type Receipt struct {
	ID                int64
	Kind              mcpsync.ReceiptKind
	SubscriptionID    *int64
	Generation        *int64
	SessionGeneration *int64
	ReadOrdinal       *int64
	RequestID         string
	URI               string
	Digest            string
	CreatedAt         time.Time
}

// Receipts returns the receipts of a subscription in the order they were written.
func (s *Store) Receipts(ctx context.Context, subscriptionID int64) ([]Receipt, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, kind, subscription_id, generation, session_generation,
			read_ordinal, coalesce(request_id, ''), coalesce(uri, ''), coalesce(digest, ''), created_at
		FROM receipts WHERE subscription_id = $1 ORDER BY id`, subscriptionID)
	if err != nil {
		return nil, fmt.Errorf("ledger: receipts of subscription %d: %w", subscriptionID, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Receipt])
	if err != nil {
		return nil, fmt.Errorf("ledger: receipts of subscription %d: %w", subscriptionID, err)
	}
	return out, nil
}
