package consumers_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Readers without a name (mcpsync watch) listen side by side, take no consumer's lock, and are
// woken by a notifying row's commit while their poll is an hour away.
func TestAnonymousListenersWake(t *testing.T) {
	ctx, st := newStore(t)
	var ws []*consumers.Waiter
	for range 2 {
		l, err := st.ListenOutbox(ctx, "")
		if err != nil {
			t.Fatalf("a second reader without a name: %v", err)
		}
		defer l.Close()
		ws = append(ws, consumers.NewWaiter(l, time.Hour))
	}
	named, err := st.ListenOutbox(ctx, "named")
	if err != nil {
		t.Fatalf("a named consumer beside readers without a name: %v", err)
	}
	named.Close()
	if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO invalidation_outbox (kind, idempotency_key) VALUES ($1, 'wake')`, ledger.OutboxRevocation)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		if woke, err := w.Wait(ctx, false); err != nil || !woke {
			t.Errorf("reader %d: woke %t, %v; want woken by the notification", i, woke, err)
		}
	}
}

// Rows held back behind an older transaction are read again soon, not at the poll: the wait
// returns without a notification while the poll is an hour away, and so does a waiter
// without a listener.
func TestHeldBackRetriesBeforeThePoll(t *testing.T) {
	ctx, st := newStore(t)
	l, err := st.ListenOutbox(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, w := range []*consumers.Waiter{consumers.NewWaiter(l, time.Hour), consumers.NewWaiter(nil, time.Hour)} {
		for i := range 5 {
			if woke, err := w.Wait(ctx, true); err != nil || woke {
				t.Fatalf("held-back retry %d: woke %t, %v; want a timed retry", i, woke, err)
			}
		}
		w.Delivered()
	}
}
