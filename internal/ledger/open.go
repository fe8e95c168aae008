package ledger

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync/internal/redact"
)

// OpenErrorKind says why Open gave no pool, for callers that answer each differently.
type OpenErrorKind int

// Kinds of OpenError.
const (
	// OpenUnreachable: the server did not answer within the timeout, or refused the
	// connection for a reason other than the credentials.
	OpenUnreachable OpenErrorKind = iota
	// OpenMalformed: the URL does not parse: bad input, nothing was contacted.
	OpenMalformed
	// OpenAuth: the server refused the credentials (wrong or missing password, no such role).
	OpenAuth
)

// OpenError is why Open gave no pool. Its message is the driver's, on one line, with the
// password masked (redact.Text): pgx writes one line per address it tried and repeats a line
// when it tried the same address twice (with TLS, then without); Error keeps each distinct
// attempt once, joined with "; ". It unwraps to the driver's error.
type OpenError struct {
	Kind OpenErrorKind
	err  error
}

// Error is the cause on one line, secrets masked.
func (e *OpenError) Error() string { return oneLine(redact.Text(e.err.Error())) }

// Unwrap returns the driver's error.
func (e *OpenError) Unwrap() error { return e.err }

// Open connects a pool to the PostgreSQL database at url and checks within timeout that it
// answers. Every error is an *OpenError; on error no pool is left open.
func Open(ctx context.Context, url string, timeout time.Duration) (*pgxpool.Pool, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, &OpenError{Kind: OpenMalformed, err: err}
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		kind := OpenUnreachable
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
			kind = OpenAuth
		}
		return nil, &OpenError{Kind: kind, err: err}
	}
	return pool, nil
}

// oneLine folds a message that spans lines (pgx's "failed to connect to …:" followed by one
// indented line per attempt) into one line: its first line, then each distinct further line
// once, trimmed and joined with "; ".
func oneLine(msg string) string {
	var first string
	var rest []string
	for i, l := range strings.Split(msg, "\n") {
		l = strings.Join(strings.Fields(l), " ")
		switch {
		case i == 0:
			first = l
		case l != "" && !slices.Contains(rest, l):
			rest = append(rest, l)
		}
	}
	if len(rest) == 0 {
		return first
	}
	if first == "" {
		return strings.Join(rest, "; ")
	}
	return first + " " + strings.Join(rest, "; ")
}
