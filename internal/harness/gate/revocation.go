package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	sections = append(sections, section{"revocation", revocation})
}

// revokeIndexes is the number of derived indexes every principal's content is taken into.
const revokeIndexes = 2

// revokeParallel is how many revocations (and setup commands) run at once.
const revokeParallel = 16

// revocation measures R29 (revocation p99 < 30 s) and R24 (a revocation traced to every
// derived index) over Options.Revocations principals, each with one subscription whose
// content is taken into revokeIndexes derived indexes through `get --for-index`. One outbox
// consumer per index follows; the principals are revoked revokeParallel at a time, each right
// after its resource changed so a read of it is in flight. The latency runs from the revoke
// command to every affected index's invalidation delivered to its consumer.
func revocation(ctx context.Context, g *run) ([]Row, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := g.opts.Revocations
	// The source starts empty: each principal subscribes to a resource of its own.
	srv, uriOf, err := g.chaosSource(ctx, "rev", 0)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		srv.Set(uriOf(i), "content of "+uriOf(i), "text/plain")
	}
	principal := func(k int) string { return fmt.Sprintf("principal-%04d", k) }
	index := func(j int) string { return fmt.Sprintf("index-%d", j) }
	if err := parallel(ctx, n, func(k int) error {
		if _, err := g.stack.MustCLI(ctx, "grant", principal(k), "rev"); err != nil {
			return err
		}
		_, err := g.stack.MustCLI(ctx, "subscribe", "rev", uriOf(k), "--principal", principal(k), "--wait", "0")
		return err
	}); err != nil {
		return nil, err
	}
	g.progress("revocation: %d principals granted and subscribed", n)
	if err := g.waitActive(ctx, "rev", n); err != nil {
		return nil, err
	}
	if err := parallel(ctx, n, func(k int) error {
		for j := 0; j < revokeIndexes; j++ {
			if _, err := g.stack.MustCLI(ctx, "get", "rev", uriOf(k), "--principal", principal(k), "--for-index", index(j)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	g.progress("revocation: %d subscriptions taken into %d indexes each", n, revokeIndexes)
	// One follower per index, acting on its own invalidations. changed is closed (and
	// replaced) after every delivered batch, waking every waiting revocation.
	var mu sync.Mutex
	delivered := map[string]time.Time{} // idempotency key → delivery time
	changed := make(chan struct{})
	var wg sync.WaitGroup
	ready := make(chan struct{}, revokeIndexes)
	for j := 0; j < revokeIndexes; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			_, _ = consumers.Run(ctx, g.stack.Store, consumers.Options{Consumer: "gate-" + index(j), Follow: true, StartAtHead: true,
				PollInterval: time.Second, Idle: func() { once.Do(func() { ready <- struct{}{} }) }},
				func(_ context.Context, batch []ledger.OutboxEvent) error {
					now := time.Now()
					mu.Lock()
					for _, e := range batch {
						if e.Kind == ledger.OutboxIndexInvalidation && strings.HasSuffix(e.IdempotencyKey, "/index/"+index(j)) {
							delivered[e.IdempotencyKey] = now
						}
					}
					close(changed)
					changed = make(chan struct{})
					mu.Unlock()
					return nil
				})
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	// Every follower has registered its offset and caught up before the first revocation.
	for j := 0; j < revokeIndexes; j++ {
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	lat := make([]time.Duration, n)
	snapshots := make([]string, n) // taken just after each revocation committed
	var done atomic.Int64
	err = parallel(ctx, n, func(k int) error {
		// The principal's resource changes just before the revocation, so a read of it is in
		// flight while the revocation commits.
		srv.Set(uriOf(k), fmt.Sprintf("content of %s, changed before its revocation", uriOf(k)), "text/plain")
		start := time.Now()
		out, err := g.stack.MustCLI(ctx, "revoke", principal(k), "rev", "--json", "--wait", "0")
		if err != nil {
			return err
		}
		if err := g.stack.Store.Pool().QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snapshots[k]); err != nil {
			return err
		}
		var rv struct {
			Revocation int64 `json:"revocation"`
		}
		if err := json.Unmarshal([]byte(out), &rv); err != nil {
			return fmt.Errorf("revoke --json: %w: %s", err, out)
		}
		deadline := time.After(2 * time.Minute)
		for {
			mu.Lock()
			var last time.Time
			got := 0
			for j := 0; j < revokeIndexes; j++ {
				if t, ok := delivered[fmt.Sprintf("revocation/%d/index/%s", rv.Revocation, index(j))]; ok {
					got++
					if t.After(last) {
						last = t
					}
				}
			}
			wake := changed
			mu.Unlock()
			if got == revokeIndexes {
				lat[k] = last.Sub(start)
				if d := done.Add(1); d%100 == 0 || int(d) == n {
					g.progress("revocation: %d/%d revocations delivered", d, n)
				}
				return nil
			}
			select {
			case <-wake:
			case <-deadline:
				return fmt.Errorf("revocation %d reached %d of %d indexes in 2 minutes", rv.Revocation, got, revokeIndexes)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(lat)
	p50, p99, worst := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	untraced, err := g.stack.Store.UntracedLineage(ctx)
	if err != nil {
		return nil, err
	}
	after, refused, err := g.acceptedAfterRevocation(ctx, "rev", principal, snapshots)
	if err != nil {
		return nil, err
	}
	return []Row{
		{Requirement: "R29", Metric: "permission revocation p99 (revoke → every derived index invalidated)", Threshold: "< 30 s",
			Measured: p99.Round(time.Millisecond).String(), Value: p99.Seconds(), Pass: p99 < 30*time.Second,
			Detail: fmt.Sprintf("%d revocations (%d at a time) × %d indexes, each with a read in flight; p50 %s, p99 %s, max %s", len(lat), revokeParallel, revokeIndexes,
				p50.Round(time.Millisecond), p99.Round(time.Millisecond), worst.Round(time.Millisecond))},
		zero("R24", "derived-index entries a revocation did not reach", untraced, ""),
		zero("R23/R24", "versions accepted after revocation committed", after,
			fmt.Sprintf("%d revocations, each right after its principal's resource changed: %d reads refused REVOKED", len(snapshots), refused)),
	}, nil
}

// parallel runs fn(0) … fn(n-1), revokeParallel at a time, and returns the first error (the
// rest of the calls are then skipped).
func parallel(ctx context.Context, n int, fn func(int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < revokeParallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range next {
				if err := fn(k); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for k := 0; k < n; k++ {
		select {
		case next <- k:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// acceptedAfterRevocation counts, over the revocations of principal(k) on source (snapshots[k]
// taken right after each committed), the versions accepted after the revocation committed
// (versionsAfterRevocation), and how many reads the fences refused as REVOKED, to show the
// revocations raced reads.
func (g *run) acceptedAfterRevocation(ctx context.Context, source string, principal func(int) string, snapshots []string) (after, refused int, err error) {
	pool := g.stack.Store.Pool()
	var sourceID int64
	if err := pool.QueryRow(ctx, `SELECT id FROM sources WHERE name = $1`, source).Scan(&sourceID); err != nil {
		return 0, 0, fmt.Errorf("source %s: %w", source, err)
	}
	for k, snap := range snapshots {
		n, err := versionsAfterRevocation(ctx, pool, sourceID, principal(k), snap)
		if err != nil {
			return 0, 0, err
		}
		after += n
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM receipts WHERE source_id = $1 AND kind = 'REVOKED'`, sourceID).Scan(&refused); err != nil {
		return 0, 0, fmt.Errorf("refused reads: %w", err)
	}
	return after, refused, nil
}

// versionsAfterRevocation counts the content versions of principal on a source whose
// acceptance committed after a revocation of that grant did (R23, R24: the standing grant is
// part of the accept fence, so there must be none). snapshot is a pg_snapshot taken right
// after the revocation committed: a transaction not visible in it committed later. Every
// accepted content version writes its invalidation in the same statement, so the outbox row's
// txid is the accepting transaction's.
func versionsAfterRevocation(ctx context.Context, pool *pgxpool.Pool, sourceID int64, principal, snapshot string) (int, error) {
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM invalidation_outbox o
		JOIN resource_versions v ON v.subscription_id = o.subscription_id AND v.read_ordinal = o.read_ordinal AND v.kind = 'content'
		WHERE o.kind = 'version' AND o.source_id = $1 AND o.principal = $2
		  AND NOT pg_visible_in_snapshot(o.txid, $3::pg_snapshot)`, sourceID, principal, snapshot).Scan(&n); err != nil {
		return 0, fmt.Errorf("versions after revocation: %w", err)
	}
	return n, nil
}
