package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
)

// Source lifecycle (issue 14, item 5): a source's definition is replaced as a new definition
// version, a source is removed (its subscriptions pass the close fence, its receipts and
// versions stay), and a removed source's stored content is purged once every subscription of
// it is CLOSED. A removed source's name may be added again: the same row (and so its history)
// comes back with the new definition as the next definition version.

var (
	// ErrSourceRemoved: the source was removed (`mcpsync source remove`); it matches
	// ErrNotFound too, since nothing may be started on it.
	ErrSourceRemoved = fmt.Errorf("ledger: source removed: %w", ErrNotFound)
	// ErrSourceChanged: the source's definition changed (or it was removed or added again)
	// since the caller read it; read it again and retry.
	ErrSourceChanged = errors.New("ledger: source definition changed concurrently")
	// ErrPurgeRefused (*PurgeRefusal): content is purged only from a removed source whose every
	// subscription is CLOSED.
	ErrPurgeRefused = errors.New("ledger: purge refused")
)

// PurgeRefusal says why PurgeSourceContent refused; it matches ErrPurgeRefused.
type PurgeRefusal struct {
	Source string
	// NotRemoved: the source has not been removed.
	NotRemoved bool
	// NotClosed is how many subscriptions of the source are not CLOSED yet.
	NotClosed int
}

func (r *PurgeRefusal) Error() string {
	if r.NotRemoved {
		return fmt.Sprintf("source %q is not removed; content is purged only from a removed source", r.Source)
	}
	return fmt.Sprintf("%d subscription(s) of source %q are not CLOSED yet; content is purged only once every one is", r.NotClosed, r.Source)
}

// Unwrap makes a *PurgeRefusal match ErrPurgeRefused.
func (r *PurgeRefusal) Unwrap() error { return ErrPurgeRefused }

// definitionArgs are the columns a definition sets, in the order of the statements below.
func definitionArgs(spec SourceSpec) (transport string, cmd []string, url *string, rest []any) {
	if spec.URL != "" && spec.Transport == TransportHTTP {
		u := spec.URL
		url = &u
	}
	if spec.Transport == TransportStdio {
		cmd = spec.Command
	}
	return spec.Transport, cmd, url, []any{spec.Subject, spec.BackstopSeconds, spec.PollSeconds, spec.Connection}
}

// UpdateSource replaces the definition of the source spec.Name with spec, as definition
// version expectVersion+1, if the source is not removed and its definition version is still
// expectVersion: one conditional UPDATE, so of two concurrent updates read at the same version
// one wins and the other gets ErrSourceChanged. The new definition takes effect on the host's
// next connect, as a new session generation. A spec equal to the stored definition changes
// nothing (changed=false, no new version). Errors: ErrInvalid for a malformed spec,
// ErrNotFound for an unknown source, ErrSourceRemoved for a removed one, ErrSourceChanged.
// A SOURCE_UPDATED receipt records each new version.
func (s *Store) UpdateSource(ctx context.Context, spec SourceSpec, expectVersion int64) (src Source, changed bool, err error) {
	if err := spec.Validate(); err != nil {
		return Source{}, false, err
	}
	spec = spec.withDefaults()
	transport, cmd, url, rest := definitionArgs(spec)
	args := append([]any{spec.Name, expectVersion, transport, cmd, url}, rest...)
	src, err = scanSource(s.pool.QueryRow(ctx, `
		WITH u AS (
			UPDATE sources SET transport = $3, command = $4, url = $5, subject = $6,
				backstop_seconds = $7, poll_seconds = $8, connection = $9,
				definition_version = definition_version + 1
			WHERE name = $1 AND removed_at IS NULL AND definition_version = $2
				AND (transport, command, url, subject, backstop_seconds, poll_seconds, connection)
					IS DISTINCT FROM ($3::text, $4::text[], $5::text, $6::text, $7::int, $8::int, $9::jsonb)
			RETURNING *),
		r AS (
			INSERT INTO receipts (kind, source_id, detail)
			SELECT 'SOURCE_UPDATED', id, jsonb_build_object('definitionVersion', definition_version) FROM u)
		SELECT `+sourceColumns+` FROM u`, args...))
	if err == nil {
		return src, true, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Source{}, false, fmt.Errorf("ledger: update source %q: %w", spec.Name, err)
	}
	// Nothing was updated; say why (the decision above was the statement's own).
	cur, err := s.SourceByName(ctx, spec.Name)
	switch {
	case err != nil:
		return Source{}, false, err
	case cur.RemovedAt != nil:
		return cur, false, fmt.Errorf("source %q: %w", spec.Name, ErrSourceRemoved)
	case cur.DefinitionVersion != expectVersion:
		return cur, false, fmt.Errorf("source %q is at definition version %d, not %d: %w", spec.Name, cur.DefinitionVersion, expectVersion, ErrSourceChanged)
	}
	return cur, false, nil
}

// ReaddSource brings the removed source spec.Name back with definition spec as its next
// definition version: the same row, so its receipts, versions and CLOSED subscriptions stay
// its history, and subscribing again opens their next generation. It is one conditional
// UPDATE on a source that is still removed; a source that is not removed gives
// ErrSourceChanged, an unknown one ErrNotFound. A SOURCE_READDED receipt records it.
func (s *Store) ReaddSource(ctx context.Context, spec SourceSpec) (Source, error) {
	if err := spec.Validate(); err != nil {
		return Source{}, err
	}
	spec = spec.withDefaults()
	transport, cmd, url, rest := definitionArgs(spec)
	args := append([]any{spec.Name, transport, cmd, url}, rest...)
	src, err := scanSource(s.pool.QueryRow(ctx, `
		WITH u AS (
			UPDATE sources SET transport = $2, command = $3, url = $4, subject = $5,
				backstop_seconds = $6, poll_seconds = $7, connection = $8,
				definition_version = definition_version + 1, removed_at = NULL
			WHERE name = $1 AND removed_at IS NOT NULL
			RETURNING *),
		r AS (
			INSERT INTO receipts (kind, source_id, detail)
			SELECT 'SOURCE_READDED', id, jsonb_build_object('definitionVersion', definition_version) FROM u)
		SELECT `+sourceColumns+` FROM u`, args...))
	if err == nil {
		return src, nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return Source{}, fmt.Errorf("ledger: add source %q again: %w", spec.Name, err)
	}
	if _, err := s.SourceByName(ctx, spec.Name); err != nil {
		return Source{}, err
	}
	return Source{}, fmt.Errorf("source %q is not removed: %w", spec.Name, ErrSourceChanged)
}

// OpenSubscription is a subscription of a removed source that has not reached CLOSED: its
// workflow must be told to pass the close fence.
type OpenSubscription struct {
	SubscriptionID int64
	WorkflowID     string
	Principal      string
	URI            string
	State          mcpsync.State
}

// RemoveSource marks the source called name removed (removed_at, kept from the first removal
// when it is removed again) and returns it with every subscription of it that is not CLOSED,
// which the caller tells to pass the close fence (R18). Removing keeps receipts, versions and
// content; hosts drop a removed source, nothing is claimed or subscribed on it any more.
// The source row is locked FOR UPDATE first; EnsureSubscription holds it FOR KEY SHARE (only
// while removed_at is NULL) as it opens a subscription, so the removal waits for an opening in
// flight and the listing that follows (a new snapshot) sees it, or the opening waits for the
// removal and is refused (ErrSourceRemoved): no subscription opens unseen. ErrNotFound for an unknown source. The first removal
// leaves a SOURCE_REMOVED receipt.
func (s *Store) RemoveSource(ctx context.Context, name string) (src Source, open []OpenSubscription, err error) {
	err = s.inTx(ctx, func(tx pgx.Tx) error {
		var err error
		src, err = scanSource(tx.QueryRow(ctx, `
			WITH prev AS (SELECT id, removed_at FROM sources WHERE name = $1 FOR UPDATE),
			u AS (
				UPDATE sources so SET removed_at = coalesce(so.removed_at, now())
				FROM prev WHERE so.id = prev.id
				RETURNING so.*, prev.removed_at IS NULL AS newly),
			r AS (
				INSERT INTO receipts (kind, source_id) SELECT 'SOURCE_REMOVED', id FROM u WHERE newly)
			SELECT `+sourceColumns+` FROM u`, name))
		if err != nil {
			return notFound(err, fmt.Sprintf("ledger: source %q", name))
		}
		rows, err := tx.Query(ctx, `SELECT id, workflow_id, principal, uri, state FROM subscriptions
			WHERE source_id = $1 AND state <> 'CLOSED' ORDER BY id`, src.ID)
		if err != nil {
			return err
		}
		open, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenSubscription, error) {
			var o OpenSubscription
			err := r.Scan(&o.SubscriptionID, &o.WorkflowID, &o.Principal, &o.URI, &o.State)
			return o, err
		})
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return Source{}, nil, err
		}
		return Source{}, nil, fmt.Errorf("ledger: remove source %q: %w", name, err)
	}
	return src, open, nil
}

// NotClosedSubscriptions counts the subscriptions of source sourceID that are not CLOSED.
func (s *Store) NotClosedSubscriptions(ctx context.Context, sourceID int64) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM subscriptions WHERE source_id = $1 AND state <> 'CLOSED'`, sourceID).Scan(&n); err != nil {
		return 0, fmt.Errorf("ledger: subscriptions of source %d: %w", sourceID, err)
	}
	return n, nil
}

// PurgeResult is what PurgeSourceContent deleted.
type PurgeResult struct {
	Blobs int   // content blobs deleted
	Bytes int64 // their total size
}

// PurgeSourceContent deletes the stored content of the removed source sourceID: the bodies
// (content blobs) of its versions that no version of another source shares, the guard
// verdicts on them, and the sanitized bodies those verdicts delivered when nothing else
// refers to them. Versions, receipts and subscriptions stay; a version then names a digest
// whose body is gone. One statement whose WHERE carries the whole condition: the source is
// removed and every subscription of it is CLOSED, under the source row's lock (a removed
// source opens no subscription, see RemoveSource). Otherwise nothing is deleted and the
// error is a *PurgeRefusal (ErrPurgeRefused); ErrNotFound for an unknown source. Purging again
// deletes nothing more. A SOURCE_PURGED receipt records each purge.
func (s *Store) PurgeSourceContent(ctx context.Context, sourceID int64) (PurgeResult, error) {
	for attempt := 0; ; attempt++ {
		res, n, err := s.purgeOnce(ctx, sourceID)
		// n == 0 after a refusal: the last subscription closed in between; try again.
		if n != 0 || attempt == 2 {
			return res, err
		}
	}
}

// purgeOnce is one purge attempt; a refusal because of subscriptions not CLOSED returns
// their count, which is 0 when they closed between the statement and the count.
func (s *Store) purgeOnce(ctx context.Context, sourceID int64) (PurgeResult, int, error) {
	var res PurgeResult
	var purged bool
	err := s.pool.QueryRow(ctx, `
		WITH ok AS (
			SELECT id FROM sources WHERE id = $1 AND removed_at IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM subscriptions WHERE source_id = $1 AND state <> 'CLOSED')
			FOR UPDATE),
		d AS (
			SELECT DISTINCT v.digest FROM resource_versions v JOIN ok ON v.source_id = ok.id
			WHERE v.digest IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM resource_versions o WHERE o.digest = v.digest AND o.source_id <> ok.id)),
		gv AS (
			DELETE FROM guard_verdicts g USING d WHERE g.digest = d.digest
			RETURNING g.delivered_digest),
		sanitized AS (
			SELECT DISTINCT gv.delivered_digest AS digest FROM gv
			WHERE gv.delivered_digest IS NOT NULL
				AND NOT EXISTS (SELECT 1 FROM resource_versions o WHERE o.digest = gv.delivered_digest AND o.source_id <> $1)
				AND NOT EXISTS (SELECT 1 FROM guard_verdicts g2 WHERE g2.delivered_digest = gv.delivered_digest
					AND g2.digest NOT IN (SELECT digest FROM d))),
		b AS (
			DELETE FROM content_blobs c WHERE c.digest IN (SELECT digest FROM d UNION SELECT digest FROM sanitized)
			RETURNING c.size),
		r AS (
			INSERT INTO receipts (kind, source_id, detail)
			SELECT 'SOURCE_PURGED', ok.id, jsonb_build_object('blobs', (SELECT count(*) FROM b),
				'bytes', (SELECT coalesce(sum(size), 0) FROM b)) FROM ok)
		SELECT EXISTS (SELECT 1 FROM ok), (SELECT count(*) FROM b), (SELECT coalesce(sum(size), 0) FROM b)`,
		sourceID).Scan(&purged, &res.Blobs, &res.Bytes)
	if err != nil {
		return PurgeResult{}, -1, fmt.Errorf("ledger: purge source %d: %w", sourceID, err)
	}
	if purged {
		return res, -1, nil
	}
	// Refused; say why (the decision above was the statement's own).
	src, err := s.SourceByID(ctx, sourceID)
	if err != nil {
		return PurgeResult{}, -1, err
	}
	if src.RemovedAt == nil {
		return PurgeResult{}, -1, &PurgeRefusal{Source: src.Name, NotRemoved: true}
	}
	n, err := s.NotClosedSubscriptions(ctx, sourceID)
	if err != nil {
		return PurgeResult{}, -1, err
	}
	return PurgeResult{}, n, &PurgeRefusal{Source: src.Name, NotClosed: max(n, 1)}
}
