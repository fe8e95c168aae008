package ledger_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/harness/shuffle"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// pruneShuffles is how many shuffled interleavings each round of TestPruneUnderShuffles runs
// (MCPSYNC_PRUNE_SHUFFLES, default 120).
func pruneShuffles() int {
	if n, err := strconv.Atoi(os.Getenv("MCPSYNC_PRUNE_SHUFFLES")); err == nil && n > 0 {
		return n
	}
	return 120
}

// pruneSeed is the seed of round 1's shuffles (MCPSYNC_PRUNE_SEED, default from the clock);
// rounds 2 and 3 run from the seeds after it.
func pruneSeed() int64 {
	if n, err := strconv.ParseInt(os.Getenv("MCPSYNC_PRUNE_SEED"), 10, 64); err == nil {
		return n
	}
	return time.Now().UnixNano() % 1_000_000_000
}

// keptFacts are what the fences of a set of subscriptions rest on, as rows of text: the
// subscription rows (watermarks, close fences), every state-changing receipt, the newest
// version of each, the dispatches at and above each watermark, and the outbox rows a consumer
// has not passed.
func keptFacts(t *testing.T, pool *pgxpool.Pool, upTo, outboxUpTo int64, consumer ledger.OutboxCursor) map[string][]string {
	t.Helper()
	q := map[string]string{
		"subscriptions": `SELECT concat_ws(' ', id, state, generation, session_generation, last_issued_ordinal,
				last_accepted_ordinal, close_ordinal, close_epoch, last_accepted_digest)
			FROM subscriptions WHERE id <= $1 ORDER BY id`,
		"state receipts": `SELECT concat_ws(' ', id, subscription_id, kind, generation, session_generation, read_ordinal)
			FROM receipts WHERE subscription_id <= $1 AND kind IN ('SUBSCRIPTION_OPENED', 'SUBSCRIBING', 'ACTIVATED',
				'TOMBSTONE_CLEARED', 'RECONCILIATION_REQUIRED', 'SESSION_CHANGED', 'CLOSE_FENCE', 'TOMBSTONE_CONFIRMED',
				'UNSUBSCRIBE_UNKNOWN', 'CLOSED', 'CLOSED_WITH_SESSION', 'TOMBSTONE_PENDING')
			ORDER BY id`,
		"newest versions": `SELECT DISTINCT ON (subscription_id) concat_ws(' ', subscription_id, id, read_ordinal, kind, digest)
			FROM resource_versions WHERE subscription_id <= $1 ORDER BY subscription_id, read_ordinal DESC`,
		"tombstones": `SELECT concat_ws(' ', subscription_id, id, read_ordinal) FROM resource_versions
			WHERE subscription_id <= $1 AND kind = 'tombstone' ORDER BY id`,
		"dispatches at and above the watermark": `SELECT concat_ws(' ', d.subscription_id, d.ordinal, d.request_id, d.outcome)
			FROM read_dispatches d JOIN subscriptions s ON s.id = d.subscription_id
			WHERE s.id <= $1 AND d.ordinal >= s.last_accepted_ordinal AND d.generation = s.generation
			ORDER BY d.subscription_id, d.ordinal`,
	}
	out := map[string][]string{}
	for name, sql := range q {
		rows, err := pool.Query(context.Background(), sql, upTo)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		list, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		out[name] = list
	}
	rows, err := pool.Query(context.Background(), `SELECT idempotency_key FROM invalidation_outbox
		WHERE (txid, id) > ($1::text::xid8, $2::bigint) AND id <= $3 ORDER BY txid, id`, strconv.FormatUint(consumer.TxID, 10), consumer.ID, outboxUpTo)
	if err != nil {
		t.Fatal(err)
	}
	if out["outbox rows past the consumer"], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	return out
}

// replay is an acceptance the shuffles made at an ordinal below its subscription's watermark:
// the prune may delete its receipt and dispatch, and a retry of it must still be refused.
type replay struct {
	req ledger.AcceptRequest
}

func acceptedBelowWatermark(t *testing.T, pool *pgxpool.Pool) []replay {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT r.subscription_id, r.generation, r.session_generation, r.uri,
			r.read_ordinal, r.request_id, r.digest
		FROM receipts r JOIN subscriptions s ON s.id = r.subscription_id
		WHERE r.kind IN ('ACCEPTED', 'REVALIDATED') AND r.read_ordinal < s.last_accepted_ordinal ORDER BY r.id`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (replay, error) {
		var x replay
		err := r.Scan(&x.req.SubscriptionID, &x.req.Generation, &x.req.SessionGeneration, &x.req.URI,
			&x.req.Ordinal, &x.req.RequestID, &x.req.Version.Digest)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// passHalf picks the cursor of a consumer that has passed the first half of the outbox rows,
// moved on to the first row naming a content version that a newer version supersedes if the
// first half holds none, and returns it with how many rows it passes. It fails the test when
// no row names a superseded version or none would be left past the cursor.
func passHalf(t *testing.T, pool *pgxpool.Pool) (ledger.OutboxCursor, int) {
	t.Helper()
	type row struct {
		txid       string
		id         int64
		superseded bool
	}
	rows, err := pool.Query(context.Background(), `SELECT o.txid::text, o.id, EXISTS (SELECT 1 FROM resource_versions v
			WHERE v.subscription_id = o.subscription_id AND v.read_ordinal = o.read_ordinal AND v.kind = 'content'
			AND EXISTS (SELECT 1 FROM resource_versions n WHERE n.subscription_id = v.subscription_id AND n.read_ordinal > v.read_ordinal))
		FROM invalidation_outbox o ORDER BY o.txid, o.id`)
	if err != nil {
		t.Fatal(err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.txid, &x.id, &x.superseded)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	first := -1
	for i, r := range list {
		if r.superseded {
			first = i
			break
		}
	}
	at := max(len(list)/2, first)
	if first < 0 || at >= len(list)-1 {
		t.Fatalf("round 1 left %d outbox rows, the first naming a superseded version at %d: no cursor passes one and leaves a row past it", len(list), first)
	}
	txid, err := strconv.ParseUint(list[at].txid, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return ledger.OutboxCursor{TxID: txid, ID: list[at].id}, at + 1
}

func runShuffles(t *testing.T, pool *pgxpool.Pool, seed int64, n int) {
	t.Helper()
	rep, err := shuffle.Run(context.Background(), pool, shuffle.Options{Interleavings: n, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Interleavings != n || !rep.OK() {
		var b strings.Builder
		_ = rep.WriteTable(&b)
		t.Fatalf("shuffles from seed %d: %d of %d checked, %d violations:\n%s", seed, rep.Interleavings, n, rep.Violations(), b.String())
	}
}

// Issue 17 item 6: retention under the shuffle harness (R26). Round 1 runs shuffled
// interleavings; round 2 runs as many again on the same ledger while a pruner deletes, over
// and over, everything of round 1 the keep rules let go, so deletions race the fences of live
// subscriptions; then everything is pruned (--older-than 0) and round 3 runs. Every round's
// checker reports zero violations; round 1's subscriptions keep their watermarks, close
// receipts, newest versions, tombstones, dispatches at and above the watermark and the outbox
// rows a consumer has not passed; every acceptance below a watermark whose receipt the prune
// deleted is refused when retried; and the R24 invariants hold over the whole ledger.
func TestPruneUnderShuffles(t *testing.T) {
	n := pruneShuffles()
	ctx := context.Background()
	cfg, err := shuffle.PoolConfig(pgtest.NewDB(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st := ledger.New(pool)
	seed := pruneSeed()
	t.Logf("seed %d, %d interleavings per round (MCPSYNC_PRUNE_SEED=%d repeats it)", seed, n, seed)

	if _, err := st.EnsureConsumer(ctx, "half", false); err != nil {
		t.Fatal(err)
	}
	runShuffles(t, pool, seed, n)

	// The consumer passes the first half of round 1's outbox rows, and at least the first row
	// that names a superseded content version (how many of those the first half holds depends
	// on how the shuffles ran; without one, no version would be the pruner's to delete).
	half, passed := passHalf(t, pool)
	if _, err := st.CommitConsumer(ctx, "half", half, passed); err != nil {
		t.Fatal(err)
	}
	var lastSub, lastOutbox int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT max(id) FROM subscriptions), (SELECT max(id) FROM invalidation_outbox)`).
		Scan(&lastSub, &lastOutbox); err != nil {
		t.Fatal(err)
	}
	facts := keptFacts(t, pool, lastSub, lastOutbox, half)
	replays := acceptedBelowWatermark(t, pool)

	// Round 2, with a pruner deleting round 1's history meanwhile: its cutoff lies between the
	// end of round 1 and the start of round 2.
	round1End := time.Now()
	time.Sleep(1500 * time.Millisecond)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var concurrent ledger.PruneReport
	var pruneErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			rep, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: time.Since(round1End) - 500*time.Millisecond, BatchSize: 500})
			if err != nil {
				pruneErr = err
				return
			}
			for i, tb := range rep.Tables {
				if i >= len(concurrent.Tables) {
					concurrent.Tables = append(concurrent.Tables, ledger.PruneTable{Table: tb.Table})
				}
				concurrent.Tables[i].Deleted += tb.Deleted
			}
			select {
			case <-done:
				return
			default:
			}
		}
	}()
	runShuffles(t, pool, seed+int64(n), n)
	close(done)
	wg.Wait()
	if pruneErr != nil {
		t.Fatalf("concurrent prune: %v", pruneErr)
	}
	for _, table := range []string{"invalidation_outbox", "resource_versions", "read_dispatches", "receipts"} {
		if concurrent.Table(table).Deleted == 0 {
			t.Errorf("the concurrent pruner deleted no rows of %s: the test proves nothing about them", table)
		}
	}
	var during strings.Builder
	for _, tb := range concurrent.Tables {
		fmt.Fprintf(&during, "%s -%d; ", tb.Table, tb.Deleted)
	}
	t.Logf("deleted while round 2 ran: %s", during.String())

	if diff := cmp.Diff(facts, keptFacts(t, pool, lastSub, lastOutbox, half)); diff != "" {
		t.Errorf("what round 1's fences rest on changed (-before +after the prune):\n%s", diff)
	}
	var left int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM receipts r JOIN subscriptions s ON s.id = r.subscription_id
		WHERE s.id <= $1 AND r.kind IN ('ACCEPTED', 'REVALIDATED') AND r.read_ordinal < s.last_accepted_ordinal`, lastSub).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if len(replays) == 0 || left != 0 {
		t.Errorf("%d acceptances below a watermark before the prune, %d receipts of them left after it", len(replays), left)
	}
	for _, r := range replays {
		res, err := st.AcceptResourceVersion(ctx, r.req)
		if err != nil {
			t.Fatalf("replay %+v: %v", r.req, err)
		}
		if res.Outcome == mcpsync.OutcomeAccepted || res.Outcome == mcpsync.OutcomeRevalidated {
			t.Errorf("replayed acceptance of ordinal %d (subscription %d) after the prune: %s", r.req.Ordinal, r.req.SubscriptionID, res.Outcome)
		}
	}
	after := keptFacts(t, pool, lastSub, lastOutbox, half)
	if diff := cmp.Diff(facts["subscriptions"], after["subscriptions"]); diff != "" {
		t.Errorf("replays moved a subscription (-before +after):\n%s", diff)
	}
	checkInvariants(t, pool, "after round 2 and the concurrent prune")

	// Everything the rules let go, then round 3 on the pruned ledger.
	final, err := st.Prune(ctx, ledger.PruneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if final.Deleted() == 0 {
		t.Error("pruning round 2's history deleted nothing")
	}
	checkInvariants(t, pool, "after pruning everything")
	runShuffles(t, pool, seed+2*int64(n), n)
	checkInvariants(t, pool, "after round 3")
	var b strings.Builder
	for _, tb := range final.Tables {
		fmt.Fprintf(&b, "%s -%d; ", tb.Table, tb.Deleted)
	}
	t.Logf("final prune: %s", b.String())
}

func checkInvariants(t *testing.T, pool *pgxpool.Pool, when string) {
	t.Helper()
	rep, err := invariants.Check(context.Background(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Violations() != 0 {
		t.Errorf("R24 invariants %s: %s", when, rep)
	}
}
