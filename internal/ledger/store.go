package ledger

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Store is the Postgres-backed ledger. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
}

// New returns a Store on pool. The schema must already be applied (dbschema.Apply).
func New(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Pool returns the underlying connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// Errors callers branch on with errors.Is.
var (
	// ErrNotFound: the named source, subscription, session or version does not exist.
	ErrNotFound = errors.New("ledger: not found")
	// ErrSourceExists: a source with that name exists with a different definition.
	ErrSourceExists = errors.New("ledger: source already exists with a different definition")
	// ErrNoSession: the source has no live session.
	ErrNoSession = errors.New("ledger: source has no live session")
	// ErrLeaseLost: the host no longer holds the source's lease.
	ErrLeaseLost = errors.New("ledger: host does not hold the source lease")
	// ErrInvalid: the request is malformed (empty name, unknown reason, ...).
	ErrInvalid = errors.New("ledger: invalid request")
)

// isRetryable reports whether a statement rolled back in a way a retry resolves: a unique
// violation (a concurrent call with the same key won), a deadlock or a serialization failure.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "23505", "40P01", "40001":
		return true
	}
	return false
}

func notFound(err error, what string) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, ErrNotFound)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// inTx runs fn in a READ COMMITTED transaction.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, fn)
}
