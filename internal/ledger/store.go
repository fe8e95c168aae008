package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// readCommitted is the isolation level of every transaction the ledger opens, set explicitly
// so that the server's default_transaction_isolation cannot change it. The fences rely on it:
// each statement of a transaction takes a new snapshot, so a statement that follows a lock
// (Revoke's lineage after the grant row, an answer's label after the subscription row) sees
// everything committed before that lock was granted; and a statement that waits for a row
// re-checks its WHERE on the row's newest version instead of failing.
var readCommitted = pgx.TxOptions{IsoLevel: pgx.ReadCommitted}

// inTx runs fn in a READ COMMITTED transaction (readCommitted), whatever the server's default.
func (s *Store) inTx(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, readCommitted, fn)
}

// lockSubscriptionSQL takes a subscription's row lock (FOR NO KEY UPDATE, the lock an UPDATE of
// it takes; it does not block the KEY SHARE locks of foreign keys) as the first statement of a
// READ COMMITTED transaction: it waits for any transition of the row in flight (the close
// fence, another answer) and the transaction's next statement, with a new snapshot, sees the
// row exactly as it is locked. A missing row locks nothing; the next statement reports it.
const lockSubscriptionSQL = `SELECT 1 FROM subscriptions WHERE id = $1 FOR NO KEY UPDATE`

// lockedRow runs, as one READ COMMITTED transaction, the lock of subscription id's row
// (lockSubscriptionSQL) and then stmt, and scans stmt's single row into dest. The transaction
// is sent in one round trip (a batch: BEGIN, the lock, stmt, COMMIT) instead of four: the hot
// answers (allocate, accept) spent most of their time in round trips. Each statement still
// starts after the one before it has finished, so stmt's snapshot is taken once the lock is
// granted. On a server error the transaction is rolled back, or its connection discarded. A
// scan error (dest not matching stmt's columns, a programming error) comes after the server
// has run COMMIT, as the whole batch is sent at once.
func (s *Store) lockedRow(ctx context.Context, id int64, stmt string, args []any, dest ...any) error {
	return s.lockedRowThen(ctx, id, stmt, args, nil, dest...)
}

// queued is a statement that lockedRowThen runs, for its effect only, after the deciding
// statement.
type queued struct {
	sql  string
	args []any
}

// lockedRowThen is lockedRow with the statements in then run, in order, after stmt, in the
// same transaction and the same round trip; an error in any of them rolls the whole
// transaction back, stmt's effects included.
func (s *Store) lockedRowThen(ctx context.Context, id int64, stmt string, args []any, then []queued, dest ...any) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release() // the pool discards a connection still in a transaction
	b := &pgx.Batch{}
	b.Queue(`BEGIN ISOLATION LEVEL READ COMMITTED`) // readCommitted, as inTx sets it
	b.Queue(lockSubscriptionSQL, id)
	b.Queue(stmt, args...)
	for _, q := range then {
		b.Queue(q.sql, q.args...)
	}
	b.Queue(`COMMIT`)
	br := conn.SendBatch(ctx, b)
	_, err = br.Exec()
	if err == nil {
		_, err = br.Exec()
	}
	if err == nil {
		err = br.QueryRow().Scan(dest...)
	}
	for i := 0; i < len(then) && err == nil; i++ {
		_, err = br.Exec()
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && conn.Conn().PgConn().TxStatus() != 'I' && !conn.Conn().IsClosed() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, _ = conn.Exec(rctx, `ROLLBACK`)
		cancel()
	}
	return err
}
