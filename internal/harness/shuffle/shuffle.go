// Package shuffle proves the ledger's fences (SPEC R12–R21, R26) by brute force: it runs many
// seeded, randomly generated interleavings of notification pulses, read dispatches, read
// answers (out of order, duplicated, retried, with other digests, not-found), session changes,
// unsubscribes (begun, acknowledged, acknowledgement lost) and re-subscriptions concurrently
// against a real PostgreSQL ledger, then checks the invariants from the ledger's own tables.
//
// One interleaving is one subscription on its own source, driven by several goroutines at
// once — a pulser that allocates reads, readers that answer them in random order, a session
// churner and a lifecycle keeper — so the operations on one subscription really race inside
// Postgres. Interleaving i is generated from seed Seed+i alone, so a failing interleaving is
// replayed by running one interleaving with that seed (the Violation says how). Its choices
// are seeded; the races between its goroutines are real, so a replay repeats the same plan,
// not necessarily the same timing.
//
// After each interleaving the checker reads the subscription's receipts (whose ids are taken
// while the subscription row is locked, so they order its history), versions, dispatches,
// outbox rows and final row, and replays that history against the state machine: watermarks
// never decrease, every accepted ordinal exceeds the previous one, nothing is accepted,
// tombstoned or sent to the outbox after a close fence or on a subscription that is not ACTIVE,
// nothing from an older generation or session is accepted, and every call the harness made left
// exactly one receipt. It also checks the interleaving's recorded call history for
// linearizability against a sequential model of the ledger with
// github.com/anishathalye/porcupine.
package shuffle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// AcceptFunc offers a read's content to the acceptance point. The harness uses
// (*ledger.Store).AcceptResourceVersion; a negative-control test substitutes a deliberately
// broken one to prove that the checker can fail.
type AcceptFunc func(ctx context.Context, st *ledger.Store, req ledger.AcceptRequest) (ledger.AcceptResult, error)

// Options configure Run. The zero value runs one interleaving with seed 0.
type Options struct {
	// Interleavings is how many interleavings to run (default 1).
	Interleavings int
	// Seed generates everything: interleaving i is generated from Seed+i alone.
	Seed int64
	// Concurrency is how many interleavings run at once, each with its own goroutines and
	// connections (default 4 × GOMAXPROCS). The pool needs about 4 connections per
	// interleaving in flight to let them all race (PoolConfig sizes it); fewer only
	// serialize them more.
	Concurrency int
	// Progress, if set, is called with the number of interleavings finished so far, at most
	// about once per 1 % of the run and once at the end. Calls never overlap.
	Progress func(done int)
	// Accept replaces the acceptance point for content answers (nil: the ledger's). Only for
	// negative controls.
	Accept AcceptFunc
	// SkipLinearizability skips the porcupine check (the table checks still run).
	SkipLinearizability bool
	// MaxExamples bounds how many violations Report keeps as examples (default 20).
	MaxExamples int
}

// Report is the outcome of Run. Every counter below Operations counts violations and must be
// zero for a correct ledger; OK says whether they all are.
type Report struct {
	Seed          int64
	Interleavings int           // interleavings run and checked
	Operations    int64         // ledger calls made (including replays and setup)
	Elapsed       time.Duration // wall time of the whole run, checks included
	// Outcomes counts the ledger's answers by operation and outcome, e.g. "accept ACCEPTED".
	Outcomes map[string]int64

	// How often the calls ran whose checks would otherwise be vacuous.
	TombstoneConfirmations       int64 // ConfirmTombstone calls, each after a not-found read and a fresh catalog
	Revocations                  int64 // revocations committed
	RevocationsWithReadsInFlight int64 // of which with a dispatch issued and not yet answered
	URIMismatches                int64 // allocations and answers naming another URI than the subscription's
	Notifications                int64 // RecordNotification calls, retries included
	NotificationRetries          int64 // of which retries of the same notification

	VersionRegressions       int // an acceptance (version, revalidation or tombstone) at or below the watermark before it
	LateTombstones           int // TOMBSTONE_PENDING past a close fence or on a subscription not ACTIVE
	VersionsAfterClose       int // versions past a close fence (ordinal > closeOrdinal, or accepted after the fence)
	OutboxAfterClose         int // invalidation outbox rows past a close fence
	AllocationsAfterClose    int // read ordinals issued past a close fence or while not ACTIVE
	NonActiveAcceptances     int // content accepted while the subscription was not ACTIVE
	OldGenerationAcceptances int // accepted with an older subscription generation than the subscription's
	OldSessionAcceptances    int // accepted with an older session generation than the subscription's
	StaleBindings            int // ACTIVE, SUBSCRIBING or TOMBSTONE_PENDING at the end on a session that is not the source's live one
	ReceiptsMissing          int // calls that left no receipt under their idempotency key; writes without their receipt
	ReceiptsDuplicated       int // one response (or dispatch) with more than one receipt, or accepted twice
	StateMismatches          int // final row differs from the history its receipts record
	NonLinearizable          int // interleavings whose call history no sequential execution of the model explains
	LinearizabilityUnknown   int // porcupine gave up (time limit)
	Errors                   int // ledger calls that failed (the ledger could not decide)
	AcceptedAfterRevocation  int // acceptances committed after a revocation committed and before the grant was asked for again (R23)

	// Examples are the first violations found, each with the seed that replays it.
	Examples []Violation
}

// Violation is one broken invariant in one interleaving.
type Violation struct {
	Seed           int64 // the interleaving's own seed: replay with Seed and one interleaving
	Interleaving   int   // index within the run
	SubscriptionID int64
	Kind           string // the Report counter it was counted in
	Detail         string
}

// ReplayCommand is a one-line command that runs the violation's interleaving again.
func (v Violation) ReplayCommand() string {
	return fmt.Sprintf("go test ./internal/harness/shuffle -run 'TestShuffle$' -seed=%d -interleavings=1 -v", v.Seed)
}

// String describes the violation on one line and its replay command on the next.
func (v Violation) String() string {
	return fmt.Sprintf("%s (interleaving %d, seed %d, subscription %d): %s\n  replay: %s",
		v.Kind, v.Interleaving, v.Seed, v.SubscriptionID, v.Detail, v.ReplayCommand())
}

// counters lists the violation counters in report order, with their names.
func (r *Report) counters() []struct {
	name string
	n    *int
} {
	return []struct {
		name string
		n    *int
	}{
		{"version regressions", &r.VersionRegressions},
		{"late tombstones", &r.LateTombstones},
		{"versions after close", &r.VersionsAfterClose},
		{"outbox rows after close", &r.OutboxAfterClose},
		{"allocations after close or not ACTIVE", &r.AllocationsAfterClose},
		{"non-ACTIVE acceptances", &r.NonActiveAcceptances},
		{"old-generation acceptances", &r.OldGenerationAcceptances},
		{"old-session acceptances", &r.OldSessionAcceptances},
		{"stale session bindings", &r.StaleBindings},
		{"receipts missing", &r.ReceiptsMissing},
		{"receipts duplicated", &r.ReceiptsDuplicated},
		{"state mismatches", &r.StateMismatches},
		{"non-linearizable histories", &r.NonLinearizable},
		{"linearizability unknown", &r.LinearizabilityUnknown},
		{"versions accepted after revocation committed", &r.AcceptedAfterRevocation},
		{"ledger errors", &r.Errors},
	}
}

// Driven says in one line how often the run drove the calls that make the tombstone, revocation
// and notification checks measure something: ConfirmTombstone calls, revocations with reads in
// flight, URI mismatches and notifications (with their retries).
func (r Report) Driven() string {
	return fmt.Sprintf("%d ConfirmTombstone, %d revocations with reads in flight (of %d), %d URI mismatches, %d notifications (%d retries)",
		r.TombstoneConfirmations, r.RevocationsWithReadsInFlight, r.Revocations, r.URIMismatches, r.Notifications, r.NotificationRetries)
}

// Violations is the sum of every violation counter.
func (r Report) Violations() int {
	total := 0
	for _, c := range r.counters() {
		total += *c.n
	}
	return total
}

// OK reports whether every violation counter is zero.
func (r Report) OK() bool { return r.Violations() == 0 }

// WriteTable prints the report as a two-column table: the run's size, then every violation
// counter, then the examples with their replay commands.
func (r Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	row := func(k string, v any) { fmt.Fprintf(&b, "%-40s %v\n", k, v) }
	row("seed", r.Seed)
	row("interleavings", r.Interleavings)
	row("operations", r.Operations)
	row("driven", r.Driven())
	row("elapsed", r.Elapsed.Round(time.Millisecond))
	if r.Elapsed > 0 {
		row("interleavings/s", fmt.Sprintf("%.0f", float64(r.Interleavings)/r.Elapsed.Seconds()))
		row("operations/s", fmt.Sprintf("%.0f", float64(r.Operations)/r.Elapsed.Seconds()))
	}
	for _, c := range r.counters() {
		row(c.name, *c.n)
	}
	verdict := "PASS"
	if !r.OK() {
		verdict = "FAIL"
	}
	row("verdict", verdict)
	for _, v := range r.Examples {
		fmt.Fprintf(&b, "%s\n", v)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Run executes opts.Interleavings interleavings against the ledger in pool (the schema must be
// applied; each interleaving adds its own source and subscription and leaves them, as
// evidence) and checks each one. It returns an error only if the harness itself could not
// run (no database, cancelled context); broken invariants are counted in the Report.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) (Report, error) {
	if opts.Interleavings <= 0 {
		opts.Interleavings = 1
	}
	if opts.Concurrency <= 0 {
		opts.Concurrency = 4 * runtime.GOMAXPROCS(0)
	}
	if opts.Concurrency > opts.Interleavings {
		opts.Concurrency = opts.Interleavings
	}
	if opts.MaxExamples <= 0 {
		opts.MaxExamples = 20
	}
	if opts.Accept == nil {
		opts.Accept = func(ctx context.Context, st *ledger.Store, req ledger.AcceptRequest) (ledger.AcceptResult, error) {
			return st.AcceptResourceVersion(ctx, req)
		}
	}
	start := time.Now()
	runID, err := newRunID(ctx, pool)
	if err != nil {
		return Report{}, err
	}
	st := ledger.New(pool)
	agg := &aggregate{report: Report{Seed: opts.Seed, Outcomes: map[string]int64{}}, max: opts.MaxExamples}

	var next atomic.Int64
	var done atomic.Int64
	var progressMu sync.Mutex
	lastReported := 0
	step := max(1, opts.Interleavings/100)
	var fatal error
	var fatalOnce sync.Once
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	for w := 0; w < opts.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= opts.Interleavings || ctx.Err() != nil {
					return
				}
				res, err := runInterleaving(ctx, st, pool, opts, runID, i)
				if err != nil {
					fatalOnce.Do(func() { fatal = err; cancel() })
					return
				}
				agg.add(res)
				n := int(done.Add(1))
				if opts.Progress != nil && (n-lastReported >= step || n == opts.Interleavings) {
					progressMu.Lock()
					if n > lastReported {
						lastReported = n
						opts.Progress(n)
					}
					progressMu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	rep := agg.result()
	rep.Elapsed = time.Since(start)
	if fatal != nil {
		return rep, fmt.Errorf("shuffle: interleaving could not run: %w", fatal)
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return rep, fmt.Errorf("shuffle: %w", err)
	}
	return rep, nil
}

// newRunID names this run's sources uniquely within the database.
func newRunID(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var id string
	err := pool.QueryRow(ctx, `SELECT to_char(clock_timestamp(), 'YYYYMMDDHH24MISSUS') || '-' || pg_backend_pid()`).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("shuffle: database unavailable: %w", err)
	}
	return id, nil
}

// aggregate merges interleaving results into the report.
type aggregate struct {
	mu     sync.Mutex
	report Report
	max    int
}

func (a *aggregate) add(r result) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.report.Interleavings++
	a.report.Operations += r.ops
	a.report.TombstoneConfirmations += r.counts.confirms
	a.report.Revocations += r.counts.revocations
	a.report.RevocationsWithReadsInFlight += r.counts.revocationsInFlight
	a.report.URIMismatches += r.counts.uriMismatches
	a.report.Notifications += r.counts.notifications
	a.report.NotificationRetries += r.counts.notificationRetries
	for k, v := range r.outcomes {
		a.report.Outcomes[k] += v
	}
	for _, v := range r.violations {
		for _, c := range a.report.counters() {
			if c.name == v.Kind {
				*c.n++
			}
		}
		if len(a.report.Examples) < a.max {
			a.report.Examples = append(a.report.Examples, v)
		}
	}
}

func (a *aggregate) result() Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	rep := a.report
	sort.SliceStable(rep.Examples, func(i, j int) bool { return rep.Examples[i].Interleaving < rep.Examples[j].Interleaving })
	return rep
}

// Kinds of violations, as named in the report table.
const (
	kindRegression         = "version regressions"
	kindLateTombstone      = "late tombstones"
	kindVersionAfterClose  = "versions after close"
	kindOutboxAfterClose   = "outbox rows after close"
	kindAllocationAfter    = "allocations after close or not ACTIVE"
	kindNonActive          = "non-ACTIVE acceptances"
	kindOldGeneration      = "old-generation acceptances"
	kindOldSession         = "old-session acceptances"
	kindStaleBinding       = "stale session bindings"
	kindReceiptMissing     = "receipts missing"
	kindReceiptDuplicated  = "receipts duplicated"
	kindStateMismatch      = "state mismatches"
	kindNonLinearizable    = "non-linearizable histories"
	kindLinearizabilityUnk = "linearizability unknown"
	kindError              = "ledger errors"
	kindAfterRevocation    = "versions accepted after revocation committed"
)

// PoolConfig returns a pool configuration for Run on the ledger database at url: enough
// connections for concurrency interleavings in flight (0: Run's default) to race, and two
// session settings for the harness's connections. synchronous_commit off changes no
// visibility or isolation — a commit is seen by everyone exactly as before — it only stops
// waiting for the WAL flush, which a scratch database for a shuffle run can afford.
// plan_cache_mode force_generic_plan plans each of the ledger's prepared statements once per
// connection instead of six times; every statement is a lookup by key, so the generic plan is
// the plan Postgres settles on anyway.
func PoolConfig(url string, concurrency int) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("shuffle: pool config: %w", err)
	}
	if concurrency <= 0 {
		concurrency = 4 * runtime.GOMAXPROCS(0)
	}
	cfg.MaxConns = int32(min(4*concurrency+2, 80))
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	return cfg, nil
}
