package ledger

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/redact"
)

// HealthState is the session state of a source as the host holding its lease reports it
// (issue 14, item 2).
type HealthState string

// Session states of a source.
const (
	// HealthConnecting: a connection attempt is under way.
	HealthConnecting HealthState = "CONNECTING"
	// HealthLive: a session is open and recorded as the source's current generation.
	HealthLive HealthState = "LIVE"
	// HealthBackoff: the last attempt failed or the session ended; the next attempt is due at
	// NextAttemptAt.
	HealthBackoff HealthState = "BACKOFF"
	// HealthAuthFailed: the server refused the credentials (HTTP 401 or 403); LastError holds
	// its WWW-Authenticate challenge. Attempts continue with a slower backoff.
	HealthAuthFailed HealthState = "AUTH_FAILED"
	// HealthFailed: the source's definition cannot be used as it is (a missing environment
	// variable or file, an unknown transport); retrying alone will not fix it.
	HealthFailed HealthState = "FAILED"
)

// Valid reports whether st is one of the defined states.
func (st HealthState) Valid() bool {
	switch st {
	case HealthConnecting, HealthLive, HealthBackoff, HealthAuthFailed, HealthFailed:
		return true
	}
	return false
}

// MaxHealthErrorBytes bounds a stored last error (the column's CHECK says the same).
const MaxHealthErrorBytes = 512

// HealthReport is one report of a host on a source it holds.
type HealthReport struct {
	State HealthState
	// At is when the state was entered (the reporting host's clock); zero means the ledger's
	// now(). It becomes StateSince when the state changes, and LastErrorAt when Err is set.
	At time.Time
	// Err is the error that led to the state. It is stored through HealthErrorText (redacted,
	// one line, bounded). Empty keeps the previous last error and its time.
	Err string
	// ErrAt is when Err happened (the reporting host's clock); zero means At.
	ErrAt time.Time
	// NextAttempt is when the host will try to connect again (BACKOFF, AUTH_FAILED, FAILED);
	// zero stores none.
	NextAttempt time.Time
	// Reconnects is the number of connection attempts, after the host's first one, that this
	// report accounts for; it is added to the stored count.
	Reconnects int64
}

// SourceHealth is what `source list`, `source show` and `status` show of a source's health.
type SourceHealth struct {
	SourceID int64
	// Reported is false when no host has reported on the source yet; the health fields are
	// then zero.
	Reported bool
	State    HealthState
	// StateSince is when the reporting host entered State.
	StateSince time.Time
	// HostQueue is the host that reported; Held says whether it still holds the source's
	// lease (if not, the state is what that host last saw, not the present).
	HostQueue     string
	Held          bool
	LastError     string
	LastErrorAt   *time.Time
	NextAttemptAt *time.Time
	Reconnects    int64
	UpdatedAt     time.Time
	// Generation is the source's current session generation (0: never connected).
	Generation int64
	// Session is the session of that generation, live or ended (nil before the first): its
	// era (protocol version) and capability receipt.
	Session *Session
	// LeaseHolder and LeaseUntil are the source's lease as it stands; LeaseHolder is empty
	// when no host holds a live lease.
	LeaseHolder string
	LeaseUntil  *time.Time
}

// SetSourceHealth stores a host's report on a source. It is one statement whose WHERE carries
// the fence: the row is written only while hostQueue holds the source's live lease, so a host
// that lost its lease cannot overwrite its successor's report; it then fails with
// ErrLeaseLost and writes nothing. The state's since-time is kept while the same host reports
// the same state; the error is stored as HealthErrorText makes it (redacted, bounded).
func (s *Store) SetSourceHealth(ctx context.Context, sourceID int64, hostQueue string, r HealthReport) error {
	if !r.State.Valid() {
		return fmt.Errorf("ledger: source health %q: unknown state: %w", r.State, ErrInvalid)
	}
	if r.Reconnects < 0 {
		return fmt.Errorf("ledger: source health: negative reconnects %d: %w", r.Reconnects, ErrInvalid)
	}
	var errText, at, errAt, next any
	if r.Err != "" {
		errText = HealthErrorText(r.Err)
	}
	if !r.At.IsZero() {
		at = r.At
	}
	if !r.ErrAt.IsZero() {
		errAt = r.ErrAt
	}
	if !r.NextAttempt.IsZero() {
		next = r.NextAttempt
	}
	tag, err := s.pool.Exec(ctx, `
		INSERT INTO source_health AS h (source_id, state, state_since, host_queue, last_error,
			last_error_at, next_attempt_at, reconnects, updated_at)
		SELECT so.id, $3, coalesce($4::timestamptz, now()), $2, $5::text,
			CASE WHEN $5::text IS NULL THEN NULL ELSE coalesce($8::timestamptz, $4::timestamptz, now()) END,
			$6::timestamptz, $7::bigint, now()
		FROM sources so
		WHERE so.id = $1 AND so.host_queue = $2 AND so.lease_until > now()
		FOR SHARE OF so
		ON CONFLICT (source_id) DO UPDATE SET
			state = excluded.state,
			state_since = CASE WHEN h.state = excluded.state AND h.host_queue = excluded.host_queue
			                   THEN h.state_since ELSE excluded.state_since END,
			host_queue = excluded.host_queue,
			last_error = coalesce(excluded.last_error, h.last_error),
			last_error_at = CASE WHEN excluded.last_error IS NULL THEN h.last_error_at
			                     ELSE excluded.last_error_at END,
			next_attempt_at = excluded.next_attempt_at,
			reconnects = h.reconnects + excluded.reconnects,
			updated_at = now()`,
		sourceID, hostQueue, string(r.State), at, errText, next, r.Reconnects, errAt)
	if err != nil {
		return fmt.Errorf("ledger: source %d health: %w", sourceID, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("ledger: source %d health, host %s: %w", sourceID, hostQueue, ErrLeaseLost)
	}
	return nil
}

const healthQuery = `SELECT so.id, so.current_generation,
		CASE WHEN so.lease_until > now() THEN coalesce(so.host_queue, '') ELSE '' END, so.lease_until,
		h.state IS NOT NULL, coalesce(h.state, ''), coalesce(h.state_since, 'epoch'), coalesce(h.host_queue, ''),
		coalesce(h.host_queue = so.host_queue AND so.lease_until > now(), false),
		coalesce(h.last_error, ''), h.last_error_at, h.next_attempt_at, coalesce(h.reconnects, 0),
		coalesce(h.updated_at, 'epoch'),
		se.generation IS NOT NULL, coalesce(se.host_queue, ''), coalesce(se.protocol_version, ''),
		coalesce(se.cap_resources, false), coalesce(se.cap_subscribe, false),
		coalesce(se.cap_list_changed, false), coalesce(se.cap_snapshot_ids, false),
		coalesce(se.server_name, ''), coalesce(se.server_version, ''), se.capabilities,
		coalesce(se.started_at, 'epoch'), se.ended_at, coalesce(se.end_reason, '')
	FROM sources so
	LEFT JOIN source_health h ON h.source_id = so.id
	LEFT JOIN sessions se ON se.source_id = so.id AND se.generation = so.current_generation`

func scanHealth(row pgx.Row) (SourceHealth, error) {
	var h SourceHealth
	var state string
	var hasSession bool
	var se Session
	var raw []byte
	err := row.Scan(&h.SourceID, &h.Generation, &h.LeaseHolder, &h.LeaseUntil,
		&h.Reported, &state, &h.StateSince, &h.HostQueue, &h.Held,
		&h.LastError, &h.LastErrorAt, &h.NextAttemptAt, &h.Reconnects, &h.UpdatedAt,
		&hasSession, &se.HostQueue, &se.Caps.ProtocolVersion, &se.Caps.Resources, &se.Caps.Subscribe,
		&se.Caps.ListChanged, &se.Caps.SnapshotIDs, &se.Caps.ServerName, &se.Caps.ServerVersion, &raw,
		&se.StartedAt, &se.EndedAt, &se.EndReason)
	if err != nil {
		return SourceHealth{}, err
	}
	h.State = HealthState(state)
	if !h.Reported {
		h.StateSince, h.UpdatedAt = time.Time{}, time.Time{}
	}
	if hasSession {
		se.SourceID, se.Generation, se.Caps.Raw = h.SourceID, h.Generation, raw
		h.Session = &se
	}
	return h, nil
}

// SourceHealth returns the health of a source: the last report of a host (if any), whether
// that host still holds the lease, and the source's current generation with its session. It
// fails with ErrNotFound for an unknown source.
func (s *Store) SourceHealth(ctx context.Context, sourceID int64) (SourceHealth, error) {
	h, err := scanHealth(s.pool.QueryRow(ctx, healthQuery+` WHERE so.id = $1`, sourceID))
	if err != nil {
		return SourceHealth{}, notFound(err, fmt.Sprintf("ledger: health of source %d", sourceID))
	}
	return h, nil
}

// SourcesHealth returns SourceHealth of every source, by source ID.
func (s *Store) SourcesHealth(ctx context.Context) (map[int64]SourceHealth, error) {
	rows, err := s.pool.Query(ctx, healthQuery)
	if err != nil {
		return nil, fmt.Errorf("ledger: sources health: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SourceHealth, error) { return scanHealth(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: sources health: %w", err)
	}
	out := make(map[int64]SourceHealth, len(list))
	for _, h := range list {
		out[h.SourceID] = h
	}
	return out, nil
}

// HealthErrorText is an error text as it may be stored, logged or shown: secrets masked
// (redact.Text for connection strings and URLs; the credentials of an "Authorization: Bearer"
// or "Basic" shape; the value of a name=value or "name": "value" pair whose name looks secret,
// redact.IsSecretName), on one line, storable (SafeText) and at most MaxHealthErrorBytes long
// (cut on a character boundary, "…" marking the cut).
func HealthErrorText(s string) string {
	s = redact.Text(s)
	s = authSchemeRE.ReplaceAllString(s, "${1} "+redact.Mask+"${3}")
	s = jsonPairRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := jsonPairRE.FindStringSubmatch(m)
		if !redact.IsSecretName(sub[1]) {
			return m
		}
		return `"` + sub[1] + `":"` + redact.Mask + `"`
	})
	s = assignRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := assignRE.FindStringSubmatch(m)
		if !redact.IsSecretName(sub[1]) {
			return m
		}
		return sub[1] + "=" + redact.Mask
	})
	s = strings.Join(strings.Fields(SafeText(s)), " ")
	return truncateUTF8(s, MaxHealthErrorBytes)
}

var (
	// authSchemeRE finds credentials after an HTTP auth scheme ("Bearer abc.def"), but not a
	// challenge's parameters ("Bearer error=..."): the token must end at a blank, a comma or
	// the end.
	authSchemeRE = regexp.MustCompile(`\b(Bearer|Basic)\s+([A-Za-z0-9\-._~+/]+=*)(\s|,|$)`)
	// jsonPairRE finds "name": "value" pairs.
	jsonPairRE = regexp.MustCompile(`"([A-Za-z0-9_.\-]+)"\s*:\s*"(?:[^"\\]|\\.)*"`)
	// assignRE finds name=value and name="value" pairs.
	assignRE = regexp.MustCompile(`\b([A-Za-z0-9_.\-]+)=("(?:[^"\\]|\\.)*"|[^\s,;&"]+)`)
)

// truncateUTF8 returns s cut to at most n bytes on a character boundary, with "…" at the end
// when it was cut.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	return mcpsync.CutAtRune(s, n-len(ellipsis)) + ellipsis
}
