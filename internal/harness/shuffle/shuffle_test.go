package shuffle_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/pgtest"
	"github.com/mcpsync/mcpsync/internal/harness/shuffle"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Flags, with environment fallbacks so that make targets can pass them to `go test ./...`.
var (
	seedFlag          = flag.Int64("seed", envInt("MCPSYNC_SHUFFLE_SEED", 0), "seed of the first interleaving (0: derived from the clock and printed)")
	interleavingsFlag = flag.Int("interleavings", int(envInt("MCPSYNC_SHUFFLE_INTERLEAVINGS", 10000)), "how many interleavings TestShuffle runs")
	concurrencyFlag   = flag.Int("concurrency", int(envInt("MCPSYNC_SHUFFLE_CONCURRENCY", 0)), "interleavings in flight (0: the package default)")
)

func envInt(name string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil {
		return v
	}
	return def
}

// newPool gives the harness a fresh ledger database, with a pool sized for concurrency
// interleavings in flight.
func newPool(t *testing.T, concurrency int) *pgxpool.Pool {
	t.Helper()
	cfg, err := shuffle.PoolConfig(pgtest.NewDB(t), concurrency)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// R26: the ledger's fences hold across -interleavings (default 10,000) shuffled
// notification/read/close interleavings, each racing against the real Postgres ledger.
func TestShuffle(t *testing.T) {
	seed := *seedFlag
	if seed == 0 {
		seed = time.Now().UnixNano() % 1_000_000_000
	}
	opts := shuffle.Options{Interleavings: *interleavingsFlag, Seed: seed, Concurrency: *concurrencyFlag}
	pool := newPool(t, opts.Concurrency)
	t.Logf("seed %d, %d interleavings (replay: go test ./internal/harness/shuffle -run 'TestShuffle$' -timeout 0 -seed=%d -interleavings=%d)",
		seed, opts.Interleavings, seed, opts.Interleavings)
	rep, err := shuffle.Run(context.Background(), pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	_ = rep.WriteTable(&b)
	if testing.Verbose() {
		b.WriteString("outcomes:\n")
		_ = rep.WriteOutcomes(&b)
	}
	t.Logf("\n%s", b.String())
	if rep.Interleavings != opts.Interleavings {
		t.Errorf("checked %d interleavings, want %d", rep.Interleavings, opts.Interleavings)
	}
	if !rep.OK() {
		t.Errorf("%d invariant violations (seed %d); first: %v", rep.Violations(), seed, rep.Examples[0])
	}
}

// brokenAccept is an acceptance point with one fence condition left out, written as raw SQL
// (otherwise the ledger's statement): the negative control that proves the checker can fail.
// When it does not apply, the ledger's own AcceptResourceVersion answers (and records the
// refusal).
func brokenAccept(skip string) shuffle.AcceptFunc {
	conds := []struct{ name, cond string }{
		{"watermark", "s.last_accepted_ordinal < $5"},
		{"state", "s.state = 'ACTIVE'"},
		{"session", "s.session_generation = $3"},
	}
	var where []string
	for _, c := range conds {
		if c.name != skip {
			where = append(where, c.cond)
		}
	}
	q := `
		WITH upd AS (
			UPDATE subscriptions s SET last_accepted_ordinal = $5, last_accepted_digest = $6, updated_at = now()
			WHERE s.id = $1 AND s.generation = $2 AND ` + strings.Join(where, " AND ") + `
			  AND s.last_accepted_ordinal <> $5
			  AND EXISTS (SELECT 1 FROM read_dispatches d WHERE d.subscription_id = $1 AND d.ordinal = $5
			              AND d.request_id = $4 AND d.generation = $2 AND d.outcome IS NULL)
			RETURNING s.id, s.principal, s.source_id, s.uri),
		ver AS (
			INSERT INTO resource_versions (subscription_id, principal, source_id, uri, kind, mime_type, digest,
				size, read_ordinal, generation, session_generation, request_id, auth_subject)
			SELECT id, principal, source_id, uri, 'content', 'text/plain', $6, 0, $5, $2, $3, $4, 'shuffle' FROM upd
			RETURNING id),
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, principal, source_id, uri, digest, read_ordinal)
			SELECT 'version', 'version/' || id || '/' || $5::bigint, id, principal, source_id, uri, $6, $5 FROM upd
			RETURNING id),
		dis AS (
			UPDATE read_dispatches SET outcome = 'ACCEPTED', completed_at = now()
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM upd)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation, session_generation,
				read_ordinal, request_id, uri, digest, detail)
			SELECT $7, 'ACCEPTED', source_id, id, $2, $3, $5, $4, uri, $6, jsonb_build_object('outbox', (SELECT id FROM ob))
			FROM upd
			RETURNING 1)
		SELECT (SELECT id FROM ver), (SELECT count(*) FROM dis), (SELECT count(*) FROM rc)`
	return func(ctx context.Context, st *ledger.Store, req ledger.AcceptRequest) (ledger.AcceptResult, error) {
		var id *int64
		key := fmt.Sprintf("accept/%d/%d/%s/%s", req.SubscriptionID, req.Ordinal, req.RequestID, req.Version.Digest)
		err := st.Pool().QueryRow(ctx, q, req.SubscriptionID, req.Generation, req.SessionGeneration, req.RequestID,
			req.Ordinal, req.Version.Digest, key).Scan(&id, new(int64), new(int64))
		if err != nil {
			return ledger.AcceptResult{}, fmt.Errorf("broken accept: %w", err)
		}
		if id != nil {
			return ledger.AcceptResult{Outcome: mcpsync.OutcomeAccepted, VersionID: *id}, nil
		}
		return st.AcceptResourceVersion(ctx, req)
	}
}

// The checker can fail: with one fence condition of the acceptance point left out, a few
// hundred interleavings are enough for it to report the violations that condition prevents,
// and for porcupine to find histories the model cannot explain.
func TestShuffleCatchesBrokenAccept(t *testing.T) {
	tests := []struct {
		skip   string
		caught func(shuffle.Report) int
	}{
		{"watermark", func(r shuffle.Report) int { return r.VersionRegressions }},
		{"state", func(r shuffle.Report) int { return r.NonActiveAcceptances + r.VersionsAfterClose + r.OutboxAfterClose }},
		{"session", func(r shuffle.Report) int { return r.OldSessionAcceptances }},
	}
	seed := *seedFlag
	if seed == 0 {
		seed = 1
	}
	for _, tt := range tests {
		t.Run("without "+tt.skip, func(t *testing.T) {
			opts := shuffle.Options{Interleavings: 400, Seed: seed, Accept: brokenAccept(tt.skip)}
			rep, err := shuffle.Run(context.Background(), newPool(t, 0), opts)
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			quiet := rep
			quiet.Examples = nil // expected violations; the counters say enough
			_ = quiet.WriteTable(&b)
			t.Logf("accept without the %s condition:\n%s", tt.skip, b.String())
			if tt.caught(rep) == 0 {
				t.Errorf("the checker missed an accept without the %s condition in %d interleavings", tt.skip, rep.Interleavings)
			}
			if rep.NonLinearizable == 0 {
				t.Errorf("porcupine explained every history of an accept without the %s condition", tt.skip)
			}
		})
	}
}
