package gate

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/harness/chaosmcp"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/harness/shuffle"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

func init() {
	// The shuffles run first, on a deployment that is still idle: the sources, sessions and
	// subscriptions the other sections leave behind keep the worker and Postgres busy, and
	// behind them the shuffles ran at 4,500 interleavings a minute against 7,800 on an idle
	// deployment (2 cores). They use a database of their own, so nothing else depends on when
	// they run. This file's init runs after discovery.go's, gateway.go's and revocation.go's
	// (files initialise in name order), hence the prepend.
	sections = append(append([]section{{"shuffles", shuffles}}, sections...),
		section{"storm", storm},
		section{"converge", converge},
	)
}

// invariantsSection checks R24 on everything the other sections left in the ledger.
var invariantsSection = section{"invariants", func(ctx context.Context, g *run) ([]Row, error) {
	rep, err := invariants.Check(ctx, g.stack.Store.Pool())
	if err != nil {
		return nil, err
	}
	detail := fmt.Sprintf("%d subscriptions, %d versions, %d receipts checked", rep.Subscriptions, rep.Versions, rep.Receipts)
	if rep.Violations() > 0 {
		detail = rep.String()
	}
	return []Row{
		zero("R24", "old generation/session overwrote a newer version", rep.VersionRegressions+rep.OldSessionAcceptances+rep.OldGenerationAcceptances, detail),
		zero("R24", "versions/tombstones/invalidations accepted for non-ACTIVE subscriptions",
			rep.NonActiveAcceptances+rep.AcceptedAfterClose+rep.OutboxAfterClose+rep.OrphanOutbox,
			fmt.Sprintf("any state but ACTIVE: %d before a close fence, %d after it; %d invalidations after it, %d without their version",
				rep.NonActiveAcceptances, rep.AcceptedAfterClose, rep.OutboxAfterClose, rep.OrphanOutbox)),
	}, nil
}}

// shuffles runs the shuffled interleavings of R26 against the real ledger, in a database of
// their own.
func shuffles(ctx context.Context, g *run) ([]Row, error) {
	url, err := g.stack.NewDatabase(ctx)
	if err != nil {
		return nil, err
	}
	cfg, err := shuffle.PoolConfig(url, 0)
	if err != nil {
		return nil, err
	}
	pool, err := newPool(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	n := g.opts.Shuffles
	last := time.Now()
	rep, err := shuffle.Run(ctx, pool, shuffle.Options{Interleavings: n, Seed: time.Now().UnixNano(), Progress: func(done int) {
		if time.Since(last) > 5*time.Second || done == n {
			last = time.Now()
			g.progress("shuffles: %d/%d interleavings", done, n)
		}
	}})
	if err != nil {
		return nil, err
	}
	detail := fmt.Sprintf("%d interleavings, %d ledger calls in %s, seed %d; driven: %s", rep.Interleavings, rep.Operations,
		rep.Elapsed.Round(time.Second), rep.Seed, rep.Driven())
	if len(rep.Examples) > 0 {
		detail += "; first violation: " + rep.Examples[0].Detail
	}
	rows := []Row{
		{Requirement: "R26", Metric: "shuffled notification/read/close interleavings", Threshold: fmt.Sprintf(">= %d", n),
			Measured: fmt.Sprint(rep.Interleavings), Value: float64(rep.Interleavings), Pass: rep.Interleavings >= n, Detail: detail},
		zero("R26", "version regressions", rep.VersionRegressions+rep.OldGenerationAcceptances+rep.OldSessionAcceptances, ""),
		zero("R26", "late tombstones", rep.LateTombstones, ""),
		zero("R26", "outbox rows after CLOSED", rep.OutboxAfterClose+rep.VersionsAfterClose, ""),
		zero("R26", "non-ACTIVE acceptances", rep.NonActiveAcceptances+rep.AllocationsAfterClose, ""),
		zero("R23", "shuffles: versions accepted after revocation committed", rep.AcceptedAfterRevocation,
			fmt.Sprintf("%d revocations with reads in flight (of %d)", rep.RevocationsWithReadsInFlight, rep.Revocations)),
		zero("R26", "every other shuffle invariant (receipts, bindings, linearizability, errors)",
			rep.Violations()-(rep.VersionRegressions+rep.OldGenerationAcceptances+rep.OldSessionAcceptances+
				rep.LateTombstones+rep.OutboxAfterClose+rep.VersionsAfterClose+rep.NonActiveAcceptances+rep.AllocationsAfterClose+
				rep.AcceptedAfterRevocation), ""),
	}
	return rows, nil
}

// chaosSource starts a fault-injecting server over streamable HTTP with n resources named
// prefix/0000…, registers it as source name and subscribes to every resource, waiting until
// each has its first version. The server speaks 2025-11-25 only and the source negotiates.
func (g *run) chaosSource(ctx context.Context, name string, n int, extra ...string) (*chaosmcp.Server, func(int) string, error) {
	return g.chaosSourceEra(ctx, name, "", n, extra...)
}

// chaosSourceEra is chaosSource in an MCP era: with protocol set, the server speaks both eras
// from one endpoint (stateful HTTP for 2025-11-25, stateless for 2026-07-28) and the source is
// pinned to protocol, so its session is in that era (issue 13 item 9).
func (g *run) chaosSourceEra(ctx context.Context, name, protocol string, n int, extra ...string) (*chaosmcp.Server, func(int) string, error) {
	opts := chaosmcp.Options{Name: name, Version: "1"}
	if protocol != "" {
		opts.ProtocolVersions = chaosmcp.AllProtocolVersions
		extra = append([]string{"--protocol", protocol}, extra...)
	}
	srv := chaosmcp.New(opts)
	uriOf := func(i int) string { return fmt.Sprintf("demo://%s/%04d", name, i) }
	for i := 0; i < n; i++ {
		srv.Set(uriOf(i), "v0", "text/plain")
	}
	start := srv.StartHTTP
	if protocol != "" {
		start = srv.StartHTTPBothEras
	}
	h, err := start("127.0.0.1:0")
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	context.AfterFunc(ctx, func() { h.Close(); srv.Close() })
	if _, err := g.stack.MustCLI(ctx, append([]string{"source", "add", name, "--url", h.URL}, extra...)...); err != nil {
		return nil, nil, err
	}
	for i := 0; i < n; i++ {
		if _, err := g.stack.MustCLI(ctx, "subscribe", name, uriOf(i), "--wait", "0"); err != nil {
			return nil, nil, err
		}
	}
	if err := g.waitActive(ctx, name, n); err != nil {
		return nil, nil, err
	}
	if err := checkEra(srv, protocol); err != nil {
		return nil, nil, fmt.Errorf("source %s: %w", name, err)
	}
	return srv, uriOf, nil
}

// checkEra reports an error unless the server saw the source's sessions in the pinned era
// (no pin: nothing to check): 2025-11-25 protocol sessions and no listen stream, or no
// protocol session and listen streams. A row measured in the wrong era would pass for the
// other one.
func checkEra(srv *chaosmcp.Server, protocol string) error {
	if protocol == "" {
		return nil
	}
	sessions, listens := srv.Sessions(), srv.Stats().ListensStarted
	for _, si := range sessions {
		if si.ProtocolVersion != protocol {
			return fmt.Errorf("pinned to %s, the server saw a %s session", protocol, si.ProtocolVersion)
		}
	}
	switch {
	case protocol == ledger.ProtocolModern && (len(sessions) > 0 || listens == 0):
		return fmt.Errorf("pinned to %s, the server saw %d protocol sessions and %d listen streams", protocol, len(sessions), listens)
	case protocol == ledger.ProtocolLegacy && (len(sessions) == 0 || listens > 0):
		return fmt.Errorf("pinned to %s, the server saw %d protocol sessions and %d listen streams", protocol, len(sessions), listens)
	}
	return nil
}

// eras are the MCP revisions the convergence and duplicate-storm sections run in, one row
// each (issue 13 item 9); both must pass.
var eras = []string{ledger.ProtocolLegacy, ledger.ProtocolModern}

// eraSource names a section's source in an era: "storm-2025-11-25".
func eraSource(section, protocol string) string { return section + "-" + protocol }

// waitActive waits until n subscriptions of a source are ACTIVE with a first version.
func (g *run) waitActive(ctx context.Context, source string, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var active int
		if err := g.stack.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM subscriptions s JOIN sources so ON so.id = s.source_id
			WHERE so.name = $1 AND s.state = 'ACTIVE' AND s.last_accepted_ordinal > 0`, source).Scan(&active); err != nil {
			return err
		}
		if active >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d subscriptions of %s ACTIVE after 5 minutes", active, n, source)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// acceptedDigests returns the newest accepted digest of every subscription of a source.
func (g *run) acceptedDigests(ctx context.Context, source string) (map[string]string, error) {
	subs, err := g.stack.Store.ListSubscriptions(ctx, ledger.SubscriptionFilter{Source: source})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, s := range subs {
		out[s.URI] = s.LastAcceptedDigest
	}
	return out, nil
}

// storm measures read amplification under duplicate notifications (R27): every change of
// every resource is notified StormCopies times, the copies StormSpacing apart so that they
// reach the client as separate messages; reads per change, counted once the system is
// quiescent, must stay below 1.2. The detail splits the duplicates into those the session
// host merged (several notifications, one signal) and those the workflow coalesced (a signal
// that caused no read of its own). It runs once per era, a source of its own each, one row
// per era.
func storm(ctx context.Context, g *run) ([]Row, error) {
	var rows []Row
	for _, era := range eras {
		r, err := stormEra(ctx, g, era)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", era, err)
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// stormEra is the storm on a source pinned to protocol.
func stormEra(ctx context.Context, g *run, protocol string) ([]Row, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n, rounds, copies := g.opts.StormResources, g.opts.StormRounds, g.opts.StormCopies
	source := eraSource("storm", protocol)
	srv, uriOf, err := g.chaosSourceEra(ctx, source, protocol, n, "--backstop", "1h")
	if err != nil {
		return nil, err
	}
	countReads := func() (int64, error) {
		var c int64
		err := g.stack.Store.Pool().QueryRow(ctx, `SELECT count(*) FROM read_dispatches d JOIN subscriptions s ON s.id = d.subscription_id
			JOIN sources so ON so.id = s.source_id WHERE so.name = $1`, source).Scan(&c)
		return c, err
	}
	before, err := countReads()
	if err != nil {
		return nil, err
	}
	reasonsBefore, err := g.readsByReason(ctx, source)
	if err != nil {
		return nil, err
	}
	countersBefore, err := g.stormCounters(ctx, source)
	if err != nil {
		return nil, err
	}
	sentBefore := srv.Stats().UpdatesSent
	srv.SetUpdateDuplicates(copies - 1)
	srv.SetUpdateDuplicateSpacing(g.opts.StormSpacing)
	for r := 1; r <= rounds; r++ {
		want := map[string]string{}
		for i := 0; i < n; i++ {
			body := fmt.Sprintf("round %d of %s", r, uriOf(i))
			srv.Set(uriOf(i), body, "text/plain")
			want[uriOf(i)] = ledger.Digest([]byte(body))
		}
		if err := g.waitDigests(ctx, source, want, 2*time.Minute); err != nil {
			return nil, err
		}
		g.progress("storm (%s): round %d/%d converged", protocol, r, rounds)
	}
	// Quiescent: every copy sent and no read dispatched for a while.
	after, err := g.waitQuiet(ctx, func() (int64, error) { return countReads() }, func() int64 { return int64(srv.Stats().UpdatesSent) }, 3*time.Second, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	countersAfter, err := g.stormCounters(ctx, source)
	if err != nil {
		return nil, err
	}
	reasonsAfter, err := g.readsByReason(ctx, source)
	if err != nil {
		return nil, err
	}
	changes := n * rounds
	amp := float64(after-before) / float64(changes)
	notified := srv.Stats().UpdatesSent - sentBefore
	d := countersAfter.minus(countersBefore)
	merged := d.Notifications - d.Signals
	coalesced := d.Signals - d.NotificationReads
	return []Row{{
		Requirement: "R27", Metric: fmt.Sprintf("duplicate storm (%s): read amplification under duplicate notifications", protocol), Threshold: "< 1.2x",
		Measured: fmt.Sprintf("%.3fx", amp), Value: amp, Pass: amp < 1.2,
		Detail: fmt.Sprintf("%d changes notified %d times (%d copies each, %s apart), counted when quiescent: %d reads (%s); "+
			"the workflows received %d notifications in %d deliveries (signals or workflow updates; %d merged in the host), %d deliveries caused no read of their own (coalesced in the workflow; %d notifications were stale or duplicate, %d covered by a read sent after they reached the host)",
			changes, notified, copies, g.opts.StormSpacing, after-before, reasonsText(reasonsAfter, reasonsBefore), d.Notifications, d.Signals, merged, coalesced, d.Stale, d.Covered),
	}}, nil
}

// readsByReason counts the reads dispatched for a source's subscriptions by their reason and
// outcome ("notification/ACCEPTED").
func (g *run) readsByReason(ctx context.Context, source string) (map[string]int64, error) {
	rows, err := g.stack.Store.Pool().Query(ctx, `SELECT d.reason || '/' || coalesce(d.outcome, 'open'), count(*)
		FROM read_dispatches d JOIN subscriptions s ON s.id = d.subscription_id JOIN sources so ON so.id = s.source_id
		WHERE so.name = $1 GROUP BY 1`, source)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var reason string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&reason, &n}, func() error { out[reason] = n; return nil })
	return out, err
}

// reasonsText renders the reads by reason and outcome dispatched between two counts
// ("notification/ACCEPTED 500, notification/REVALIDATED 12"), in order, or "none".
func reasonsText(after, before map[string]int64) string {
	var parts []string
	for _, reason := range slices.Sorted(maps.Keys(after)) {
		if d := after[reason] - before[reason]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", reason, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// stormTotals sums the notification counters of the storm source's subscription workflows.
type stormTotals struct {
	Notifications, Signals, Stale, Covered, NotificationReads int64
}

func (a stormTotals) minus(b stormTotals) stormTotals {
	return stormTotals{a.Notifications - b.Notifications, a.Signals - b.Signals, a.Stale - b.Stale,
		a.Covered - b.Covered, a.NotificationReads - b.NotificationReads}
}

// stormCounters queries every subscription workflow of a storm source for its counters.
func (g *run) stormCounters(ctx context.Context, source string) (stormTotals, error) {
	subs, err := g.stack.Store.ListSubscriptions(ctx, ledger.SubscriptionFilter{Source: source})
	if err != nil {
		return stormTotals{}, err
	}
	var t stormTotals
	for _, s := range subs {
		resp, err := g.stack.Client.QueryWorkflow(ctx, s.WorkflowID, "", contract.QueryState)
		if err != nil {
			return stormTotals{}, fmt.Errorf("query %s: %w", s.WorkflowID, err)
		}
		var v contract.StateView
		if err := resp.Get(&v); err != nil {
			return stormTotals{}, fmt.Errorf("query %s: %w", s.WorkflowID, err)
		}
		c := v.Counters
		t.Notifications += c.Notifications
		t.Signals += c.Signals
		t.Stale += c.NotificationsStale
		t.Covered += c.PulsesCovered
		t.NotificationReads += c.ReadsByReason[mcpsync.ReasonNotification]
	}
	return t, nil
}

// waitQuiet waits until count and sent have not changed for quiet, and returns count then.
func (g *run) waitQuiet(ctx context.Context, count func() (int64, error), sent func() int64, quiet, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	last, lastSent, since := int64(-1), int64(-1), time.Now()
	for {
		c, err := count()
		if err != nil {
			return 0, err
		}
		s := sent()
		if c != last || s != lastSent {
			last, lastSent, since = c, s, time.Now()
		} else if time.Since(since) >= quiet {
			return c, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not quiescent after %s", timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitDigests waits until every URI of a source has the wanted accepted digest.
func (g *run) waitDigests(ctx context.Context, source string, want map[string]string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := g.acceptedDigests(ctx, source)
		if err != nil {
			return err
		}
		missing := 0
		for u, d := range want {
			if got[u] != d {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d resources of %s not converged after %s", missing, len(want), source, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// converge measures R28: ConvergeResources active resources mutate at ConvergeRate for
// ConvergeFor while DropRate of the update notifications are lost; the share of mutations
// whose content (or a newer one) was accepted within Within must be at least 99.9 %. It runs
// once per era, a source of its own each, one row per era.
func converge(ctx context.Context, g *run) ([]Row, error) {
	var rows []Row
	for _, era := range eras {
		r, err := convergeEra(ctx, g, era)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", era, err)
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// convergeEra is the convergence run on a source pinned to protocol.
func convergeEra(ctx context.Context, g *run, protocol string) ([]Row, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := g.opts.ConvergeResources
	srv, uriOf, err := g.chaosSourceEra(ctx, eraSource("converge", protocol), protocol, n)
	if err != nil {
		return nil, err
	}
	head, err := g.stack.Store.OutboxHead(ctx)
	if err != nil {
		return nil, err
	}
	srv.SetUpdateDropRate(g.opts.DropRate)
	type mutation struct {
		uri string
		at  time.Time
		seq int // per-resource mutation number
	}
	var muts []mutation
	digestSeq := map[string]int{} // digest → its resource's mutation number
	perURI := map[string]int{}
	rng := rand.New(rand.NewPCG(7, 11))
	interval := time.Duration(float64(time.Second) / g.opts.ConvergeRate)
	start := time.Now()
	next := start
	for time.Since(start) < g.opts.ConvergeFor {
		u := uriOf(rng.IntN(n))
		perURI[u]++
		body := fmt.Sprintf("%s mutation %d", u, perURI[u])
		digestSeq[ledger.Digest([]byte(body))] = perURI[u]
		muts = append(muts, mutation{uri: u, at: time.Now(), seq: perURI[u]})
		srv.Set(u, body, "text/plain")
		next = next.Add(interval)
		time.Sleep(time.Until(next))
	}
	g.progress("converge (%s): %d mutations sent; waiting up to %s for the last ones", protocol, len(muts), g.opts.Within)
	// accepted[uri] lists (time, mutation number) of every version accepted since the start.
	type acc struct {
		at  time.Time
		seq int
	}
	accepted := map[string][]acc{}
	cur := head
	lastMut := muts[len(muts)-1].at
	for time.Since(lastMut) < g.opts.Within+5*time.Second {
		rows, _, err := g.stack.Store.OutboxBatch(ctx, cur, 2000)
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			cur = r.Cursor
			if seq, ok := digestSeq[r.Digest]; ok && r.Kind == "version" {
				accepted[r.URI] = append(accepted[r.URI], acc{r.CreatedAt, seq})
			}
		}
		if len(rows) == 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	converged := 0
	var lat []time.Duration
	for _, m := range muts {
		for _, a := range accepted[m.uri] {
			if a.seq >= m.seq {
				if d := a.at.Sub(m.at); d <= g.opts.Within {
					converged++
					lat = append(lat, d)
				}
				break
			}
		}
	}
	slices.Sort(lat)
	share := float64(converged) / float64(len(muts))
	st := srv.Stats()
	detail := fmt.Sprintf("%d mutations of %d resources, %d of %d notifications dropped", len(muts), n, st.UpdatesDropped, st.UpdatesDropped+st.UpdatesSent)
	if len(lat) > 0 {
		detail += fmt.Sprintf("; convergence p50 %s, p99 %s, max %s", lat[len(lat)/2].Round(time.Millisecond),
			lat[len(lat)*99/100].Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	}
	return []Row{{
		Requirement: "R28", Metric: fmt.Sprintf("convergence (%s): active resources converged within %s (%.0f %% notifications dropped)", protocol, g.opts.Within, g.opts.DropRate*100),
		Threshold: ">= 99.9 %", Measured: fmt.Sprintf("%.2f %%", share*100), Value: share, Pass: share >= 0.999, Detail: detail,
	}}, nil
}
