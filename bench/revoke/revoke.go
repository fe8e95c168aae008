// Package revoke measures permission revocation end to end (R29 in docs/SPEC.md): the
// time from `mcpsync revoke PRINCIPAL SOURCE` to every affected derived index's invalidation
// being delivered to that index's outbox consumer, and to the principal's subscriptions being
// CLOSED through the close fence.
//
// It runs its own stack in this process: an in-process Temporal server (temporaltest), a
// PostgreSQL database (a new database on the server named by -database-url, or a private
// cluster started from the machine's binaries), an mcpsync worker with its session host, and a
// fault-injecting MCP server over streamable HTTP. It seeds P principals with S/P
// subscriptions each (1,000 in all by default), lets I derived indexes take every version
// through `mcpsync get --for-index`, starts one outbox consumer per index (LISTEN/NOTIFY
// wake-ups, 1 s fallback poll, as `mcpsync outbox tail --follow`), then revokes the principals
// one at a time and reports p50/p99. The baseline is the same consumers' latency from a
// committed outbox insert to delivery, without a revocation.
package revoke

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/ledger"
	"github.com/mcpsync/mcpsync/internal/mcphost"
)

type options struct {
	dbURL         string
	subscriptions int
	principals    int
	indexes       int
	probes        int
	parallel      int
	jsonOut       bool
	seedTimeout   time.Duration
	backstop      time.Duration
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench revoke` (bench/main.go) calls it.
func Main() {
	var o options
	flag.StringVar(&o.dbURL, "database-url", os.Getenv("MCPSYNC_BENCH_DATABASE_URL"),
		"admin URL of a PostgreSQL server to create the bench database on (default: start a private cluster)")
	flag.IntVar(&o.subscriptions, "subscriptions", 1000, "subscriptions in all")
	flag.IntVar(&o.principals, "principals", 100, "principals; each holds subscriptions/principals subscriptions and is revoked once")
	flag.IntVar(&o.indexes, "indexes", 10, "derived indexes; each takes every version")
	flag.IntVar(&o.probes, "probes", 100, "baseline samples: outbox insert to delivery")
	flag.IntVar(&o.parallel, "parallel", 16, "concurrent CLI calls while seeding")
	flag.BoolVar(&o.jsonOut, "json", false, "print the results as JSON")
	flag.DurationVar(&o.seedTimeout, "seed-timeout", 20*time.Minute, "how long seeding may take")
	flag.DurationVar(&o.backstop, "backstop", 30*time.Second, "the source's backstop re-read period (the product default is 30s: "+
		"1,000 subscriptions then re-read about 33 times a second in the background)")
	flag.Parse()
	if o.principals <= 0 || o.subscriptions < o.principals || o.subscriptions%o.principals != 0 || o.indexes <= 0 {
		fmt.Fprintln(os.Stderr, "revokebench: need subscriptions a positive multiple of principals, and indexes > 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "revokebench:", err)
		os.Exit(1)
	}
}

// bench is the running stack.
type bench struct {
	o      options
	st     *ledger.Store
	stack  *localstack.Stack
	source string

	mu        sync.Mutex
	delivered map[string]map[int]time.Time // outbox key of interest -> consumer -> delivery time
	notify    chan struct{}
}

func run(ctx context.Context, o options) (err error) {
	if o.dbURL == "" {
		fmt.Fprintln(os.Stderr, "revokebench: private PostgreSQL (fsync off)")
	}
	st, err := localstack.Start(ctx, localstack.Options{AdminURL: o.dbURL,
		// Generous liveness settings: a starved process must not lose its session while seeding.
		Host: mcphost.Options{ClaimInterval: 200 * time.Millisecond, Lease: 30 * time.Second,
			ReconnectMin: 50 * time.Millisecond, ReconnectMax: time.Second, KeepAlive: 10 * time.Second}})
	if err != nil {
		return err
	}
	defer st.Stop()

	srv := chaosmcp.New(chaosmcp.Options{Name: "bench", Version: "1.0.0"})
	defer srv.Close()
	for i := range o.subscriptions {
		srv.Set(uriOf(i), fmt.Sprintf("body of resource %d\n", i), "text/plain")
	}
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer h.Close()

	b := &bench{o: o, st: st.Store, stack: st, source: "bench",
		delivered: map[string]map[int]time.Time{}, notify: make(chan struct{}, 1)}
	if _, err := b.cli(ctx, "source", "add", b.source, "--url", h.URL, "--backstop", o.backstop.String()); err != nil {
		return err
	}
	// The baseline's probe rows wake consumers like revocation rows do.
	if err := b.st.SetOutboxNotify(ctx, probeKind, true); err != nil {
		return err
	}

	seedStart := time.Now()
	if err := b.seed(ctx); err != nil {
		return err
	}
	seed := time.Since(seedStart)
	fmt.Fprintf(os.Stderr, "revokebench: seeded %d subscriptions (%d principals), %d indexes x %d versions in %s\n",
		o.subscriptions, o.principals, o.indexes, o.subscriptions, seed.Round(time.Millisecond))

	cctx, stopConsumers := context.WithCancel(ctx)
	defer stopConsumers()
	var cwg sync.WaitGroup
	cerrs := make(chan error, o.indexes)
	for j := range o.indexes {
		cwg.Go(func() {
			_, err := consumers.Run(cctx, b.st, consumers.Options{Consumer: indexOf(j), Follow: true, Batch: 200,
				PollInterval: time.Second}, func(_ context.Context, rows []ledger.OutboxEvent) error {
				b.record(j, rows)
				return nil
			})
			if err != nil && cctx.Err() == nil {
				cerrs <- fmt.Errorf("consumer %s: %w", indexOf(j), err)
			}
		})
	}
	defer func() {
		stopConsumers()
		cwg.Wait()
		close(cerrs)
		for e := range cerrs {
			err = errors.Join(err, e)
		}
	}()

	baseline, err := b.probe(ctx)
	if err != nil {
		return err
	}
	res, err := b.revokeAll(ctx)
	if err != nil {
		return err
	}
	res.Seed = seed
	res.Baseline = baseline
	b.report(res)
	return nil
}

// probeKind is the outbox kind of the baseline's probe rows.
const probeKind = "bench_probe"

func uriOf(i int) string   { return fmt.Sprintf("demo://bench/%04d", i) }
func indexOf(j int) string { return fmt.Sprintf("index-%02d", j) }
func principalOf(k int) string {
	return fmt.Sprintf("p%03d", k)
}

// cli runs an mcpsync command in this process against the stack.
func (b *bench) cli(ctx context.Context, args ...string) (string, error) {
	return b.stack.MustCLI(ctx, args...)
}

// parallel runs f(0..n-1) on b.o.parallel goroutines and returns the first error.
func (b *bench) parallel(n int, f func(i int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range b.o.parallel {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// seed grants the principals, subscribes them, waits for every first version, and lets
// every index take every version.
func (b *bench) seed(ctx context.Context) error {
	per := b.o.subscriptions / b.o.principals
	for k := range b.o.principals {
		if _, err := b.cli(ctx, "grant", principalOf(k), b.source); err != nil {
			return err
		}
	}
	err := b.parallel(b.o.subscriptions, func(i int) error {
		_, err := b.cli(ctx, "subscribe", b.source, uriOf(i), "--principal", principalOf(i/per), "--wait", "0")
		return err
	})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(b.o.seedTimeout)
	lastReport := time.Now()
	for {
		var n int
		if err := b.st.Pool().QueryRow(ctx, `SELECT count(*) FROM subscriptions
			WHERE state = 'ACTIVE' AND last_accepted_digest IS NOT NULL`).Scan(&n); err != nil {
			return err
		}
		if n == b.o.subscriptions {
			break
		}
		if time.Since(lastReport) > 5*time.Second {
			var states string
			var gen int64
			if err := b.st.Pool().QueryRow(ctx, `SELECT coalesce(string_agg(state || '=' || n, ' '), ''),
					(SELECT max(current_generation) FROM sources)
				FROM (SELECT state, count(*) AS n FROM subscriptions GROUP BY state ORDER BY state) x`).Scan(&states, &gen); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "revokebench: %d of %d subscriptions ACTIVE with a version (%s; session generation %d)\n",
				n, b.o.subscriptions, states, gen)
			lastReport = time.Now()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d subscriptions ACTIVE with a version after %s", n, b.o.subscriptions, b.o.seedTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return b.parallel(b.o.subscriptions*b.o.indexes, func(n int) error {
		i, j := n/b.o.indexes, n%b.o.indexes
		_, err := b.cli(ctx, "get", b.source, uriOf(i), "--principal", principalOf(i/per), "--for-index", indexOf(j))
		return err
	})
}

// record notes the delivery time of every row of interest to consumer j.
func (b *bench) record(j int, rows []ledger.OutboxEvent) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range rows {
		key := r.IdempotencyKey
		switch r.Kind {
		case ledger.OutboxIndexInvalidation:
			// Every consumer sees every row; an index's consumer acts on its own rows.
			if !strings.HasSuffix(key, "/index/"+indexOf(j)) {
				continue
			}
			key = strings.TrimSuffix(key, "/index/"+indexOf(j))
		case probeKind:
		default:
			continue
		}
		if b.delivered[key] == nil {
			b.delivered[key] = map[int]time.Time{}
		}
		b.delivered[key][j] = now
	}
	select {
	case b.notify <- struct{}{}:
	default:
	}
}

// waitDelivered waits until every consumer recorded key and returns the latest delivery.
func (b *bench) waitDelivered(ctx context.Context, key string, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	for {
		b.mu.Lock()
		got := b.delivered[key]
		if len(got) == b.o.indexes {
			var last time.Time
			for _, t := range got {
				if t.After(last) {
					last = t
				}
			}
			b.mu.Unlock()
			return last, nil
		}
		n := len(got)
		b.mu.Unlock()
		select {
		case <-b.notify:
		case <-deadline:
			return time.Time{}, fmt.Errorf("%s delivered to %d of %d consumers after %s", key, n, b.o.indexes, timeout)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}

// probe measures the baseline: a committed outbox insert until every consumer delivered it.
func (b *bench) probe(ctx context.Context) ([]time.Duration, error) {
	var out []time.Duration
	for i := range b.o.probes {
		key := fmt.Sprintf("probe/%d", i)
		start := time.Now()
		if _, err := b.st.Pool().Exec(ctx, `INSERT INTO invalidation_outbox (kind, idempotency_key) VALUES ($1, $2)`, probeKind, key); err != nil {
			return nil, err
		}
		last, err := b.waitDelivered(ctx, key, 30*time.Second)
		if err != nil {
			return nil, err
		}
		out = append(out, last.Sub(start))
	}
	return out, nil
}

type results struct {
	Seed          time.Duration
	Baseline      []time.Duration
	Delivered     []time.Duration // revoke started -> every index's invalidation delivered
	Fenced        []time.Duration // revoke started -> every subscription of the principal past the close fence
	Closed        []time.Duration // revoke started -> every subscription of the principal CLOSED
	Command       []time.Duration // the revoke command itself (ledger transaction + signals)
	Entries       int             // lineage entries invalidated per revocation and index
	Subscriptions int             // subscriptions closed per revocation
}

// revokeAll revokes each principal in turn and times delivery and closing.
func (b *bench) revokeAll(ctx context.Context) (results, error) {
	var res results
	for k := range b.o.principals {
		start := time.Now()
		out, err := b.cli(ctx, "revoke", principalOf(k), b.source, "--wait", "0", "--json")
		if err != nil {
			return res, err
		}
		res.Command = append(res.Command, time.Since(start))
		var rv struct {
			Revocation    int64             `json:"revocation"`
			Subscriptions []json.RawMessage `json:"subscriptions"`
			Indexes       []struct {
				Entries int `json:"entries"`
			} `json:"indexes"`
		}
		if err := json.Unmarshal([]byte(out), &rv); err != nil {
			return res, fmt.Errorf("revoke output %q: %w", out, err)
		}
		if len(rv.Indexes) != b.o.indexes {
			return res, fmt.Errorf("revocation %d invalidated %d indexes, want %d", rv.Revocation, len(rv.Indexes), b.o.indexes)
		}
		res.Entries, res.Subscriptions = rv.Indexes[0].Entries, len(rv.Subscriptions)
		last, err := b.waitDelivered(ctx, fmt.Sprintf("revocation/%d", rv.Revocation), 60*time.Second)
		if err != nil {
			return res, err
		}
		res.Delivered = append(res.Delivered, last.Sub(start))
		fenced, closed, err := b.waitClosed(ctx, principalOf(k), 60*time.Second)
		if err != nil {
			return res, err
		}
		res.Fenced = append(res.Fenced, fenced.Sub(start))
		res.Closed = append(res.Closed, closed.Sub(start))
		if closed.Sub(start) > 5*time.Second {
			b.explainSlowClose(ctx, principalOf(k), start)
		}
	}
	return res, nil
}

// waitClosed polls the ledger until every subscription of principal is CLOSED; it returns
// when they had all passed the close fence (UNSUBSCRIBING or later, R18) and when all were
// CLOSED.
func (b *bench) waitClosed(ctx context.Context, principal string, timeout time.Duration) (fenced, closed time.Time, err error) {
	deadline := time.Now().Add(timeout)
	for {
		var open, unfenced int
		if err := b.st.Pool().QueryRow(ctx, `SELECT count(*) FILTER (WHERE state <> 'CLOSED'),
				count(*) FILTER (WHERE state NOT IN ('UNSUBSCRIBING', 'UNSUBSCRIBE_UNKNOWN', 'CLOSED'))
			FROM subscriptions WHERE principal = $1`, principal).Scan(&open, &unfenced); err != nil {
			return fenced, closed, err
		}
		now := time.Now()
		if unfenced == 0 && fenced.IsZero() {
			fenced = now
		}
		if open == 0 {
			return fenced, now, nil
		}
		if now.After(deadline) {
			return fenced, closed, fmt.Errorf("%d subscriptions of %s not CLOSED after %s", open, principal, timeout)
		}
		select {
		case <-ctx.Done():
			return fenced, closed, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// explainSlowClose prints, for a revocation whose subscriptions took long to close, the
// receipts its subscriptions wrote since the revoke started, with their offsets.
func (b *bench) explainSlowClose(ctx context.Context, principal string, start time.Time) {
	rows, err := b.st.Pool().Query(ctx, `SELECT s.uri, r.kind, coalesce(r.detail->>'phase', ''), r.created_at
		FROM receipts r JOIN subscriptions s ON s.id = r.subscription_id
		WHERE s.principal = $1 AND r.created_at >= $2 ORDER BY r.created_at`, principal, start)
	if err != nil {
		return
	}
	defer rows.Close()
	fmt.Fprintf(os.Stderr, "revokebench: slow close of %s; receipts since the revoke:\n", principal)
	for rows.Next() {
		var uri, kind, phase string
		var at time.Time
		if rows.Scan(&uri, &kind, &phase, &at) == nil {
			fmt.Fprintf(os.Stderr, "  +%-10s %s %s %s\n", at.Sub(start).Round(time.Millisecond), uri, kind, phase)
		}
	}
}

// quantile returns the q-quantile (nearest rank) of ds.
