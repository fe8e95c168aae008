package ledger_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
)

// An answer that takes the subscription's row lock (allocate, accept) runs as one transaction
// sent in one round trip. When a statement in it fails — here the lock, refused by
// lock_timeout while another transaction holds the row — nothing of it is committed, the
// error reaches the caller, and the pool's connection is rolled back and kept (the same
// backend answers next, outside any transaction); once the row is free the same call succeeds.
func TestLockedAnswerFailureLeavesNothing(t *testing.T) {
	ctx := context.Background()
	url := pgtest.NewDB(t)
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var db string
	if err := admin.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET lock_timeout = '200ms'`); err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1 // every call of the store runs on the one connection
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	f := fixtureOn(t, pool)
	d := f.issue("r1") // the accept case below answers this read

	tests := []struct {
		name string
		call func() error
		// done reports whether the call's effect is in the ledger.
		done func() bool
	}{
		{"allocate", func() error {
			_, err := f.st.AllocateReadOrdinal(ctx, f.allocReq("r2"))
			return err
		}, func() bool { return f.refresh().LastIssuedOrdinal == d.ord+1 }},
		{"accept", func() error {
			_, err := f.st.AcceptResourceVersion(ctx, f.acceptRequest(d.ord, d.req, "body"))
			return err
		}, func() bool { return f.refresh().LastAcceptedOrdinal == d.ord }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			backend := func() uint32 {
				t.Helper()
				var pid uint32
				if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
					t.Fatal(err)
				}
				return pid
			}
			before := backend()
			holder, err := admin.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := holder.Exec(ctx, `SELECT 1 FROM subscriptions WHERE id = $1 FOR UPDATE`, f.sub.ID); err != nil {
				t.Fatal(err)
			}
			err = tt.call()
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
				t.Fatalf("call while the row is held: error %v, want lock_not_available (55P03)", err)
			}
			if tt.done() {
				t.Fatal("the failed call's effect is in the ledger")
			}
			if after := backend(); after != before {
				t.Errorf("the pool's connection was replaced (backend %d, then %d): the failed transaction was not rolled back", before, after)
			}
			if err := holder.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := tt.call(); err != nil {
				t.Fatalf("call once the row is free: %v", err)
			}
			if !tt.done() {
				t.Fatal("the call's effect is not in the ledger after it succeeded")
			}
		})
	}
	if got := f.refresh().State; got != mcpsync.StateActive {
		t.Errorf("state %s, want ACTIVE", got)
	}
}

// The locked answers' transaction is READ COMMITTED even where the server's default is
// REPEATABLE READ: their statement must see the row as it is once the lock is granted (R19).
func TestLockedAnswerIsReadCommitted(t *testing.T) {
	f := fixtureOn(t, repeatableReadPool(t))
	var level string
	if err := f.st.LockedRow(f.ctx, f.sub.ID, `SELECT current_setting('transaction_isolation')`, nil, &level); err != nil {
		t.Fatal(err)
	}
	if level != "read committed" {
		t.Errorf("isolation of a locked answer: %q, want read committed", level)
	}
}
