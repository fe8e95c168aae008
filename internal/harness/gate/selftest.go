package gate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/harness/invariants"
	"github.com/mcpsync/mcpsync/internal/harness/shuffle"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// The checker self-test proves, at every gate run, that the checkers the gate relies on (the
// R24 invariants and the shuffle harness's table and linearizability checks, SPEC R24, R26)
// can fail. In a scratch ledger it builds, per broken fence, a subscription through the
// ledger's own calls, checks that every checker finds it clean, then lets a deliberately
// broken variant of one guarded statement — the ledger's statement with one condition of its
// WHERE left out, used only here — write what that condition forbids, and checks that the
// checkers meant to catch it fire. Nothing in the ledger's code paths changes.

// selfTestSection runs the self-test in a database of its own, before every other section.
var selfTestSection = section{"self-test", func(ctx context.Context, g *run) ([]Row, error) {
	url, err := g.stack.NewDatabase(ctx)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	res, err := selfTest(ctx, pool)
	if err != nil {
		return nil, err
	}
	for _, f := range res.Fences {
		g.progress("self-test: %s: %s", f.Name, f.summary())
	}
	return []Row{res.row()}, nil
}}

// Checker names: an invariants counter, a shuffle violation kind, or porcupine.
const (
	chkInvRegression   = "invariants: version regression"
	chkInvAfterClose   = "invariants: accepted after close"
	chkInvOutboxClose  = "invariants: outbox after close"
	chkInvNonActive    = "invariants: non-ACTIVE acceptance"
	chkInvOldSession   = "invariants: old-session acceptance"
	chkShufRegression  = "shuffle: version regressions"
	chkShufOutboxClose = "shuffle: outbox rows after close"
	chkShufTombstone   = "shuffle: late tombstones"
	chkShufNonActive   = "shuffle: non-ACTIVE acceptances"
	chkShufOldSession  = "shuffle: old-session acceptances"
	chkPorcupine       = "porcupine: regression history"
	chkRevocation      = "gate: versions accepted after revocation committed"
)

// disabledCheckers silences checkers by name (test hook only: a self-test with one checker
// silenced must fail).
var disabledCheckers = map[string]bool{}

// invariantCounters maps the invariants checkers to their Report counters.
var invariantCounters = map[string]func(invariants.Report) int{
	chkInvRegression:                        func(r invariants.Report) int { return r.VersionRegressions },
	chkInvAfterClose:                        func(r invariants.Report) int { return r.AcceptedAfterClose },
	chkInvOutboxClose:                       func(r invariants.Report) int { return r.OutboxAfterClose },
	chkInvNonActive:                         func(r invariants.Report) int { return r.NonActiveAcceptances },
	chkInvOldSession:                        func(r invariants.Report) int { return r.OldSessionAcceptances },
	"invariants: old-generation acceptance": func(r invariants.Report) int { return r.OldGenerationAcceptances },
	"invariants: orphan invalidation":       func(r invariants.Report) int { return r.OrphanOutbox },
}

// fixture is one ACTIVE subscription, on a source, session and principal of its own, with
// ordinals 1 and 2 accepted through the ledger's fences.
type fixture struct {
	st           *ledger.Store
	srcID, subID int64
	gen, sgen    int64
	uri          string
	principal    string
	// revokedSnapshot is a pg_snapshot taken right after the principal's grant was revoked.
	revokedSnapshot string
}

const selfTestHost = "gate-self-test"

func newFixture(ctx context.Context, st *ledger.Store, name string) (*fixture, error) {
	src, _, err := st.AddSource(ctx, ledger.SourceSpec{Name: name, Transport: ledger.TransportStdio, Command: []string{"self-test"}})
	if err != nil {
		return nil, err
	}
	// The self-test is the host of its sources: a fixture, not a fence under test.
	if _, err := st.Pool().Exec(ctx, `UPDATE sources SET host_queue = $2, lease_until = now() + interval '1 day' WHERE id = $1`,
		src.ID, selfTestHost); err != nil {
		return nil, err
	}
	if _, _, err := st.GrantAccess(ctx, "p-"+name, src.ID, "gate self-test"); err != nil {
		return nil, err
	}
	sess, _, err := st.OpenSession(ctx, src.ID, selfTestHost, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		return nil, err
	}
	f := &fixture{st: st, srcID: src.ID, sgen: sess.Generation, uri: "selftest://" + name, principal: "p-" + name}
	sub, err := st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: f.principal, SourceID: src.ID, URI: f.uri, ServerURI: f.uri, WorkflowID: "self-test/" + name})
	if err != nil {
		return nil, err
	}
	f.subID, f.gen = sub.ID, sub.Generation
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){st.BeginSubscribe, st.Activate} {
		if err := transitioned(step(ctx, sub.ID, sub.Generation, sess.Generation)); err != nil {
			return nil, err
		}
	}
	for _, req := range []string{"r1", "r2"} {
		ord, err := f.allocate(ctx, req)
		if err != nil {
			return nil, err
		}
		if err := f.accept(ctx, ord, req); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func transitioned(r ledger.TransitionResult, err error) error {
	if err != nil {
		return err
	}
	if r.Outcome != mcpsync.OutcomeTransitioned {
		return fmt.Errorf("transition refused: %+v", r)
	}
	return nil
}

// allocate issues the next read ordinal through the ledger's fence.
func (f *fixture) allocate(ctx context.Context, req string) (int64, error) {
	d, err := f.st.AllocateReadOrdinal(ctx, ledger.AllocateRequest{SubscriptionID: f.subID, Generation: f.gen,
		SessionGeneration: f.sgen, URI: f.uri, RequestID: req, Reason: mcpsync.ReasonNotification})
	if err != nil {
		return 0, err
	}
	if d.Outcome != mcpsync.OutcomeAllocated {
		return 0, fmt.Errorf("allocate %s: %s", req, d.Outcome)
	}
	return d.Ordinal, nil
}

// accept answers a dispatch through the ledger's acceptance point.
func (f *fixture) accept(ctx context.Context, ord int64, req string) error {
	r, err := f.st.AcceptResourceVersion(ctx, ledger.AcceptRequest{SubscriptionID: f.subID, Generation: f.gen,
		SessionGeneration: f.sgen, URI: f.uri, Ordinal: ord, RequestID: req,
		Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: ledger.Digest([]byte(f.uri + req))}})
	if err != nil {
		return err
	}
	if r.Outcome != mcpsync.OutcomeAccepted {
		return fmt.Errorf("accept %s: %s", req, r.Outcome)
	}
	return nil
}

// Conditions of the acceptance point's WHERE that a broken variant may leave out.
const (
	condWatermark = "s.last_accepted_ordinal < $5"
	condState     = "s.state = 'ACTIVE'"
	condSession   = "s.session_generation = $3"
)

// brokenWhere is the fence of the broken variants: the read fence's conditions that decide
// the cases under test, minus skip.
func brokenWhere(skip string) string {
	var where []string
	for _, c := range []string{condWatermark, condState, condSession} {
		if c != skip {
			where = append(where, c)
		}
	}
	return strings.Join(where, " AND ") + `
			  AND EXISTS (SELECT 1 FROM read_dispatches d WHERE d.subscription_id = $1 AND d.ordinal = $5
			              AND d.request_id = $4 AND d.generation = $2 AND d.outcome IS NULL)`
}

// brokenAccept is the acceptance point with the condition skip left out: it writes what the
// real one writes together — watermark, version, outbox row, settled dispatch, ACCEPTED
// receipt — and reports whether it accepted.
func (f *fixture) brokenAccept(ctx context.Context, skip string, ord, sgen int64, req string) error {
	q := `
		WITH fence AS (
			UPDATE subscriptions s SET last_accepted_ordinal = $5, last_accepted_digest = $6, updated_at = now()
			WHERE s.id = $1 AND s.generation = $2 AND ` + brokenWhere(skip) + `
			RETURNING s.id, s.principal, s.source_id, s.uri),
		ver AS (
			INSERT INTO resource_versions (subscription_id, principal, source_id, uri, kind, mime_type, digest,
				size, read_ordinal, generation, session_generation, request_id, auth_subject)
			SELECT id, principal, source_id, uri, 'content', 'text/plain', $6, 0, $5, $2, $3, $4, 'self-test' FROM fence
			RETURNING id),
		ob AS (
			INSERT INTO invalidation_outbox (kind, idempotency_key, subscription_id, principal, source_id, uri, digest, read_ordinal)
			SELECT 'version', 'version/' || id || '/' || $5::bigint, id, principal, source_id, uri, $6, $5 FROM fence
			RETURNING id),
		dis AS (
			UPDATE read_dispatches SET outcome = 'ACCEPTED', completed_at = now()
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM fence)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation, session_generation,
				read_ordinal, request_id, uri, digest, detail)
			SELECT $7, 'ACCEPTED', source_id, id, $2, $3, $5, $4, uri, $6,
			       jsonb_build_object('outbox', (SELECT id FROM ob), 'dispatch', (SELECT count(*) FROM dis))
			FROM fence
			RETURNING 1)
		SELECT count(*) FROM rc`
	digest := ledger.Digest([]byte(fmt.Sprintf("%s broken %d", f.uri, ord)))
	key := fmt.Sprintf("accept/%d/%d/%s/%s", f.subID, ord, req, digest)
	return f.broken(ctx, "accept", q, f.subID, f.gen, sgen, req, ord, digest, key)
}

// brokenNotFound is RecordNotFound with the condition skip left out: it moves the
// subscription to TOMBSTONE_PENDING, settles the dispatch and writes the receipt.
func (f *fixture) brokenNotFound(ctx context.Context, skip string, ord int64, req string) error {
	q := `
		WITH fence AS (
			UPDATE subscriptions s SET state = 'TOMBSTONE_PENDING', last_accepted_ordinal = $5,
				state_reason = 'self-test: broken not-found fence', updated_at = now()
			WHERE s.id = $1 AND s.generation = $2 AND ` + brokenWhere(skip) + `
			RETURNING s.id, s.source_id, s.uri),
		dis AS (
			UPDATE read_dispatches SET completed_at = now(), outcome = 'TOMBSTONE_PENDING'
			WHERE subscription_id = $1 AND ordinal = $5 AND EXISTS (SELECT 1 FROM fence)
			RETURNING 1),
		rc AS (
			INSERT INTO receipts (idem_key, kind, source_id, subscription_id, generation,
				session_generation, read_ordinal, request_id, uri, detail)
			SELECT $6, 'TOMBSTONE_PENDING', source_id, id, $2, $3, $5, $4, uri,
			       jsonb_build_object('dispatch', (SELECT count(*) FROM dis))
			FROM fence
			RETURNING 1)
		SELECT count(*) FROM rc`
	key := fmt.Sprintf("notfound/%d/%d/%s", f.subID, ord, req)
	return f.broken(ctx, "not-found", q, f.subID, f.gen, f.sgen, req, ord, key)
}

// broken runs a broken statement and requires that it wrote its receipt: a break that
// changes nothing would make the self-test vacuous.
func (f *fixture) broken(ctx context.Context, what, q string, args ...any) error {
	var n int
	if err := f.st.Pool().QueryRow(ctx, q, args...).Scan(&n); err != nil {
		return fmt.Errorf("broken %s: %w", what, err)
	}
	if n != 1 {
		return fmt.Errorf("broken %s of subscription %d wrote nothing: the fixture does not reach the case under test", what, f.subID)
	}
	return nil
}

// brokenFence is one deliberately broken fence of the self-test.
type brokenFence struct {
	name string
	// breakIt takes the fixture to the case under test with the ledger's own calls, then
	// writes the forbidden rows with a broken statement.
	breakIt func(ctx context.Context, f *fixture) error
	// expect names the checkers that must fire.
	expect []string
}

var brokenFences = []brokenFence{
	{"accept without the ordinal check", func(ctx context.Context, f *fixture) error {
		// Ordinals 3 and 4 dispatched; 4 answers first and is accepted; 3 is then accepted
		// below the watermark.
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		if _, err := f.allocate(ctx, "r4"); err != nil {
			return err
		}
		if err := f.accept(ctx, 4, "r4"); err != nil {
			return err
		}
		return f.brokenAccept(ctx, condWatermark, 3, f.sgen, "r3")
	}, []string{chkInvRegression, chkShufRegression, chkPorcupine}},
	{"outbox after close", func(ctx context.Context, f *fixture) error {
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		if _, err := f.st.BeginUnsubscribe(ctx, f.subID, f.gen, "self-test"); err != nil {
			return err
		}
		return f.brokenAccept(ctx, condState, 3, f.sgen, "r3")
	}, []string{chkInvOutboxClose, chkInvAfterClose, chkShufOutboxClose}},
	{"tombstone after close", func(ctx context.Context, f *fixture) error {
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		if _, err := f.st.BeginUnsubscribe(ctx, f.subID, f.gen, "self-test"); err != nil {
			return err
		}
		return f.brokenNotFound(ctx, condState, 3, "r3")
	}, []string{chkInvAfterClose, chkShufTombstone}},
	{"old session accepted after the session ended", func(ctx context.Context, f *fixture) error {
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		if out, err := f.st.CloseSession(ctx, f.srcID, f.sgen, "self-test"); err != nil || out != mcpsync.OutcomeTransitioned {
			return fmt.Errorf("close session: %s, %v", out, err)
		}
		return f.brokenAccept(ctx, condState, 3, f.sgen, "r3")
	}, []string{chkInvOldSession, chkInvNonActive, chkShufNonActive}},
	{"old session accepted after a newer session took over", func(ctx context.Context, f *fixture) error {
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		sess, _, err := f.st.OpenSession(ctx, f.srcID, selfTestHost, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
		if err != nil {
			return err
		}
		for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){f.st.BeginSubscribe, f.st.Activate} {
			if err := transitioned(step(ctx, f.subID, f.gen, sess.Generation)); err != nil {
				return err
			}
		}
		return f.brokenAccept(ctx, condSession, 3, f.sgen, "r3")
	}, []string{chkInvOldSession, chkShufOldSession}},
	{"accept after the revocation committed", func(ctx context.Context, f *fixture) error {
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		if _, err := f.st.Revoke(ctx, ledger.RevokeRequest{Principal: f.principal, SourceID: f.srcID, Reason: "self-test"}); err != nil {
			return err
		}
		if err := f.st.Pool().QueryRow(ctx, `SELECT pg_current_snapshot()::text`).Scan(&f.revokedSnapshot); err != nil {
			return err
		}
		return f.brokenAccept(ctx, "", 3, f.sgen, "r3") // the accept fence without the grant
	}, []string{chkRevocation}},
	{"accept while RECONCILIATION_REQUIRED", func(ctx context.Context, f *fixture) error {
		if _, err := f.allocate(ctx, "r3"); err != nil {
			return err
		}
		if err := transitioned(f.st.MarkReconciliationRequired(ctx, f.subID, f.gen, "self-test")); err != nil {
			return err
		}
		return f.brokenAccept(ctx, condState, 3, f.sgen, "r3")
	}, []string{chkInvNonActive, chkShufNonActive}},
}

// fenceResult is what the checkers said about one broken fence.
type fenceResult struct {
	Name string
	// Clean lists the checkers that fired on the fixture before it was broken (must be none).
	Clean []string
	// Fired lists the checkers that fired on the broken fixture; Missed those expected that
	// did not.
	Fired, Missed []string
}

// Detected reports whether the checkers found the fixture clean and every expected checker
// fired once it was broken.
func (f fenceResult) Detected() bool { return len(f.Clean) == 0 && len(f.Missed) == 0 }

func (f fenceResult) summary() string {
	s := "detected by " + strings.Join(f.Fired, ", ")
	if !f.Detected() {
		s = fmt.Sprintf("NOT DETECTED (missed: %s; fired on the clean fixture: %s; fired: %s)",
			strings.Join(f.Missed, ", "), strings.Join(f.Clean, ", "), strings.Join(f.Fired, ", "))
	}
	return s
}

// selfTestResult is the outcome of the self-test.
type selfTestResult struct {
	Fences  []fenceResult
	Elapsed time.Duration
}

// Detected counts the broken fences the checkers detected.
func (r selfTestResult) Detected() int {
	n := 0
	for _, f := range r.Fences {
		if f.Detected() {
			n++
		}
	}
	return n
}

func (r selfTestResult) row() Row {
	n, d := len(r.Fences), r.Detected()
	var missed []string
	for _, f := range r.Fences {
		if !f.Detected() {
			missed = append(missed, f.Name+": "+f.summary())
		}
	}
	detail := fmt.Sprintf("fences broken: %s (%s)", func() string {
		var names []string
		for _, f := range r.Fences {
			names = append(names, f.Name)
		}
		return strings.Join(names, "; ")
	}(), r.Elapsed.Round(time.Millisecond))
	if len(missed) > 0 {
		detail = strings.Join(missed, "; ")
	}
	return Row{Requirement: "R24/R26", Metric: fmt.Sprintf("checker self-test: %d of %d broken fences detected", d, n),
		Threshold: fmt.Sprintf("= %d of %d", n, n), Measured: fmt.Sprintf("%d of %d", d, n), Value: float64(d),
		Pass: n > 0 && d == n, Detail: detail}
}

// selfTest runs every broken fence in the ledger behind pool (a scratch database: it is left
// with deliberately broken histories).
func selfTest(ctx context.Context, pool *pgxpool.Pool) (selfTestResult, error) {
	start := time.Now()
	st := ledger.New(pool)
	var res selfTestResult
	prev, err := invariants.Check(ctx, pool)
	if err != nil {
		return res, err
	}
	if prev.Violations() != 0 {
		return res, fmt.Errorf("self-test: the scratch ledger is not empty: %s", prev)
	}
	// Each fixture is checked clean, broken, and checked again; the invariants are counted on
	// the whole ledger, so each checker's share is what it added since the previous check.
	fired := func(f *fixture) ([]string, error) {
		rep, err := invariants.Check(ctx, pool)
		if err != nil {
			return nil, err
		}
		var out []string
		for name, count := range invariantCounters {
			if count(rep) > count(prev) && !disabledCheckers[name] {
				out = append(out, name)
			}
		}
		prev = rep
		vs, err := shuffle.CheckSubscription(ctx, pool, f.subID)
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			if name := "shuffle: " + v.Kind; !disabledCheckers[name] && !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
		if f.revokedSnapshot != "" && !disabledCheckers[chkRevocation] {
			n, err := versionsAfterRevocation(ctx, pool, f.srcID, f.principal, f.revokedSnapshot)
			if err != nil {
				return nil, err
			}
			if n > 0 {
				out = append(out, chkRevocation)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	for i, b := range brokenFences {
		f, err := newFixture(ctx, st, fmt.Sprintf("self-test-%d", i))
		if err != nil {
			return res, fmt.Errorf("self-test: %s: fixture: %w", b.name, err)
		}
		r := fenceResult{Name: b.name}
		if r.Clean, err = fired(f); err != nil {
			return res, fmt.Errorf("self-test: %s: %w", b.name, err)
		}
		if err := b.breakIt(ctx, f); err != nil {
			return res, fmt.Errorf("self-test: %s: %w", b.name, err)
		}
		if r.Fired, err = fired(f); err != nil {
			return res, fmt.Errorf("self-test: %s: %w", b.name, err)
		}
		if slices.Contains(b.expect, chkPorcupine) && !disabledCheckers[chkPorcupine] && !shuffle.RegressionHistoryLinearizable() {
			r.Fired = append(r.Fired, chkPorcupine)
		}
		for _, want := range b.expect {
			if !slices.Contains(r.Fired, want) {
				r.Missed = append(r.Missed, want)
			}
		}
		res.Fences = append(res.Fences, r)
	}
	res.Elapsed = time.Since(start)
	return res, nil
}
