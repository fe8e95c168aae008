package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// Transports a source can use.
const (
	TransportStdio = "stdio"
	TransportHTTP  = "http"
)

// SourceSpec defines a source: one MCP server endpoint plus the subject it connects as.
type SourceSpec struct {
	Name            string
	Transport       string   // TransportStdio or TransportHTTP
	Command         []string // stdio: argv, Command[0] is the program
	URL             string   // http: the streamable HTTP endpoint
	Subject         string   // authorization subject the session connects as; "default" if empty
	BackstopSeconds int      // backstop re-read period for subscribed resources; 30 if zero
	PollSeconds     int      // poll period when the server lacks resources.subscribe; 30 if zero
	// Connection is how the worker authenticates, seals a stdio child and bounds reads.
	Connection Connection
}

// Source is a stored source with its session bookkeeping.
type Source struct {
	SourceSpec
	ID                int64
	CurrentGeneration int64
	HostQueue         string
	LeaseUntil        *time.Time
	CreatedAt         time.Time
	// DefinitionVersion is bumped whenever the definition changes; a host running an older
	// version restarts the source's session (issue 12).
	DefinitionVersion int64
	// RemovedAt is when the source was removed, if it was: it is never claimed again.
	RemovedAt *time.Time
}

// Validate reports a malformed spec with ErrInvalid.
func (sp SourceSpec) Validate() error {
	if strings.TrimSpace(sp.Name) == "" || strings.ContainsAny(sp.Name, " \t\r\n/") {
		return fmt.Errorf("source name %q must be non-empty without spaces or '/': %w", sp.Name, ErrInvalid)
	}
	if len(sp.Name) > MaxSourceNameBytes {
		return fmt.Errorf("source name of %d bytes is longer than %d: %w", len(sp.Name), MaxSourceNameBytes, ErrInvalid)
	}
	if !utf8.ValidString(sp.Name) || strings.ContainsFunc(sp.Name, func(r rune) bool { return r < 0x20 || r == 0x7f || !unicode.IsPrint(r) }) {
		return fmt.Errorf("source name %q must be printable UTF-8: %w", sp.Name, ErrInvalid)
	}
	switch sp.Transport {
	case TransportStdio:
		if len(sp.Command) == 0 || strings.TrimSpace(sp.Command[0]) == "" {
			return fmt.Errorf("stdio source %q needs a command: %w", sp.Name, ErrInvalid)
		}
	case TransportHTTP:
		if !strings.HasPrefix(sp.URL, "http://") && !strings.HasPrefix(sp.URL, "https://") {
			return fmt.Errorf("http source %q needs an http:// or https:// URL, got %q: %w", sp.Name, redact.URL(sp.URL), ErrInvalid)
		}
		if redact.HasSecret(sp.URL) {
			return fmt.Errorf("http source %q: the URL %s carries credentials (userinfo or a secret-looking query parameter); give them with --bearer-env, --header-env or OAuth so that only a reference is stored: %w", sp.Name, redact.URL(sp.URL), ErrInvalid)
		}
	default:
		return fmt.Errorf("source %q: unknown transport %q: %w", sp.Name, sp.Transport, ErrInvalid)
	}
	if sp.BackstopSeconds < 0 || sp.PollSeconds < 0 {
		return fmt.Errorf("source %q: periods must be positive: %w", sp.Name, ErrInvalid)
	}
	if sp.BackstopSeconds > MaxPeriodSeconds || sp.PollSeconds > MaxPeriodSeconds {
		return fmt.Errorf("source %q: periods must be at most %d s (7 days): %w", sp.Name, MaxPeriodSeconds, ErrInvalid)
	}
	return sp.Connection.validate(sp.Name, sp.Transport)
}

// MaxPeriodSeconds bounds a source's backstop and poll periods (7 days).
const MaxPeriodSeconds = 7 * 24 * 3600

func (sp SourceSpec) withDefaults() SourceSpec {
	if sp.Subject == "" {
		sp.Subject = "default"
	}
	if sp.BackstopSeconds == 0 {
		sp.BackstopSeconds = 30
	}
	if sp.PollSeconds == 0 {
		sp.PollSeconds = 30
	}
	return sp
}

const sourceColumns = `id, name, transport, command, coalesce(url, ''), subject, backstop_seconds,
	poll_seconds, current_generation, coalesce(host_queue, ''), lease_until, created_at, connection,
	definition_version, removed_at`

func scanSource(row pgx.Row) (Source, error) {
	var src Source
	err := row.Scan(&src.ID, &src.Name, &src.Transport, &src.Command, &src.URL, &src.Subject,
		&src.BackstopSeconds, &src.PollSeconds, &src.CurrentGeneration, &src.HostQueue,
		&src.LeaseUntil, &src.CreatedAt, &src.Connection, &src.DefinitionVersion, &src.RemovedAt)
	return src, err
}

// AddSource stores a new source. Adding the same definition again is a no-op that returns the
// stored source (created=false); a different definition under an existing name fails with
// ErrSourceExists.
func (s *Store) AddSource(ctx context.Context, spec SourceSpec) (src Source, created bool, err error) {
	if err := spec.Validate(); err != nil {
		return Source{}, false, err
	}
	spec = spec.withDefaults()
	var url *string
	if spec.URL != "" {
		url = &spec.URL
	}
	var cmd []string
	if spec.Transport == TransportStdio {
		cmd = spec.Command
	}
	src, err = scanSource(s.pool.QueryRow(ctx, `
		INSERT INTO sources (name, transport, command, url, subject, backstop_seconds, poll_seconds, connection)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		ON CONFLICT (name) DO NOTHING
		RETURNING `+sourceColumns,
		spec.Name, spec.Transport, cmd, url, spec.Subject, spec.BackstopSeconds, spec.PollSeconds, spec.Connection))
	if err == nil {
		return src, true, nil
	}
	if err != pgx.ErrNoRows {
		return Source{}, false, fmt.Errorf("ledger: add source %q: %w", spec.Name, err)
	}
	existing, err := s.SourceByName(ctx, spec.Name)
	if err != nil {
		return Source{}, false, err
	}
	if existing.Transport != spec.Transport || !slices.Equal(existing.Command, cmd) ||
		existing.URL != spec.URL || existing.Subject != spec.Subject ||
		existing.BackstopSeconds != spec.BackstopSeconds || existing.PollSeconds != spec.PollSeconds ||
		!sameConnection(existing.Connection, spec.Connection) {
		return existing, false, fmt.Errorf("source %q: %w", spec.Name, ErrSourceExists)
	}
	return existing, false, nil
}

// SourceByName returns the source called name, or ErrNotFound.
func (s *Store) SourceByName(ctx context.Context, name string) (Source, error) {
	src, err := scanSource(s.pool.QueryRow(ctx, `SELECT `+sourceColumns+` FROM sources WHERE name = $1`, name))
	if err != nil {
		return Source{}, notFound(err, fmt.Sprintf("ledger: source %q", name))
	}
	return src, nil
}

// SourceByID returns the source with id, or ErrNotFound.
func (s *Store) SourceByID(ctx context.Context, id int64) (Source, error) {
	src, err := scanSource(s.pool.QueryRow(ctx, `SELECT `+sourceColumns+` FROM sources WHERE id = $1`, id))
	if err != nil {
		return Source{}, notFound(err, fmt.Sprintf("ledger: source %d", id))
	}
	return src, nil
}

// ListSources returns every source ordered by name.
func (s *Store) ListSources(ctx context.Context) ([]Source, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+sourceColumns+` FROM sources ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("ledger: list sources: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Source, error) { return scanSource(r) })
	if err != nil {
		return nil, fmt.Errorf("ledger: list sources: %w", err)
	}
	return out, nil
}

// sameConnection compares two connections as stored (JSON), so nil and empty lists are equal.
func sameConnection(a, b Connection) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}
