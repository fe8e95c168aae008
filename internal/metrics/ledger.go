package metrics

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultLedgerTimeout bounds the ledger queries of one scrape.
const DefaultLedgerTimeout = 2 * time.Second

// maxLagRows caps the counted outbox lag of one consumer, so a far-behind consumer never
// makes a scrape scan the whole outbox.
const maxLagRows = 1_000_000

// Descriptions of the gauges computed from the ledger at scrape time.
var (
	staleDesc = prometheus.NewDesc(Namespace+"_source_staleness_seconds",
		"Per source: age of the oldest ACTIVE subscription's last confirmation (accepted or revalidated read; its start if it has none), read from the ledger at scrape time.",
		[]string{"source"}, nil)
	activeDesc = prometheus.NewDesc(Namespace+"_subscriptions",
		"Subscriptions in the ledger by state, read at scrape time.", []string{"state"}, nil)
	lagRowsDesc = prometheus.NewDesc(Namespace+"_outbox_lag_rows",
		fmt.Sprintf("Per outbox consumer: outbox rows after its committed offset (capped at %d), read at scrape time.", maxLagRows),
		[]string{"consumer"}, nil)
	lagAgeDesc = prometheus.NewDesc(Namespace+"_outbox_lag_seconds",
		"Per outbox consumer: age of the oldest outbox row after its committed offset (0 when caught up), read at scrape time.",
		[]string{"consumer"}, nil)
	verdictsDesc = prometheus.NewDesc(Namespace+"_guard_verdicts",
		"Output guard verdicts stored in the ledger (R22, one per content digest and policy), by outcome, read at scrape time.",
		[]string{"outcome"}, nil)
	upDesc = prometheus.NewDesc(Namespace+"_ledger_scrape_success",
		"1 if the ledger gauges of this scrape were read within the timeout, 0 if not (they are then missing).", nil, nil)
)

// subscriptionStates and guardOutcomes are reported at 0 when the ledger has none.
var (
	subscriptionStates = []string{"DISCOVERED", "SUBSCRIBING", "ACTIVE", "TOMBSTONE_PENDING", "UNSUBSCRIBING",
		"UNSUBSCRIBE_UNKNOWN", "CLOSED", "RECONCILIATION_REQUIRED"}
	guardOutcomes = []string{"PASS", "SANITIZED", "REJECTED"}
)

// LedgerCollector computes gauges from the ledger at each scrape, under one timeout:
// staleness per source, subscriptions by state, outbox lag per consumer and guard verdicts
// by outcome. All queries are read-only; a scrape that cannot read the ledger in time
// reports mcpsync_ledger_scrape_success 0 and logs the failure once until it recovers.
type LedgerCollector struct {
	pool    *pgxpool.Pool
	timeout time.Duration
	log     *zap.Logger

	mu      sync.Mutex
	lastErr string
}

// NewLedgerCollector returns a collector over pool; timeout ≤ 0 means DefaultLedgerTimeout.
func NewLedgerCollector(pool *pgxpool.Pool, timeout time.Duration, log *zap.Logger) *LedgerCollector {
	if timeout <= 0 {
		timeout = DefaultLedgerTimeout
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &LedgerCollector{pool: pool, timeout: timeout, log: log}
}

// Describe sends the descriptions of every gauge.
func (c *LedgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{staleDesc, activeDesc, lagRowsDesc, lagAgeDesc, verdictsDesc, upDesc} {
		ch <- d
	}
}

// Collect reads the ledger and sends the gauges; on failure it sends only the success gauge
// at 0, so that a partial set is never mistaken for a complete one.
func (c *LedgerCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	var ms []prometheus.Metric
	err := c.collect(ctx, func(m prometheus.Metric) { ms = append(ms, m) })
	c.mu.Lock()
	if err != nil {
		if text := err.Error(); text != c.lastErr {
			c.lastErr = text
			c.log.Warn("metrics: reading the ledger gauges failed", zap.Error(err))
		}
	} else {
		c.lastErr = ""
	}
	c.mu.Unlock()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 0)
		return
	}
	for _, m := range ms {
		ch <- m
	}
	ch <- prometheus.MustNewConstMetric(upDesc, prometheus.GaugeValue, 1)
}

func (c *LedgerCollector) collect(ctx context.Context, emit func(prometheus.Metric)) error {
	// Staleness: the ACTIVE subscriptions of each source; greatest() skips NULLs.
	rows, err := c.pool.Query(ctx, `
		SELECT so.name, extract(epoch FROM now() - min(greatest(s.last_verified_at, s.last_accepted_at, s.started_at)))::float8
		FROM subscriptions s JOIN sources so ON so.id = s.source_id
		WHERE s.state = 'ACTIVE'
		GROUP BY so.name`)
	if err != nil {
		return fmt.Errorf("staleness: %w", err)
	}
	if err := eachRow(rows, func(r pgx.CollectableRow) error {
		var name string
		var age float64
		if err := r.Scan(&name, &age); err != nil {
			return err
		}
		emit(prometheus.MustNewConstMetric(staleDesc, prometheus.GaugeValue, max(age, 0), name))
		return nil
	}); err != nil {
		return fmt.Errorf("staleness: %w", err)
	}

	if err := c.counts(ctx, `SELECT state, count(*) FROM subscriptions GROUP BY state`, subscriptionStates, activeDesc, emit); err != nil {
		return fmt.Errorf("subscriptions by state: %w", err)
	}

	// Outbox lag: rows after each consumer's (txid, id) offset, in the outbox's own order.
	rows, err = c.pool.Query(ctx, `
		SELECT c.name,
		       (SELECT count(*) FROM (SELECT 1 FROM invalidation_outbox o
		                              WHERE (o.txid, o.id) > (c.txid, c.last_id) LIMIT $1) x)::float8,
		       coalesce(extract(epoch FROM now() - (SELECT o.created_at FROM invalidation_outbox o
		                              WHERE (o.txid, o.id) > (c.txid, c.last_id) ORDER BY o.txid, o.id LIMIT 1)), 0)::float8
		FROM outbox_consumers c`, maxLagRows)
	if err != nil {
		return fmt.Errorf("outbox lag: %w", err)
	}
	if err := eachRow(rows, func(r pgx.CollectableRow) error {
		var name string
		var n, age float64
		if err := r.Scan(&name, &n, &age); err != nil {
			return err
		}
		emit(prometheus.MustNewConstMetric(lagRowsDesc, prometheus.GaugeValue, n, name))
		emit(prometheus.MustNewConstMetric(lagAgeDesc, prometheus.GaugeValue, max(age, 0), name))
		return nil
	}); err != nil {
		return fmt.Errorf("outbox lag: %w", err)
	}

	if err := c.counts(ctx, `SELECT outcome, count(*) FROM guard_verdicts GROUP BY outcome`, guardOutcomes, verdictsDesc, emit); err != nil {
		return fmt.Errorf("guard verdicts: %w", err)
	}
	return nil
}

// counts emits one gauge per label value from a (label, count) query, 0 for each of known
// the query did not return.
func (c *LedgerCollector) counts(ctx context.Context, query string, known []string, d *prometheus.Desc, emit func(prometheus.Metric)) error {
	rows, err := c.pool.Query(ctx, query)
	if err != nil {
		return err
	}
	got := map[string]float64{}
	if err := eachRow(rows, func(r pgx.CollectableRow) error {
		var k string
		var n int64
		if err := r.Scan(&k, &n); err != nil {
			return err
		}
		got[k] = float64(n)
		return nil
	}); err != nil {
		return err
	}
	for _, k := range known {
		if _, ok := got[k]; !ok {
			got[k] = 0
		}
	}
	for k, n := range got {
		emit(prometheus.MustNewConstMetric(d, prometheus.GaugeValue, n, k))
	}
	return nil
}

func eachRow(rows pgx.Rows, f func(pgx.CollectableRow) error) error {
	_, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) { return struct{}{}, f(r) })
	return err
}

// RevocationLatency returns how long ago, on the database clock, the first revocation that
// named subscription id (generation gen) committed, or ok=false when no revocation named it
// since its previous generation closed. It is read right after the subscription passed the
// close fence, so it is the revocation → close fence latency (R29).
func RevocationLatency(ctx context.Context, pool *pgxpool.Pool, id, gen int64) (d time.Duration, ok bool, err error) {
	var secs *float64
	err = pool.QueryRow(ctx, `
		SELECT extract(epoch FROM now() - min(r.revoked_at))::float8
		FROM revocation_subscriptions rs JOIN revocations r ON r.id = rs.revocation_id
		WHERE rs.subscription_id = $1
		  AND r.revoked_at > coalesce((SELECT max(rc.created_at) FROM receipts rc
		                               WHERE rc.subscription_id = $1 AND rc.kind = 'CLOSE_FENCE' AND rc.generation < $2),
		                              '-infinity'::timestamptz)`, id, gen).Scan(&secs)
	if err != nil {
		return 0, false, fmt.Errorf("metrics: revocation latency of subscription %d: %w", id, err)
	}
	if secs == nil {
		return 0, false, nil
	}
	return time.Duration(*secs * float64(time.Second)), true, nil
}
