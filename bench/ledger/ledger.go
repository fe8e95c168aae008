// Package ledger measures the ledger's acceptance point against plain PostgreSQL on the
// same cluster, in one run: acceptResourceVersion with concurrent writers — full
// allocate+accept pairs (AllocateReadOrdinal then AcceptResourceVersion) and accepts only (of
// reads allocated beforehand) — and `pgbench -N` with as many clients. The three are measured
// in alternating slices (rounds of pgbench, pairs, accepts), so that load from elsewhere on the
// machine weighs on all three alike. It prints the rates and the ratio accepts/s ÷ pgbench TPS
// (goal ≥ 0.6), with the lowest and highest ratio of a single round.
//
// It creates its own databases on the server named by -database (an admin URL, default
// $MCPSYNC_BENCH_DATABASE_URL) and drops them at the end; with neither set it starts a private
// cluster from the machine's PostgreSQL binaries (default durability settings) and removes it.
//
//	go run ./bench ledger [-database URL] [-writers 8] [-duration 15s]
package ledger

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/dbschema"
	"github.com/mcpsync/mcpsync/internal/devenv/pgcluster"
	"github.com/mcpsync/mcpsync/internal/harness/benchline"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

type config struct {
	admin    string
	writers  int
	subs     int
	duration time.Duration
	rounds   int
	warmup   time.Duration
	pgbench  string
	scale    int
	goal     float64
	strict   bool
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench ledger` (bench/main.go) calls it.
func Main() {
	var c config
	flag.StringVar(&c.admin, "database", os.Getenv("MCPSYNC_BENCH_DATABASE_URL"), "admin URL of the PostgreSQL server (its `postgres` database); empty: start a private cluster")
	flag.IntVar(&c.writers, "writers", 8, "concurrent writers (and pgbench clients)")
	flag.IntVar(&c.subs, "subscriptions", 64, "subscriptions per writer")
	flag.DurationVar(&c.duration, "duration", 15*time.Second, "measured time of each of pgbench, pairs and accepts, split over the rounds")
	flag.IntVar(&c.rounds, "rounds", 5, "rounds of alternating slices")
	flag.DurationVar(&c.warmup, "warmup", 2*time.Second, "unmeasured warm-up before the first ledger slices")
	flag.StringVar(&c.pgbench, "pgbench", "", "pgbench binary (default: next to the server binaries, or /usr/lib/postgresql/15/bin/pgbench)")
	flag.IntVar(&c.scale, "scale", 10, "pgbench -i scale factor")
	flag.Float64Var(&c.goal, "goal", 0.6, "goal for accepts/s ÷ pgbench TPS")
	flag.BoolVar(&c.strict, "strict", false, "exit 1 when the ratio is below the goal")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ratio, err := run(ctx, c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledgerbench:", err)
		os.Exit(1)
	}
	if c.strict && ratio < c.goal {
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) (float64, error) {
	if c.admin == "" {
		admin, stop, err := pgcluster.Throwaway(ctx, "mcpsync-ledgerbench-")
		if err != nil {
			return 0, err
		}
		defer stop()
		c.admin = admin
	}
	pgbenchBin, err := findPgbench(c.pgbench)
	if err != nil {
		return 0, err
	}
	admin, err := pgx.Connect(ctx, c.admin)
	if err != nil {
		return 0, fmt.Errorf("connect %s: %w", redact(c.admin), err)
	}
	defer admin.Close(context.Background())
	var version, fsync, syncCommit string
	if err := admin.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit')`).Scan(&version, &fsync, &syncCommit); err != nil {
		return 0, err
	}
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().Unix())
	ledgerDB, benchDB := "mcpsync_ledgerbench_"+suffix, "mcpsync_pgbench_"+suffix
	for _, db := range []string{ledgerDB, benchDB} {
		if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
			return 0, fmt.Errorf("create database %s: %w", db, err)
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
				fmt.Fprintf(os.Stderr, "ledgerbench: drop database %s: %v\n", db, err)
			}
		}()
	}
	fmt.Printf("ledgerbench: PostgreSQL %s at %s (fsync=%s, synchronous_commit=%s), %d writers, %s measured per kind, GOMAXPROCS %d\n",
		version, redact(c.admin), fsync, syncCommit, c.writers, c.duration, runtime.GOMAXPROCS(0))

	ledgerURL, err := withDatabase(c.admin, ledgerDB)
	if err != nil {
		return 0, err
	}
	cfg, err := pgxpool.ParseConfig(ledgerURL)
	if err != nil {
		return 0, err
	}
	cfg.MaxConns = int32(c.writers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if _, err := dbschema.Apply(ctx, pool); err != nil {
		return 0, err
	}
	st := ledger.New(pool)
	subs, err := setup(ctx, st, pool, c)
	if err != nil {
		return 0, fmt.Errorf("setup: %w", err)
	}
	rounds := max(1, c.rounds)
	slice := max(time.Second, (c.duration / time.Duration(rounds)).Round(time.Second))
	pb := pgbench{bin: pgbenchBin, admin: c.admin, db: benchDB, clients: c.writers, duration: slice}
	if err := pb.init(ctx, c.scale); err != nil {
		return 0, err
	}
	fmt.Printf("%d rounds of %s slices: %s, allocate+accept pairs, accepts only\n", rounds, slice, pb.command())

	var tps []float64
	var pairs, accepts sample
	lo, hi := 0.0, 0.0
	for r := range rounds {
		t, err := pb.run(ctx)
		if err != nil {
			return 0, err
		}
		tps = append(tps, t)
		warmup := time.Duration(0)
		if r == 0 {
			warmup = c.warmup
		}
		p, err := measure(ctx, warmup, slice, subs, func(ctx context.Context, w int, s *sub, n int) error {
			return s.allocateAccept(ctx, st, fmt.Sprintf("w%d-%d-%d", w, r, n))
		})
		if err != nil {
			return 0, fmt.Errorf("allocate+accept: %w", err)
		}
		// Accepts only: reads allocated beforehand (as a set, outside the measurement), for
		// four times the pair rate; the pairs of the round before made older ones stale.
		per := int64(4*p.rate()*(slice+warmup).Seconds())/int64(len(subs)*len(subs[0])) + 64
		if err := preallocate(ctx, pool, subs, per); err != nil {
			return 0, fmt.Errorf("allocate reads for the accepts-only slice: %w", err)
		}
		a, err := measure(ctx, warmup, slice, subs, func(ctx context.Context, w int, s *sub, n int) error {
			return s.acceptNext(ctx, st)
		})
		if err != nil {
			return 0, fmt.Errorf("accepts only: %w", err)
		}
		fmt.Printf("round %d: pgbench %6.0f TPS, pairs %6.0f/s, accepts %6.0f/s, ratio %.2f\n", r+1, t, p.rate(), a.rate(), a.rate()/t)
		if ratio := a.rate() / t; r == 0 || ratio < lo {
			lo = ratio
		}
		if ratio := a.rate() / t; ratio > hi {
			hi = ratio
		}
		pairs, accepts = pairs.merge(p), accepts.merge(a)
	}
	var sum float64
	for _, t := range tps {
		sum += t
	}
	meanTPS := sum / float64(len(tps))
	fmt.Printf("%-32s %10.0f TPS\n", "pgbench -N", meanTPS)
	fmt.Printf("%-32s %10.0f pairs/s   p50 %s  p99 %s  (%d pairs)\n",
		"ledger allocate+accept pairs", pairs.rate(), pairs.pct(50), pairs.pct(99), len(pairs.lat))
	fmt.Printf("%-32s %10.0f accepts/s p50 %s  p99 %s  (%d accepts)\n",
		"ledger accepts only", accepts.rate(), accepts.pct(50), accepts.pct(99), len(accepts.lat))
	ratio := accepts.rate() / meanTPS
	verdict := "meets the goal"
	if ratio < c.goal {
		verdict = "BELOW the goal"
	}
	fmt.Printf("%-32s %10.2f   (goal >= %.2f: %s; rounds %.2f..%.2f)\n", "ratio accepts/s / pgbench TPS", ratio, c.goal, verdict, lo, hi)
	fmt.Printf("%-32s %10.2f\n", "ratio pairs/s / pgbench TPS", pairs.rate()/meanTPS)

	// The issue-16 lines: one figure each, next to the baseline measured in the same run.
	fmt.Println()
	pgb := benchline.Figure{Name: fmt.Sprintf("pgbench-N-%dw", c.writers), Value: meanTPS, Unit: "/s"}
	benchline.PrintVs(os.Stdout, benchline.Figure{Name: fmt.Sprintf("ledger-accepts-%dw", c.writers), Value: accepts.rate(), Unit: "/s"}, pgb)
	benchline.PrintVs(os.Stdout, benchline.Figure{Name: fmt.Sprintf("ledger-pairs-%dw", c.writers), Value: pairs.rate(), Unit: "/s"}, pgb)
	msOf := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	benchline.Print(os.Stdout, benchline.Figure{Name: fmt.Sprintf("ledger-accept-p99-%dw", c.writers), Value: msOf(accepts.pct(99)), Unit: "ms"})
	benchline.Print(os.Stdout, benchline.Figure{Name: fmt.Sprintf("ledger-pair-p99-%dw", c.writers), Value: msOf(pairs.pct(99)), Unit: "ms"})
	return ratio, nil
}

// sub is one ACTIVE subscription a writer uses.
type sub struct {
	id, gen, sgen int64
	uri           string
	next          int64 // accepts only: next preallocated ordinal to accept
	last          int64 // accepts only: last preallocated ordinal
	n             int
}

func (s *sub) allocateAccept(ctx context.Context, st *ledger.Store, req string) error {
	d, err := st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: s.id, Generation: s.gen,
		SessionGeneration: s.sgen, URI: s.uri, RequestID: req, Reason: mcpsync.ReasonPoll})
	if err != nil {
		return err
	}
	if d.Outcome != mcpsync.OutcomeAllocated {
		return fmt.Errorf("allocate on subscription %d: %s", s.id, d.Outcome)
	}
	return s.accept(ctx, st, d.Ordinal, req)
}

func (s *sub) acceptNext(ctx context.Context, st *ledger.Store) error {
	if s.next > s.last {
		return errExhausted
	}
	ord := s.next
	s.next++
	return s.accept(ctx, st, ord, "pre-"+strconv.FormatInt(ord, 10))
}

var errExhausted = errors.New("preallocated reads used up")

func (s *sub) accept(ctx context.Context, st *ledger.Store, ord int64, req string) error {
	s.n++
	body := []byte(fmt.Sprintf("%d/%d", s.id, s.n))
	r, err := st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: s.id, Generation: s.gen,
		SessionGeneration: s.sgen, URI: s.uri, Ordinal: ord, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: ledger.Digest(body), Size: int64(len(body))}})
	if err != nil {
		return err
	}
	if r.Outcome != mcpsync.OutcomeAccepted {
		return fmt.Errorf("accept ordinal %d on subscription %d: %s", ord, s.id, r.Outcome)
	}
	return nil
}

// setup gives every writer its own source, session and subscriptions, through the ledger.
func setup(ctx context.Context, st *ledger.Store, pool *pgxpool.Pool, c config) ([][]*sub, error) {
	out := make([][]*sub, c.writers)
	for w := range out {
		src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: fmt.Sprintf("bench-%d", w), Transport: ledger.TransportStdio, Command: []string{"bench"}})
		if err != nil {
			return nil, err
		}
		// The acceptance point checks the principal's standing grant (R23).
		if _, _, err := st.GrantAccess(ctx, "bench", src.ID, "bench"); err != nil {
			return nil, err
		}
		host := fmt.Sprintf("bench-host-%d", w)
		if _, err := pool.Exec(ctx, `UPDATE sources SET host_queue = $2, lease_until = now() + interval '1 day' WHERE id = $1`, src.ID, host); err != nil {
			return nil, err
		}
		sess, _, err := st.OpenSession(ctx, src.ID, host, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
		if err != nil {
			return nil, err
		}
		for k := 0; k < c.subs; k++ {
			uri := fmt.Sprintf("bench://w%d/r%d", w, k)
			s, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "bench", SourceID: src.ID, URI: uri, ServerURI: uri, WorkflowID: fmt.Sprintf("bench/%d/%d", w, k)})
			if err != nil {
				return nil, err
			}
			for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
				if r, err := step(ctx, s.ID, s.Generation, sess.Generation); err != nil || r.Outcome != mcpsync.OutcomeTransitioned {
					return nil, fmt.Errorf("activate subscription %d: %+v %v", s.ID, r, err)
				}
			}
			out[w] = append(out[w], &sub{id: s.ID, gen: s.Generation, sgen: sess.Generation, uri: uri})
		}
	}
	return out, nil
}

// preallocate issues per reads to every subscription in one set-based statement each (setup
// for the accepts-only phase, not measured).
func preallocate(ctx context.Context, pool *pgxpool.Pool, subs [][]*sub, per int64) error {
	for _, ws := range subs {
		for _, s := range ws {
			var last int64
			err := pool.QueryRow(ctx, `
				WITH s AS (
					UPDATE subscriptions SET last_issued_ordinal = last_issued_ordinal + $2 WHERE id = $1
					RETURNING id, generation, session_generation, uri, last_issued_ordinal)
				INSERT INTO read_dispatches (subscription_id, ordinal, generation, session_generation, uri, request_id, reason)
				SELECT s.id, g, s.generation, s.session_generation, s.uri, 'pre-' || g, 'poll'
				FROM s, generate_series(s.last_issued_ordinal - $2 + 1, s.last_issued_ordinal) g
				RETURNING (SELECT last_issued_ordinal FROM s)`, s.id, per).Scan(&last)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
			s.next, s.last = last-per+1, last
		}
	}
	return nil
}

// sample is what one measured slice (or several, merged) completed: the latency of each call
// that started inside the measured window, and the window's length.
type sample struct {
	lat     []time.Duration
	elapsed time.Duration
}

func (r sample) rate() float64 { return float64(len(r.lat)) / r.elapsed.Seconds() }

func (r sample) pct(p int) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[min(len(r.lat)-1, len(r.lat)*p/100)].Round(time.Microsecond)
}

func (r sample) merge(o sample) sample {
	lat := slices.Concat(r.lat, o.lat)
	slices.Sort(lat)
	return sample{lat: lat, elapsed: r.elapsed + o.elapsed}
}

// measure runs op on every writer, round-robin over the writer's subscriptions, for the warm-up
// and then the measured duration; only calls that start inside the measured window count.
func measure(ctx context.Context, warmup, duration time.Duration, subs [][]*sub, op func(ctx context.Context, w int, s *sub, n int) error) (sample, error) {
	start := time.Now().Add(warmup)
	end := start.Add(duration)
	lat := make([][]time.Duration, len(subs))
	errs := make([]error, len(subs))
	var wg sync.WaitGroup
	for w := range subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				t := time.Now()
				if !t.Before(end) {
					return
				}
				if err := op(ctx, w, subs[w][n%len(subs[w])], n); err != nil {
					errs[w] = err
					return
				}
				if !t.Before(start) {
					lat[w] = append(lat[w], time.Since(t))
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return sample{}, err
	}
	if err := ctx.Err(); err != nil {
		return sample{}, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return sample{}, errors.New("no operation completed in the measured window")
	}
	return sample{lat: all, elapsed: time.Since(start)}, nil
}

// pgbench runs the pgbench binary against one scratch database.
