// Package scan measures what a discovery scan costs: an A/B double scan of a fault-injecting
// MCP server with 100,000 resources, run end to end by mcpsync (SourceWorkflow →
// DiscoveryScanWorkflow → two session-bound rounds paging in memory, digesting, storing their
// entries in the ledger → the ledger's proof check and catalog), against one raw go-sdk
// listing of the same server over the same transport (streamable HTTP) in the same run. It
// prints both times and their ratio (goal ≤ 2.2×: the double scan may cost little more than
// two raw listings), for a changed set (the scan stores the new entries once) and for an
// unchanged one (a re-check stores no entries). For the changed set it also prints how many
// entries the scan stored in the ledger beside how many it listed: a catalog's entries are
// stored by content, so a set that changed in one entry stores one chunk of entries, not the
// whole set. Everything runs in-process (localstack).
//
// With -era 2026-07-28 the server speaks both eras and every listing (raw, one round, the A/B
// scan) runs on a 2026-07-28 session.
//
// The two sets are measured alternately, -runs times each: a changed-set scan, then an
// unchanged re-check of the set it found, each after a raw listing of its own, so that both
// medians come from the same stretch of the machine's time. With -budget the pairs stop early
// (the medians are of those measured, and it says so) when the next would not fit.
//
//	go run ./bench scan [-resources 100000] [-page 100] [-runs 5] [-budget 50s] [-era 2025-11-25|2026-07-28]
package scan

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/discovery"
	"github.com/mcpsync/mcpsync/internal/harness/benchline"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/localstack"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench scan` (bench/main.go) calls it.
func Main() {
	n := flag.Int("resources", 100000, "resources on the server")
	page := flag.Int("page", 100, "the server's page size")
	runs := flag.Int("runs", 5, "measurements of each kind, alternating (the median is reported)")
	admin := flag.String("database", os.Getenv("MCPSYNC_BENCH_DATABASE_URL"), "admin URL of a Postgres server (empty: start a private one)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the measurements to this file")
	budget := flag.Duration("budget", 0, "the run's time budget: the runs stop when the next pair (changed set, unchanged set) would not fit (0: no limit)")
	era := flag.String("era", chaosmcp.ProtocolVersion, "protocol era of every session: "+chaosmcp.ProtocolVersion+" or "+chaosmcp.ProtocolModern)
	flag.Parse()
	if *runs < 1 || *budget < 0 {
		fmt.Fprintln(os.Stderr, "scan bench: -runs must be at least 1 and -budget not negative")
		os.Exit(2)
	}
	if *era != chaosmcp.ProtocolVersion && *era != chaosmcp.ProtocolModern {
		fmt.Fprintf(os.Stderr, "scan bench: -era %q: want %s or %s\n", *era, chaosmcp.ProtocolVersion, chaosmcp.ProtocolModern)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "scan bench:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *n, *page, *runs, *budget, *admin, *era); err != nil {
		fmt.Fprintln(os.Stderr, "scan bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func run(ctx context.Context, n, page, runs int, budget time.Duration, admin, era string) error {
	opts := chaosmcp.Options{Name: "bench", Version: "1", PageSize: page}
	if era == chaosmcp.ProtocolModern {
		opts.ProtocolVersions = chaosmcp.AllProtocolVersions
	}
	srv := chaosmcp.New(opts)
	defer srv.Close()
	rs := make([]chaosmcp.Resource, n)
	for i := range rs {
		rs[i] = chaosmcp.Resource{URI: fmt.Sprintf("demo://items/%06d", i), Text: "x", MIMEType: "text/plain"}
	}
	srv.PutMany(rs...)
	listen := srv.StartHTTP
	if era == chaosmcp.ProtocolModern {
		listen = srv.StartHTTPBothEras
	}
	h, err := listen("127.0.0.1:0")
	if err != nil {
		return err
	}
	defer h.Close()

	start := time.Now()
	st, err := localstack.Start(ctx, localstack.Options{AdminURL: admin})
	if err != nil {
		return err
	}
	defer st.Stop()
	if _, err := st.MustCLI(ctx, "source", "add", "bench", "--url", h.URL); err != nil {
		return err
	}
	src, err := st.Store.SourceByName(ctx, "bench")
	if err != nil {
		return err
	}
	// The session host's first session starts a scan on its own: wait for it (warm-up).
	if err := waitCatalog(ctx, st.Store, src.ID); err != nil {
		return err
	}
	fmt.Printf("stack up and first catalog of %d resources in %s (page size %d, streamable HTTP)\n", n, time.Since(start).Round(time.Millisecond), page)

	// list_changed would start scans of its own; the measured scans are the CLI's.
	srv.SuppressListChanged(true)
	var raw, direct, changed, unchanged []time.Duration
	var pairs []float64     // each changed-set scan against the raw listing just before it
	var unchPairs []float64 // each unchanged-set scan against the raw listing just before it
	var stored []float64    // entries a changed-set scan wrote to the ledger (chunks it added)
	listed := 0
	var longest time.Duration // the longest pair so far (changed set, then unchanged)
	for i := range runs {
		if budget > 0 && i > 0 && time.Since(start)+longest > budget {
			fmt.Printf("scan bench: %d of %d pairs of runs measured: one more would not fit within -budget %s\n", i, runs, budget)
			break
		}
		pairStart := time.Now()
		for _, cold := range []bool{true, false} {
			if cold {
				// A changed set: the scan stores its entries once (round B reuses round A's).
				srv.Set(fmt.Sprintf("demo://items/new-%03d", i), "x", "text/plain")
			}
			want := len(srv.URIs())
			d, items, err := rawListing(ctx, h.URL, era)
			if err != nil {
				return err
			}
			if items != want {
				return fmt.Errorf("raw listing saw %d resources, want %d", items, want)
			}
			raw = append(raw, d)
			if cold {
				dr, err := directRound(ctx, h.URL, want, era)
				if err != nil {
					return err
				}
				direct = append(direct, dr)
				fmt.Printf("raw go-sdk listing: %s; one round (discovery.Scan) on a fresh session: %s\n", d.Round(time.Millisecond), dr.Round(time.Millisecond))
			} else {
				fmt.Printf("raw go-sdk listing: %s\n", d.Round(time.Millisecond))
			}
			sr, err := abScan(ctx, st, want)
			if err != nil {
				return fmt.Errorf("scan %d: %w", len(raw), err)
			}
			kind := "changed set"
			if cold {
				changed = append(changed, sr.took)
				pairs = append(pairs, pairRatio(sr.took, d))
				// The chunks of entries stored since the request (migration 0018: only those
				// the last catalog's set did not hold).
				var n int64
				if err := st.Store.Pool().QueryRow(ctx, `SELECT coalesce(sum(cardinality(server_uris)), 0)
					FROM catalog_entry_chunks WHERE created_at >= $1`, sr.start).Scan(&n); err != nil {
					return fmt.Errorf("entries stored by scan %d: %w", len(raw), err)
				}
				stored, listed = append(stored, float64(n)), want
			} else {
				kind = "unchanged set"
				unchanged = append(unchanged, sr.took)
				unchPairs = append(unchPairs, pairRatio(sr.took, d))
			}
			fmt.Printf("A/B double scan, %s: %s\n", kind, sr)
		}
		longest = max(longest, time.Since(pairStart))
	}
	r := median(raw)
	fmt.Printf("\nresources: %d, page size: %d, transport: streamable HTTP, era %s, medians of %d changed-set and %d unchanged-set runs, alternating\n", n, page, era, len(changed), len(unchanged))
	fmt.Printf("raw go-sdk listing (one pass):                            %s\n", r.Round(time.Millisecond))
	fmt.Printf("one round's paging and digests alone (discovery.Scan):   %s  (2 rounds: %.2fx)\n",
		median(direct).Round(time.Millisecond), 2*float64(median(direct))/float64(r))
	fmt.Printf("mcpsync A/B double scan, changed set (request→catalog):   %s  ratio %.2fx (goal <= 2.20x)\n",
		median(changed).Round(time.Millisecond), float64(median(changed))/float64(r))
	fmt.Printf("mcpsync A/B double scan, unchanged set (request→catalog): %s  ratio %.2fx\n",
		median(unchanged).Round(time.Millisecond), float64(median(unchanged))/float64(r))
	fmt.Printf("entries a changed-set scan stored in the ledger:           %.0f of %d listed\n", median(stored), listed)
	lo, hi := slices.Min(pairs), slices.Max(pairs)
	fmt.Printf("each changed-set scan against the raw listing just before it: %s (%.2f-%.2fx)\n", ratios(pairs), lo, hi)
	fmt.Printf("each unchanged-set scan against the raw listing just before it: %s (%.2f-%.2fx)\n", ratios(unchPairs), slices.Min(unchPairs), slices.Max(unchPairs))
	secs := func(name string, d time.Duration) benchline.Figure {
		return benchline.Figure{Name: fmt.Sprintf("%s-%d", name, n), Value: d.Seconds(), Unit: "s"}
	}
	raw1 := secs("raw-list", r)
	benchline.Print(os.Stdout, raw1)
	benchline.PrintVs(os.Stdout, secs("scan-round", median(direct)), raw1)
	benchline.PrintVs(os.Stdout, secs("scan-ab", median(changed)), raw1)
	benchline.PrintVs(os.Stdout, secs("scan-ab-unchanged", median(unchanged)), raw1)
	// The spread of the pairs: a median ratio that moved less than it between two runs is
	// inside the bench's noise.
	benchline.Print(os.Stdout, benchline.Figure{Name: fmt.Sprintf("scan-ab-ratio-lowest-%d", n), Value: lo})
	benchline.Print(os.Stdout, benchline.Figure{Name: fmt.Sprintf("scan-ab-ratio-highest-%d", n), Value: hi})
	benchline.PrintVs(os.Stdout, benchline.Figure{Name: fmt.Sprintf("scan-ab-stored-entries-%d", n), Value: median(stored), Unit: "entries"},
		benchline.Figure{Name: fmt.Sprintf("scan-ab-listed-entries-%d", n), Value: float64(listed), Unit: "entries"})
	return nil
}

// abRun is one A/B double scan requested through the CLI.
type abRun struct {
	start     time.Time     // the request
	took      time.Duration // until the CLI exited
	a, b      abRound
	published time.Time // the catalog's publication
}

// abRound is one round of a scan as `mcpsync scan --json` prints it.
type abRound struct {
	StartedAt time.Time
	EndedAt   *time.Time
}

// abScan runs `mcpsync scan bench --wait --json` on st and checks that it proved want resources
// in two rounds (SNAPSHOT_UNPROVEN: the bench's server has no snapshot IDs).
func abScan(ctx context.Context, st *localstack.Stack, want int) (abRun, error) {
	t0 := time.Now()
	out, err := st.MustCLI(ctx, "scan", "bench", "--wait", "--json")
	if err != nil {
		return abRun{}, err
	}
	took := time.Since(t0)
	var res struct {
		Result contract.DiscoveryScanResult
		Rounds []abRound
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return abRun{}, fmt.Errorf("scan output: %w", err)
	}
	if res.Result.Level != contract.ProofSnapshotUnproven || res.Result.Resources != want || len(res.Rounds) != 2 ||
		res.Rounds[0].EndedAt == nil || res.Rounds[1].EndedAt == nil {
		return abRun{}, fmt.Errorf("%s with %d resources in %d rounds, want SNAPSHOT_UNPROVEN with %d in 2 ended rounds", res.Result.Level, res.Result.Resources, len(res.Rounds), want)
	}
	c, err := st.Store.CatalogByID(ctx, res.Result.CatalogID)
	if err != nil {
		return abRun{}, err
	}
	return abRun{start: t0, took: took, a: res.Rounds[0], b: res.Rounds[1], published: c.PublishedAt}, nil
}

// String splits the scan's time: to round A, each round, between them, to the catalog and to
// the CLI's exit.
func (r abRun) String() string {
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("%s = %s to round A, A %s, %s between, B %s, %s to catalog, %s to CLI exit",
		ms(r.took), ms(r.a.StartedAt.Sub(r.start)), ms(r.a.EndedAt.Sub(r.a.StartedAt)), ms(r.b.StartedAt.Sub(*r.a.EndedAt)),
		ms(r.b.EndedAt.Sub(r.b.StartedAt)), ms(r.published.Sub(*r.b.EndedAt)), ms(r.start.Add(r.took).Sub(r.published)))
}

// rawListing lists every resource and template of the server once with a fresh go-sdk client
// session and its page iterators, keeping what it lists, as a plain client would.
func rawListing(ctx context.Context, url, era string) (time.Duration, int, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "raw", Version: "0"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: 1}, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		return 0, 0, err
	}
	defer cs.Close()
	t0 := time.Now()
	var resources []*mcp.Resource
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			return 0, 0, err
		}
		resources = append(resources, r)
	}
	var templates []*mcp.ResourceTemplate
	for t, err := range cs.ResourceTemplates(ctx, nil) {
		if err != nil {
			return 0, 0, err
		}
		templates = append(templates, t)
	}
	return time.Since(t0), len(resources), nil
}

// directRound runs one round's paging and digesting (discovery.Scan) on a fresh session, as
// the round activity does, without the activity, the heartbeats and the ledger.
func directRound(ctx context.Context, url string, want int, era string) (time.Duration, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "round", Version: "0"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, MaxRetries: 1}, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		return 0, err
	}
	defer cs.Close()
	t0 := time.Now()
	res := discovery.Scan(ctx, cs, discovery.Options{CursorKey: []byte("bench")})
	d := time.Since(t0)
	if !res.Complete || res.Resources != want {
		return 0, fmt.Errorf("direct round: %s %v, %d resources", res.FailureKind, res.Err, res.Resources)
	}
	return d, nil
}

func waitCatalog(ctx context.Context, st *ledger.Store, sourceID int64) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		cats, err := st.Catalogs(ctx, sourceID)
		if err != nil {
			return err
		}
		if len(cats) > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("no catalog of source %d within 5 minutes", sourceID)
}

// pairRatio is a scan's time over the raw listing's measured just before it: one run's ratio,
// whose spread over the runs shows the bench's noise (printed with two decimals).
func pairRatio(scan, raw time.Duration) float64 {
	return float64(scan) / float64(raw)
}

// ratios renders xs with two decimals each, separated by spaces.
func ratios(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(s, " ")
}

// median is the middle value of xs (of an even count, the upper of the two).
func median[T cmp.Ordered](xs []T) T {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
