// Package prune measures retention (issue 17 item 6) on a day of simulated activity: it
// writes, through the ledger's own calls, -hours hours of a deployment with -subscriptions
// subscriptions on -sources sources, each updated every -every (allocate, store the body,
// accept), with a stale late answer every 20th update, a revalidation every 10th, a few
// notifications that match nothing, a discovery scan pair and catalog per source every hour,
// a derived index taking some current versions every hour, and an outbox consumer that keeps
// up to five minutes behind. It then maps each row's real write time onto the simulated day
// (ending now), compacts the tables (VACUUM FULL), runs a dry run and a prune of rows older
// than -older-than, and prints rows and bytes per table: before, after the prune, and after a
// VACUUM FULL that returns the freed space to the file system.
//
// It creates a database on the server named by -database (an admin URL; default
// $MCPSYNC_BENCH_DATABASE_URL, else $MCPSYNC_TEST_DATABASE_URL; with none, a private cluster
// started for the run) and drops it at the end.
//
//	go run ./bench prune [-database URL] [-subscriptions 1000] [-every 10m] [-hours 24] [-older-than 1h]
package prune

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"text/tabwriter"
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
	admin     string
	subs      int
	sources   int
	every     time.Duration
	hours     int
	olderThan time.Duration
	writers   int
	bodyBytes int
	keep      bool
}

// Main runs the benchmark with the flags in os.Args[1:] (the global flag set) and exits
// the process when it fails; `mcpsync-bench prune` (bench/main.go) calls it.
func Main() {
	var c config
	def := os.Getenv("MCPSYNC_BENCH_DATABASE_URL")
	if def == "" {
		def = os.Getenv("MCPSYNC_TEST_DATABASE_URL")
	}
	flag.StringVar(&c.admin, "database", def, "admin URL of the PostgreSQL server (empty: start a private cluster)")
	flag.IntVar(&c.subs, "subscriptions", 1000, "subscriptions")
	flag.IntVar(&c.sources, "sources", 10, "sources the subscriptions are spread over")
	flag.DurationVar(&c.every, "every", 10*time.Minute, "simulated time between two updates of one subscription")
	flag.IntVar(&c.hours, "hours", 24, "simulated hours")
	flag.DurationVar(&c.olderThan, "older-than", time.Hour, "prune rows older than this")
	flag.IntVar(&c.writers, "writers", 4, "concurrent writers")
	flag.IntVar(&c.bodyBytes, "body", 1024, "bytes of each resource body")
	flag.BoolVar(&c.keep, "keep", false, "keep the database (its name is printed)")
	flag.Parse()
	switch {
	case c.subs <= 0 || c.sources <= 0 || c.hours <= 0 || c.writers <= 0 || c.bodyBytes < 16:
		fail(fmt.Errorf("-subscriptions, -sources, -hours, -writers must be positive and -body at least 16"))
	case c.every < time.Minute || c.every > time.Hour || time.Hour%c.every != 0:
		fail(fmt.Errorf("-every must divide an hour, from 1m to 1h, got %s", c.every))
	case c.olderThan < 0:
		fail(fmt.Errorf("-older-than must not be negative"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cleanup := func() {}
	if c.admin == "" {
		admin, stopCluster, err := pgcluster.Throwaway(ctx, "mcpsync-prunebench-")
		if err != nil {
			fail(err)
		}
		cleanup, c.admin = stopCluster, admin
	}
	err := run(ctx, c)
	cleanup() // before fail: os.Exit runs no deferred call
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "prunebench:", err)
	os.Exit(1)
}

func run(ctx context.Context, c config) error {
	admin, err := pgx.Connect(ctx, c.admin)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(context.Background())
	db := fmt.Sprintf("mcpsync_prunebench_%d_%d", os.Getpid(), time.Now().Unix())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize()); err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	if c.keep {
		fmt.Println("database:", db)
	} else {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
				fmt.Fprintln(os.Stderr, "prunebench: drop database:", err)
			}
		}()
	}
	u, err := url.Parse(c.admin)
	if err != nil {
		return err
	}
	u.Path = "/" + db
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(c.writers + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := dbschema.Apply(ctx, pool); err != nil {
		return err
	}
	st := ledger.New(pool)
	w, err := newWorld(ctx, st, c)
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	ticks := int(time.Hour / c.every)
	updates := c.subs * ticks * c.hours
	fmt.Printf("prunebench: %d subscriptions on %d sources, one update every %s for %d simulated hours (%d updates, %d-byte bodies), %d writers\n",
		c.subs, c.sources, c.every, c.hours, updates, c.bodyBytes, c.writers)
	start := time.Now()
	bounds := []time.Time{dbNow(ctx, pool)}
	for h := range c.hours {
		for tick := range ticks {
			if err := w.tick(ctx, h, tick); err != nil {
				return fmt.Errorf("hour %d tick %d: %w", h, tick, err)
			}
		}
		if err := w.hourly(ctx, h); err != nil {
			return fmt.Errorf("hour %d: %w", h, err)
		}
		bounds = append(bounds, dbNow(ctx, pool))
		if h == 0 || (h+1)%6 == 0 {
			fmt.Printf("  simulated hour %d written (%s)\n", h+1, time.Since(start).Round(time.Second))
		}
	}
	writeRate := float64(updates) / time.Since(start).Seconds()
	fmt.Printf("written in %s (%.0f updates/s)\n", time.Since(start).Round(time.Second), writeRate)
	if err := simulateDay(ctx, pool, bounds); err != nil {
		return fmt.Errorf("map timestamps: %w", err)
	}
	if err := w.consumerBehind(ctx, 5*time.Minute); err != nil {
		return err
	}
	if err := vacuumFull(ctx, pool); err != nil {
		return err
	}
	dry, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: c.olderThan, DryRun: true})
	if err != nil {
		return fmt.Errorf("dry run: %w", err)
	}
	rep, err := st.Prune(ctx, ledger.PruneOptions{OlderThan: c.olderThan})
	if err != nil {
		return fmt.Errorf("prune: %w", err)
	}
	if err := vacuumFull(ctx, pool); err != nil {
		return err
	}
	compact := map[string]int64{}
	for _, t := range ledger.PruneTables {
		var n int64
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT pg_total_relation_size('%s')`, t)).Scan(&n); err != nil {
			return err
		}
		compact[t] = n
	}
	// The dry run's cutoff is a moment earlier than the prune's: rows written right at the
	// boundary may be counted by one and not the other.
	fmt.Printf("\nprune --older-than %s: dry run %s (%d rows), prune %s (%d rows)\n",
		c.olderThan, dry.Elapsed.Round(time.Millisecond), dry.Deleted(), rep.Elapsed.Round(time.Millisecond), rep.Deleted())
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "table\trows before\tdeleted\trows after\tfreed\tsize before\tafter prune\tafter VACUUM FULL\t")
	var tot [6]int64
	for _, t := range rep.Tables {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t\n", t.Table, t.RowsBefore, t.Deleted, t.RowsAfter,
			size(t.FreedBytes), size(t.BytesBefore), size(t.BytesAfter), size(compact[t.Table]))
		for i, v := range []int64{t.RowsBefore, t.Deleted, t.RowsAfter, t.FreedBytes, t.BytesBefore, compact[t.Table]} {
			tot[i] += v
		}
	}
	fmt.Fprintf(tw, "total\t%d\t%d\t%d\t%s\t%s\t\t%s\t\n", tot[0], tot[1], tot[2], size(tot[3]), size(tot[4]), size(tot[5]))
	if err := tw.Flush(); err != nil {
		return err
	}

	// The issue-16 lines: one figure each.
	fig := func(name string, v float64, unit string) benchline.Figure {
		return benchline.Figure{Name: fmt.Sprintf("%s-%d", name, c.subs), Value: v, Unit: unit}
	}
	fmt.Println()
	benchline.Print(os.Stdout, fig("prune-write", writeRate, "updates/s"))
	benchline.Print(os.Stdout, fig("prune-dry-run", dry.Elapsed.Seconds(), "s"))
	benchline.Print(os.Stdout, fig("prune", rep.Elapsed.Seconds(), "s"))
	benchline.Print(os.Stdout, fig("prune-deleted", float64(rep.Deleted()), "rows"))
	benchline.Print(os.Stdout, fig("prune-freed", float64(tot[3])/(1<<20), "MiB"))
	return nil
}

func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func dbNow(ctx context.Context, pool *pgxpool.Pool) time.Time {
	var t time.Time
	_ = pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t
}

func vacuumFull(ctx context.Context, pool *pgxpool.Pool) error {
	for _, t := range ledger.PruneTables {
		if _, err := pool.Exec(ctx, "VACUUM (FULL, ANALYZE) "+t); err != nil {
			return fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	return nil
}

// simulateDay maps every timestamp written between bounds[h] and bounds[h+1] (real time) onto
// simulated hour h of a day that ends now, linearly, so that the rows' ages are those of the
// simulated workload.
func simulateDay(ctx context.Context, pool *pgxpool.Pool, bounds []time.Time) error {
	hours := len(bounds) - 1
	if _, err := pool.Exec(ctx, `CREATE TEMP TABLE sim_bounds (r0 timestamptz, r1 timestamptz, s0 timestamptz)`); err != nil {
		return err
	}
	end := dbNow(ctx, pool)
	for h := range hours {
		s0 := end.Add(-time.Duration(hours-h) * time.Hour)
		r1 := bounds[h+1]
		if h == hours-1 {
			r1 = r1.Add(time.Minute) // the last hour takes whatever committed at its very end
		}
		if _, err := pool.Exec(ctx, `INSERT INTO sim_bounds VALUES ($1, $2, $3)`, bounds[h], r1, s0); err != nil {
			return err
		}
	}
	cols := map[string][]string{
		"receipts":             {"created_at"},
		"read_dispatches":      {"issued_at", "completed_at"},
		"resource_versions":    {"accepted_at"},
		"invalidation_outbox":  {"created_at"},
		"content_blobs":        {"created_at"},
		"guard_verdicts":       {"checked_at"},
		"index_lineage":        {"first_taken_at", "last_taken_at"},
		"discovery_scans":      {"started_at", "ended_at", "progress_at"},
		"catalogs":             {"published_at", "measured_at", "scans_started_at", "next_check_at"},
		"catalog_consumptions": {"created_at"},
	}
	for table, cs := range cols {
		// A value outside every bound (written before the first hour) is kept.
		var sets []string
		for _, col := range cs {
			sets = append(sets, fmt.Sprintf(`%[1]s = coalesce((SELECT b.s0 + (t.%[1]s - b.r0) * (3600 / greatest(extract(epoch FROM b.r1 - b.r0), 0.001))
				FROM sim_bounds b WHERE t.%[1]s >= b.r0 AND t.%[1]s < b.r1), t.%[1]s)`, col))
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s t SET %s`, table, strings.Join(sets, ", "))); err != nil {
			return fmt.Errorf("%s: %w", table, err)
		}
	}
	return nil
}

// world is the simulated deployment.
type world struct {
	st      *ledger.Store
	c       config
	sources []ledger.Source
	gens    map[int64]int64 // source -> session generation
	subs    []*simSub
	seq     int64
}

type simSub struct {
	sub     ledger.Subscription
	sgen    int64
	updates int
	digest  string
}

func newWorld(ctx context.Context, st *ledger.Store, c config) (*world, error) {
	w := &world{st: st, c: c, gens: map[int64]int64{}}
	for i := range c.sources {
		src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: fmt.Sprintf("src%d", i), Transport: ledger.TransportStdio, Command: []string{"srv"}})
		if err != nil {
			return nil, err
		}
		w.sources = append(w.sources, src)
	}
	if _, err := st.ClaimSources(ctx, "bench-host", 48*time.Hour); err != nil {
		return nil, err
	}
	for _, src := range w.sources {
		sess, _, err := st.OpenSession(ctx, src.ID, "bench-host", ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125,
			Resources: true, Subscribe: true, ListChanged: true})
		if err != nil {
			return nil, err
		}
		w.gens[src.ID] = sess.Generation
	}
	for i := range c.subs {
		src := w.sources[i%len(w.sources)]
		u := fmt.Sprintf("demo://bench/%d", i)
		sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "default", SourceID: src.ID, URI: u, ServerURI: u, WorkflowID: "wf-" + u})
		if err != nil {
			return nil, err
		}
		for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
			if _, err := step(ctx, sub.ID, sub.Generation, w.gens[src.ID]); err != nil {
				return nil, err
			}
		}
		w.subs = append(w.subs, &simSub{sub: sub, sgen: w.gens[src.ID]})
	}
	if _, err := st.EnsureConsumer(ctx, "indexer", false); err != nil {
		return nil, err
	}
	return w, nil
}

// tick updates every subscription once, spread over the writers.
func (w *world) tick(ctx context.Context, h, tick int) error {
	var wg sync.WaitGroup
	errs := make(chan error, w.c.writers)
	for k := range w.c.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := k; i < len(w.subs); i += w.c.writers {
				if err := w.update(ctx, w.subs[i], fmt.Sprintf("h%d-t%d", h, tick)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (w *world) allocate(ctx context.Context, s *simSub, req string) (int64, error) {
	d, err := w.st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: s.sub.ID, Generation: s.sub.Generation,
		SessionGeneration: s.sgen, URI: s.sub.URI, RequestID: req, Reason: mcpsync.ReasonNotification})
	if err != nil || d.Outcome != mcpsync.OutcomeAllocated {
		return 0, fmt.Errorf("allocate %s: %+v %w", req, d, err)
	}
	return d.Ordinal, nil
}

func (w *world) answer(ctx context.Context, s *simSub, ord int64, req, body string) (mcpsync.Outcome, error) {
	padded := body + strings.Repeat(".", max(0, w.c.bodyBytes-len(body)))
	digest, err := w.st.PutBlob(ctx, []byte(padded), "text/plain")
	if err != nil {
		return "", err
	}
	r, err := w.st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: s.sub.ID, Generation: s.sub.Generation,
		SessionGeneration: s.sgen, URI: s.sub.URI, Ordinal: ord, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(padded))}})
	if err != nil {
		return "", err
	}
	if r.Outcome == mcpsync.OutcomeAccepted {
		s.digest = body
	}
	return r.Outcome, nil
}

// update is one change of the resource: a read and its acceptance; every 10th is a
// revalidation (same content), every 20th races a late read that ends STALE.
func (w *world) update(ctx context.Context, s *simSub, at string) error {
	s.updates++
	req := fmt.Sprintf("%s-%d", at, s.sub.ID)
	body := fmt.Sprintf("%s %s", s.sub.URI, at)
	if s.updates%10 == 0 && s.digest != "" {
		body = s.digest
	}
	if s.updates%20 == 0 {
		late, err := w.allocate(ctx, s, req+"-late")
		if err != nil {
			return err
		}
		ord, err := w.allocate(ctx, s, req)
		if err != nil {
			return err
		}
		if _, err := w.answer(ctx, s, ord, req, body); err != nil {
			return err
		}
		out, err := w.answer(ctx, s, late, req+"-late", body+" (late)")
		if err == nil && out != mcpsync.OutcomeStale {
			err = fmt.Errorf("late answer: %s", out)
		}
		return err
	}
	ord, err := w.allocate(ctx, s, req)
	if err != nil {
		return err
	}
	_, err = w.answer(ctx, s, ord, req, body)
	return err
}

func pass(_ context.Context, _ ledger.Version, _ []byte) (ledger.GuardVerdict, []byte, error) {
	return ledger.GuardVerdict{Outcome: ledger.VerdictPass, Policy: "bench"}, nil, nil
}

// hourly: per source a discovery pair and its catalog, and ten notifications that match
// nothing; a derived index takes the current versions of 5 % of the subscriptions.
func (w *world) hourly(ctx context.Context, h int) error {
	for _, src := range w.sources {
		run := fmt.Sprintf("scan/%s/%d", src.Name, h)
		var ids []int64
		for round := 1; round <= 2; round++ {
			id, _, err := w.st.BeginScan(ctx, ledger.ScanStart{Key: fmt.Sprintf("%s/round-%d", run, round), Run: run,
				ScanWorkflowID: run, Round: round, SourceID: src.ID, SessionGeneration: w.gens[src.ID]})
			if err != nil {
				return err
			}
			var entries []ledger.ScanEntry
			for i := range w.c.subs / len(w.sources) {
				u := fmt.Sprintf("demo://bench/%d", i*len(w.sources)+int(src.ID-w.sources[0].ID))
				entries = append(entries, ledger.ScanEntry{Kind: ledger.EntryResource, URI: u, ServerURI: u, Name: u})
			}
			// The listed set changes every 6 hours, so some rounds store their own entries.
			set := fmt.Sprintf("sha256:%s-%d", src.Name, h/6)
			if _, err := w.st.EndScan(ctx, ledger.ScanEnd{ScanID: id, SetDigest: set,
				Progress: ledger.ScanProgress{ResourcePages: 1, Resources: len(entries)}}, entries); err != nil {
				return err
			}
			ids = append(ids, id)
		}
		if _, err := w.st.PublishCatalog(ctx, ledger.PublishRequest{Key: run, ScanWorkflowID: run, SourceID: src.ID,
			Level: ledger.ProofSnapshotUnproven, Reason: "bench", RoundsUsed: 2, BasisScanIDs: ids, Recheck: time.Hour}); err != nil {
			return err
		}
		if _, err := w.st.ConsumeCatalog(ctx, ledger.CatalogRequest{Source: src.Name, Purpose: ledger.PurposeDisplay, Consumer: "bench"}); err != nil {
			return err
		}
		for range 10 {
			w.seq++
			if _, _, err := w.st.RecordNotification(ctx, ledger.Notification{SourceID: src.ID, SessionGeneration: w.gens[src.ID],
				Seq: w.seq, URI: "demo://nobody", ServerURI: "demo://nobody"}); err != nil {
				return err
			}
		}
	}
	for i := h % 20; i < len(w.subs); i += 20 {
		s := w.subs[i]
		if _, err := w.st.Read(ctx, ledger.ReadRequest{Principal: "default", SourceID: s.sub.SourceID, URI: s.sub.URI,
			PolicyID: "bench", ForIndex: "search"}, pass); err != nil {
			return fmt.Errorf("index read: %w", err)
		}
	}
	return nil
}

// consumerBehind moves the indexer's offset to the last outbox row older than lag.
func (w *world) consumerBehind(ctx context.Context, lag time.Duration) error {
	var txid string
	var id int64
	err := w.st.Pool().QueryRow(ctx, `SELECT txid::text, id FROM invalidation_outbox
		WHERE created_at < now() - make_interval(secs => $1) ORDER BY txid DESC, id DESC LIMIT 1`, lag.Seconds()).Scan(&txid, &id)
	if err != nil {
		return fmt.Errorf("consumer offset: %w", err)
	}
	_, err = w.st.Pool().Exec(ctx, `UPDATE outbox_consumers SET txid = $1::xid8, last_id = $2 WHERE name = 'indexer'`, txid, id)
	return err
}
