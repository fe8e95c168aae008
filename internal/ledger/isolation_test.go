package ledger_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// repeatableReadPool returns a pool on a new test database whose default transaction isolation
// is REPEATABLE READ, so that every statement or transaction that does not set its level runs
// at it.
func repeatableReadPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	url := pgtest.NewDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{db}.Sanitize()+` SET default_transaction_isolation = 'repeatable read'`); err != nil {
		t.Fatal(err)
	}
	if err := conn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, url) // new sessions take the database's setting
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	var level string
	if err := pool.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "repeatable read" {
		t.Fatalf("transaction_isolation = %q on the test database, want repeatable read", level)
	}
	return pool
}

// grantWorldOn is newGrantWorld on a given pool.
func grantWorldOn(t *testing.T, pool *pgxpool.Pool) *grantWorld {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	w := &grantWorld{t: t, ctx: ctx, st: ledger.New(pool)}
	w.src = w.addSource("docs")
	if _, err := w.st.ClaimSources(ctx, "host-g", time.Minute); err != nil {
		t.Fatal(err)
	}
	sess, _, err := w.st.OpenSession(ctx, w.src.ID, "host-g", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		t.Fatal(err)
	}
	w.sess = sess
	return w
}

// The ledger sets the isolation level each of its transactions needs instead of taking the
// server's default: its fences hold on a server whose default_transaction_isolation is
// REPEATABLE READ. Each case runs on its own such database.
func TestFencesUnderRepeatableReadDefault(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T, pool *pgxpool.Pool)
	}{
		{"revoke with a read in flight", func(t *testing.T, pool *pgxpool.Pool) {
			checkRevokeWithReadInFlight(t, grantWorldOn(t, pool))
		}},
		{"no accept after revocation", func(t *testing.T, pool *pgxpool.Pool) {
			checkNoAcceptAfterRevocation(t, fixtureOn(t, pool))
		}},
		{"accept racing close", func(t *testing.T, pool *pgxpool.Pool) {
			checkLabelAfterCloseRace(t, fixtureOn(t, pool))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, repeatableReadPool(t)) })
	}
}

// TestRevokeWithReadInFlight is checkRevokeWithReadInFlight at the server's default
// isolation.
func TestRevokeWithReadInFlight(t *testing.T) {
	checkRevokeWithReadInFlight(t, newGrantWorld(t))
}

// checkRevokeWithReadInFlight (R24): a revocation that has to wait for a read holding the
// grant, while that read records its lineage entry, still invalidates that entry: the
// revocation reads the lineage after it holds the grant row, not from a snapshot taken before.
func checkRevokeWithReadInFlight(t *testing.T, w *grantWorld) {
	t.Helper()
	w.grant("alice")
	sub := w.subscribe("alice", "demo://in-flight")
	w.publish(sub, "body", "text/plain")
	g := &passAll{}
	if _, err := w.read("alice", sub.URI, "", g.eval); err != nil { // store the verdict up front
		t.Fatal(err)
	}
	// A read in flight: it holds the grant row (FOR SHARE, as Read's statement does) until the
	// revocation is waiting for it.
	inFlight, err := w.st.Pool().BeginTx(w.ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer inFlight.Rollback(w.ctx)
	if _, err := inFlight.Exec(w.ctx, `SELECT 1 FROM grants WHERE principal = 'alice' AND source_id = $1 FOR SHARE`, w.src.ID); err != nil {
		t.Fatal(err)
	}
	type revoked struct {
		rv  ledger.Revocation
		err error
	}
	done := make(chan revoked, 1)
	go func() {
		rv, err := w.st.Revoke(w.ctx, ledger.RevokeRequest{Principal: "alice", SourceID: w.src.ID, Reason: "test"})
		done <- revoked{rv, err}
	}()
	waitLockWaiters(t, w.st.Pool(), 1)
	// Another read shares the grant with the one in flight and takes its lineage entry while
	// the revocation waits; then the read in flight ends.
	if _, err := w.read("alice", sub.URI, "idx", g.eval); err != nil {
		t.Fatalf("read while the revocation waits: %v", err)
	}
	if err := inFlight.Rollback(w.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	live, err := w.st.Lineage(w.ctx, ledger.LineageFilter{Principal: "alice", LiveOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Errorf("%d lineage entries of alice escaped the revocation: %+v", len(live), live)
	}
	if len(r.rv.Indexes) != 1 || r.rv.Indexes[0].Entries != 1 {
		t.Errorf("revocation invalidated %+v, want index idx with 1 entry", r.rv.Indexes)
	}
	if _, err := w.read("alice", sub.URI, "idx", g.eval); !errors.Is(err, ledger.ErrNoGrant) {
		t.Errorf("read after the revocation: %v, want ErrNoGrant", err)
	}
}
