package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync/internal/consumers"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	sections = append(sections, section{"revocation", revocation})
}

const (
	revokePrincipals = 20
	revokePerPrinc   = 5
	revokeIndexes    = 5
)

// revocation measures R29 (revocation p99 < 30 s) and R24 (a revocation traced to every
// derived index): principals' content is taken into derived indexes through `get
// --for-index`, one outbox consumer per index follows, and each principal is revoked in turn;
// the latency runs from the revoke command to every affected index's invalidation delivered
// to its consumer.
func revocation(ctx context.Context, g *run) ([]Row, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := revokePrincipals * revokePerPrinc
	// The source starts empty: each principal subscribes to resources of its own.
	srv, uriOf, err := g.chaosSource(ctx, "rev", 0)
	if err != nil {
		return nil, err
	}
	for i := 0; i < n; i++ {
		srv.Set(uriOf(i), "content of "+uriOf(i), "text/plain")
	}
	principal := func(k int) string { return fmt.Sprintf("principal-%02d", k) }
	index := func(j int) string { return fmt.Sprintf("index-%d", j) }
	for k := 0; k < revokePrincipals; k++ {
		if _, err := g.stack.MustCLI(ctx, "grant", principal(k), "rev"); err != nil {
			return nil, err
		}
		for i := k * revokePerPrinc; i < (k+1)*revokePerPrinc; i++ {
			if _, err := g.stack.MustCLI(ctx, "subscribe", "rev", uriOf(i), "--principal", principal(k), "--wait", "0"); err != nil {
				return nil, err
			}
		}
	}
	if err := g.waitActive(ctx, "rev", n); err != nil {
		return nil, err
	}
	for k := 0; k < revokePrincipals; k++ {
		for i := k * revokePerPrinc; i < (k+1)*revokePerPrinc; i++ {
			for j := 0; j < revokeIndexes; j++ {
				if _, err := g.stack.MustCLI(ctx, "get", "rev", uriOf(i), "--principal", principal(k), "--for-index", index(j)); err != nil {
					return nil, err
				}
			}
		}
	}
	// One follower per index, acting on its own invalidations.
	var mu sync.Mutex
	delivered := map[string]time.Time{} // idempotency key → delivery time
	wake := make(chan struct{}, 1)
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
					mu.Unlock()
					select {
					case wake <- struct{}{}:
					default:
					}
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
	var lat []time.Duration
	snapshots := make([]string, revokePrincipals) // taken just after each revocation committed
	for k := 0; k < revokePrincipals; k++ {
		// Every resource of the principal changes just before the revocation, so reads of it
		// are in flight while the revocation commits.
		for i := k * revokePerPrinc; i < (k+1)*revokePerPrinc; i++ {
			srv.Set(uriOf(i), fmt.Sprintf("content of %s, changed before revocation %d", uriOf(i), k), "text/plain")
		}
		start := time.Now()
		out, err := g.stack.MustCLI(ctx, "revoke", principal(k), "rev", "--json", "--wait", "0")
		if err != nil {
			return nil, err
		}
		if err := g.stack.Store.Pool().QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&snapshots[k]); err != nil {
			return nil, err
		}
		var rv struct {
			Revocation int64 `json:"revocation"`
		}
		if err := json.Unmarshal([]byte(out), &rv); err != nil {
			return nil, fmt.Errorf("revoke --json: %w: %s", err, out)
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
			mu.Unlock()
			if got == revokeIndexes {
				lat = append(lat, last.Sub(start))
				break
			}
			select {
			case <-wake:
			case <-deadline:
				return nil, fmt.Errorf("revocation %d reached %d of %d indexes in 2 minutes", rv.Revocation, got, revokeIndexes)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	slices.Sort(lat)
	p99 := lat[min(len(lat)-1, len(lat)*99/100)]
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
			Detail: fmt.Sprintf("%d revocations × %d indexes, %d subscriptions; p50 %s, max %s", len(lat), revokeIndexes, n,
				lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))},
		zero("R24", "derived-index entries a revocation did not reach", untraced, ""),
		zero("R23/R24", "versions accepted after revocation committed", after,
			fmt.Sprintf("%d revocations, each right after its principal's %d resources changed: %d reads refused REVOKED", len(snapshots), revokePerPrinc, refused)),
	}, nil
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
