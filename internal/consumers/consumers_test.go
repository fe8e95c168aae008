package consumers_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newStore(t *testing.T) (context.Context, *ledger.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx, ledger.New(pgtest.NewPool(t))
}

// insert writes outbox rows keyed keys in one transaction.
func insert(ctx context.Context, tx pgx.Tx, keys ...string) error {
	for _, k := range keys {
		if _, err := tx.Exec(ctx, `INSERT INTO invalidation_outbox (kind, idempotency_key) VALUES ('test', $1)`, k); err != nil {
			return err
		}
	}
	return nil
}

func write(t *testing.T, ctx context.Context, st *ledger.Store, keys ...string) {
	t.Helper()
	if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return insert(ctx, tx, keys...) }); err != nil {
		t.Fatal(err)
	}
}

// collector records deliveries; it can fail one batch to simulate a crash before the commit.
type collector struct {
	mu      sync.Mutex
	keys    []string
	cursors []ledger.OutboxCursor
	failAt  int // 1-based batch number that fails (0: none)
	batches int
}

var errCrash = errors.New("crashed after printing, before committing")

func (c *collector) deliver(_ context.Context, rows []ledger.OutboxEvent) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batches++
	for _, r := range rows {
		c.keys = append(c.keys, r.IdempotencyKey)
		c.cursors = append(c.cursors, r.Cursor)
	}
	if c.batches == c.failAt {
		return errCrash
	}
	return nil
}

func (c *collector) snapshot() ([]string, []ledger.OutboxCursor) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.keys), slices.Clone(c.cursors)
}

// waitRows waits until n rows are readable in commit-safe order: rows wait for every older
// transaction of the whole server to end, and other tests share the server.
func waitRows(t *testing.T, ctx context.Context, st *ledger.Store, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rows, _, err := st.OutboxBatch(ctx, ledger.OutboxCursor{}, n)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d outbox rows readable after a minute", len(rows), n)
		}
	}
}

// At-least-once: a consumer that fails while delivering batch k (after printing it, before
// committing) replays exactly that batch on the next run, then continues; deduplicating by
// idempotency key yields every row exactly once.
func TestCrashReplaysOnlyTheUncommittedBatch(t *testing.T) {
	ctx, st := newStore(t)
	var all []string
	for i := range 10 {
		all = append(all, fmt.Sprintf("k%02d", i))
	}
	write(t, ctx, st, all...)
	waitRows(t, ctx, st, len(all))
	tests := []struct {
		name     string
		failAt   int
		wantRun1 []string
		wantRun2 []string
	}{
		{"crash in the first batch", 1, all[:3], all},
		{"crash in the third batch", 3, all[:9], all[6:]},
		{"crash in the last, short batch", 4, all, all[9:]},
		{"no crash", 0, all, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "c-" + tt.name
			first := &collector{failAt: tt.failAt}
			_, err := consumers.Run(ctx, st, consumers.Options{Consumer: name, Batch: 3}, first.deliver)
			if tt.failAt > 0 && !errors.Is(err, errCrash) || tt.failAt == 0 && err != nil {
				t.Fatalf("first run: %v", err)
			}
			second := &collector{}
			if _, err := consumers.Run(ctx, st, consumers.Options{Consumer: name, Batch: 3}, second.deliver); err != nil {
				t.Fatalf("second run: %v", err)
			}
			k1, _ := first.snapshot()
			k2, _ := second.snapshot()
			if diff := cmp.Diff(tt.wantRun1, k1); diff != "" {
				t.Errorf("first run delivered (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantRun2, k2); diff != "" {
				t.Errorf("second run delivered (-want +got):\n%s", diff)
			}
			seen := map[string]bool{}
			var once []string
			for _, k := range append(k1, k2...) {
				if !seen[k] {
					seen[k] = true
					once = append(once, k)
				}
			}
			if diff := cmp.Diff(all, once); diff != "" {
				t.Errorf("deduplicated by idempotency key (-want +got):\n%s", diff)
			}
		})
	}
}

// Rows committed out of id order are delivered in commit-safe (txid, id) order, and a row of
// a transaction still running holds back every row after it: no gap, whatever the commit order.
func TestNoGapWhenWritersCommitOutOfOrder(t *testing.T) {
	ctx, st := newStore(t)
	slow, err := st.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Rollback(context.WithoutCancel(ctx))
	if _, err := slow.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil { // the older transaction
		t.Fatal(err)
	}
	write(t, ctx, st, "fast-1") // younger, commits first, smaller id
	if err := insert(ctx, slow, "slow-1"); err != nil {
		t.Fatal(err)
	}
	write(t, ctx, st, "fast-2")
	c := &collector{}
	stats, err := consumers.Run(ctx, st, consumers.Options{Consumer: "ordered"}, c.deliver)
	if err != nil {
		t.Fatal(err)
	}
	if keys, _ := c.snapshot(); len(keys) != 0 || stats.Delivered != 0 {
		t.Fatalf("delivered %v while an older transaction runs, want nothing", keys)
	}
	if err := slow.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitRows(t, ctx, st, 3)
	if _, err := consumers.Run(ctx, st, consumers.Options{Consumer: "ordered"}, c.deliver); err != nil {
		t.Fatal(err)
	}
	keys, _ := c.snapshot()
	if diff := cmp.Diff([]string{"slow-1", "fast-1", "fast-2"}, keys); diff != "" {
		t.Errorf("delivery order (-want +got):\n%s", diff)
	}
}

// Many writers commit concurrently, in whatever order the server picks, while a follower
// delivers: it delivers every row exactly once (no crash, so no replay), never goes back in
// (txid, id) order, and ends with the order a reader of the finished outbox sees.
func TestFollowerSeesEveryRowOnceUnderConcurrentWriters(t *testing.T) {
	ctx, st := newStore(t)
	const writers, txs = 8, 40
	c := &collector{}
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := consumers.Run(fctx, st, consumers.Options{Consumer: "follower", Follow: true, Batch: 7, PollInterval: 50 * time.Millisecond}, c.deliver)
		done <- err
	}()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	total := 0
	for w := range writers {
		total += txs * (1 + w%3)
		wg.Go(func() {
			for i := range txs {
				var keys []string
				for r := range 1 + w%3 {
					keys = append(keys, fmt.Sprintf("w%d-t%d-r%d", w, i, r))
				}
				if err := pgx.BeginFunc(ctx, st.Pool(), func(tx pgx.Tx) error { return insert(ctx, tx, keys...) }); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		keys, _ := c.snapshot()
		if len(keys) >= total || time.Now().After(deadline) {
			break
		}
		if _, err := st.ConsumerOffsets(ctx); err != nil { // a round trip between looks
			t.Fatal(err)
		}
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("follower: %v", err)
	}
	keys, cursors := c.snapshot()
	if len(keys) != total {
		t.Fatalf("delivered %d rows, want %d", len(keys), total)
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Errorf("row %s delivered twice", k)
		}
		seen[k] = true
	}
	for i := 1; i < len(cursors); i++ {
		a, b := cursors[i-1], cursors[i]
		if a.TxID > b.TxID || a.TxID == b.TxID && a.ID >= b.ID {
			t.Fatalf("delivery went back: %+v then %+v", a, b)
		}
	}
	final, _, err := st.OutboxBatch(ctx, ledger.OutboxCursor{}, total+1)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range final {
		want = append(want, r.IdempotencyKey)
	}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("follower order vs the finished outbox (-want +got):\n%s", diff)
	}
}

// A follower whose fallback poll is an hour away is woken by the NOTIFY of a commit that
// wrote a row of a notifying kind: the revocation kinds by default, or a kind made notifying.
func TestNotifyWakesFollower(t *testing.T) {
	ctx, st := newStore(t)
	if err := st.SetOutboxNotify(ctx, "custom", true); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, kind string }{
		{"index invalidation notifies by default", ledger.OutboxIndexInvalidation},
		{"revocation notifies by default", ledger.OutboxRevocation},
		{"a kind made notifying", "custom"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &collector{}
			fctx, stop := context.WithCancel(ctx)
			defer stop()
			type result struct {
				stats consumers.Stats
				err   error
			}
			done := make(chan result, 1)
			idle := make(chan struct{}, 1)
			go func() {
				s, err := consumers.Run(fctx, st, consumers.Options{Consumer: fmt.Sprintf("sleepy-%d", i), Follow: true,
					StartAtHead: true, PollInterval: time.Hour, Limit: 1, Idle: func() {
						select {
						case idle <- struct{}{}:
						default:
						}
					}}, c.deliver)
				done <- result{s, err}
			}()
			select {
			case <-idle: // listening, everything readable delivered, its poll an hour away
			case r := <-done:
				t.Fatalf("follower ended: %v", r.err)
			}
			key := fmt.Sprintf("wake-%d", i)
			if _, err := st.Pool().Exec(ctx, `INSERT INTO invalidation_outbox (kind, idempotency_key) VALUES ($1, $2)`, tt.kind, key); err != nil {
				t.Fatal(err)
			}
			select {
			case r := <-done:
				if r.err != nil {
					t.Fatal(r.err)
				}
				if r.stats.Wakeups == 0 {
					t.Errorf("delivered without a notification: %+v", r.stats)
				}
			case <-time.After(2 * time.Minute):
				t.Fatal("follower not woken by NOTIFY")
			}
			got, _ := c.snapshot()
			if diff := cmp.Diff([]string{key}, got); diff != "" {
				t.Errorf("delivered (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConsumerNameIsExclusiveAndOffsetsOnlyMoveForward(t *testing.T) {
	ctx, st := newStore(t)
	write(t, ctx, st, "a", "b")
	waitRows(t, ctx, st, 2)
	l, err := st.ListenOutbox(ctx, "solo")
	if err != nil {
		t.Fatal(err)
	}
	_, err = consumers.Run(ctx, st, consumers.Options{Consumer: "solo"}, (&collector{}).deliver)
	if !errors.Is(err, ledger.ErrConsumerBusy) {
		t.Errorf("second consumer under a held name: %v, want ErrConsumerBusy", err)
	}
	l.Close()
	c := &collector{}
	if _, err := consumers.Run(ctx, st, consumers.Options{Consumer: "solo"}, c.deliver); err != nil {
		t.Fatalf("after the holder closed: %v", err)
	}
	_, cursors := c.snapshot()
	if len(cursors) != 2 {
		t.Fatalf("delivered %d rows, want 2", len(cursors))
	}
	tests := []struct {
		name  string
		cur   ledger.OutboxCursor
		moved bool
	}{
		{"older cursor", cursors[0], false},
		{"same cursor", cursors[1], false},
		{"newer cursor", ledger.OutboxCursor{TxID: cursors[1].TxID, ID: cursors[1].ID + 1}, true},
	}
	for _, tt := range tests {
		moved, err := st.CommitConsumer(ctx, "solo", tt.cur, 0)
		if err != nil || moved != tt.moved {
			t.Errorf("%s: moved %v err %v, want %v", tt.name, moved, err, tt.moved)
		}
	}
	fresh, err := st.EnsureConsumer(ctx, "late", true)
	if err != nil {
		t.Fatal(err)
	}
	if fresh.Cursor != cursors[1] {
		t.Errorf("consumer created at head starts at %+v, want %+v", fresh.Cursor, cursors[1])
	}
}
