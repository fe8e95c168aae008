// Command throughput measures mcpsync end to end on one machine: N subscriptions on a
// fault-injecting MCP server over streamable HTTP, resources mutated at a fixed rate, and for
// every mutation the time until the ledger accepted a version with exactly that content
// (notification → signal → workflow → read ordinal → resources/read → acceptResourceVersion).
// In the same run, against the same server and transport, a raw go-sdk read loop gives the
// baseline of what one client can read. Everything runs in-process (localstack).
//
//	go run ./bench/throughput [-subscriptions 1000] [-rate 200] [-duration 30s]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func main() {
	subs := flag.Int("subscriptions", 1000, "number of subscriptions (one resource each)")
	rate := flag.Float64("rate", 200, "mutations per second during the measurement")
	duration := flag.Duration("duration", 30*time.Second, "length of the measurement")
	baseline := flag.Duration("baseline", 5*time.Second, "length of the raw go-sdk read loop")
	admin := flag.String("database", os.Getenv("MCPSYNC_BENCH_DATABASE_URL"), "admin URL of a Postgres server (empty: start a private one)")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the measurement phase to this file")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *subs, *rate, *duration, *baseline, *admin); err != nil {
		fmt.Fprintln(os.Stderr, "throughput:", err)
		os.Exit(1)
	}
}

var cpuProfile string

func uriOf(i int) string { return fmt.Sprintf("demo://items/%04d", i) }

func run(ctx context.Context, n int, rate float64, duration, baselineDur time.Duration, admin string) error {
	start := time.Now()
	st, err := localstack.Start(ctx, localstack.Options{AdminURL: admin})
	if err != nil {
		return err
	}
	defer st.Stop()
	srv := chaosmcp.New(chaosmcp.Options{Name: "bench", Version: "1"})
	defer srv.Close()
	for i := 0; i < n; i++ {
		srv.Set(uriOf(i), "r0", "text/plain")
	}
	h, err := srv.StartHTTP("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer h.Close()
	if _, err := st.MustCLI(ctx, "source", "add", "bench", "--url", h.URL, "--backstop", "10m"); err != nil {
		return err
	}
	fmt.Printf("stack up in %s; subscribing %d resources\n", time.Since(start).Round(time.Millisecond), n)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if _, err := st.MustCLI(ctx, "subscribe", "bench", uriOf(i), "--wait", "0"); err != nil {
			return err
		}
	}
	if err := waitActive(ctx, st.Store, n); err != nil {
		return err
	}
	fmt.Printf("%d subscriptions ACTIVE with their first version in %s\n", n, time.Since(t0).Round(time.Millisecond))

	rawRate, rawP50, rawP99, err := rawReadLoop(ctx, h.URL, n, baselineDur)
	if err != nil {
		return err
	}

	// Measurement: mutate at a fixed rate; a tail of the outbox records when each digest was
	// accepted (the outbox row's commit-side timestamp).
	head, err := st.Store.OutboxHead(ctx)
	if err != nil {
		return err
	}
	type key struct{ uri, digest string }
	var mu sync.Mutex
	mutated := map[key]time.Time{}
	latest := map[string]key{}
	accepted := map[key]time.Time{}
	tailCtx, stopTail := context.WithCancel(ctx)
	defer stopTail()
	tailDone := make(chan error, 1)
	go func() {
		cur := head
		for {
			rows, _, err := st.Store.OutboxBatch(tailCtx, cur, 1000)
			if err != nil {
				tailDone <- nil
				return
			}
			mu.Lock()
			for _, r := range rows {
				cur = r.Cursor
				if r.Kind == "version" {
					accepted[key{r.URI, r.Digest}] = r.CreatedAt
				}
			}
			mu.Unlock()
			if len(rows) == 0 {
				select {
				case <-tailCtx.Done():
					tailDone <- nil
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
	}()
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	rng := rand.New(rand.NewPCG(1, 2))
	interval := time.Duration(float64(time.Second) / rate)
	mStart := time.Now()
	next := mStart
	count := 0
	for time.Since(mStart) < duration {
		i := rng.IntN(n)
		body := fmt.Sprintf("update %d of %s", count, uriOf(i))
		k := key{uriOf(i), ledger.Digest([]byte(body))}
		mu.Lock()
		mutated[k] = time.Now()
		latest[k.uri] = k
		mu.Unlock()
		srv.Set(k.uri, body, "text/plain")
		count++
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
	}
	mDur := time.Since(mStart)
	// Wait until every resource's last content is accepted (convergence), at most a minute.
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		mu.Lock()
		done := true
		for _, k := range latest {
			if _, ok := accepted[k]; !ok {
				done = false
				break
			}
		}
		mu.Unlock()
		if done {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopTail()
	<-tailDone

	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	var lastAccept time.Time
	superseded, missing := 0, 0
	for k, at := range mutated {
		acc, ok := accepted[k]
		switch {
		case ok:
			lat = append(lat, acc.Sub(at))
			if acc.After(lastAccept) {
				lastAccept = acc
			}
		case latest[k.uri] != k:
			superseded++ // a later mutation of the same resource was accepted instead (coalesced)
		default:
			missing++
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	var reads int64
	if err := st.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM read_dispatches WHERE reason = 'notification'`).Scan(&reads); err != nil {
		return err
	}
	notes := int64(srv.Stats().UpdatesSent)
	span := lastAccept.Sub(mStart)
	if span < mDur {
		span = mDur
	}
	fmt.Println()
	fmt.Printf("%-52s %14s\n", "measure", "value")
	fmt.Printf("%-52s %14.0f\n", "baseline: raw go-sdk reads/s (1 client, same server)", rawRate)
	fmt.Printf("%-52s %14s\n", "baseline: raw read latency p50 / p99", fmt.Sprintf("%s / %s", rawP50.Round(10*time.Microsecond), rawP99.Round(10*time.Microsecond)))
	fmt.Printf("%-52s %14d\n", "subscriptions", n)
	fmt.Printf("%-52s %14d\n", "mutations sent", count)
	fmt.Printf("%-52s %14.1f\n", "mutation rate offered (/s)", float64(count)/mDur.Seconds())
	fmt.Printf("%-52s %14d\n", "accepted with exact content", len(lat))
	fmt.Printf("%-52s %14d\n", "superseded by a later mutation (coalesced)", superseded)
	fmt.Printf("%-52s %14d\n", "never accepted", missing)
	fmt.Printf("%-52s %14.1f\n", "end-to-end accepted updates/s", float64(len(lat))/span.Seconds())
	fmt.Printf("%-52s %14s\n", "mutation → accepted version p50", pct(0.50).Round(time.Millisecond))
	fmt.Printf("%-52s %14s\n", "mutation → accepted version p99", pct(0.99).Round(time.Millisecond))
	fmt.Printf("%-52s %14s\n", "mutation → accepted version max", pct(1).Round(time.Millisecond))
	fmt.Printf("%-52s %14.3f\n", "reads per notification (whole run)", float64(reads)/float64(max(notes, 1)))
	fmt.Printf("%-52s %14s\n", "goal", ">= 150 updates/s, p99 <= 250 ms")
	return nil
}

func waitActive(ctx context.Context, st *ledger.Store, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		var active int
		if err := st.Pool().QueryRow(ctx, `SELECT count(*) FROM subscriptions WHERE state = 'ACTIVE' AND last_accepted_ordinal > 0`).Scan(&active); err != nil {
			return err
		}
		if active == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("subscriptions not all ACTIVE within 5 minutes")
}

// rawReadLoop reads resources sequentially with one go-sdk client session for d.
func rawReadLoop(ctx context.Context, endpoint string, n int, d time.Duration) (perSec float64, p50, p99 time.Duration, err error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "raw", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint}, &mcp.ClientSessionOptions{ProtocolVersion: mcpsync.ProtocolVersion20251125})
	if err != nil {
		return 0, 0, 0, err
	}
	defer cs.Close()
	var lat []time.Duration
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		t := time.Now()
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uriOf(i % n)}); err != nil {
			return 0, 0, 0, err
		}
		lat = append(lat, time.Since(t))
	}
	slices.Sort(lat)
	return float64(len(lat)) / time.Since(start).Seconds(), lat[len(lat)/2], lat[len(lat)*99/100], nil
}
