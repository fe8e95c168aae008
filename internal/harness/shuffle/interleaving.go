package shuffle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// result is what one interleaving contributes to the report.
type result struct {
	ops        int64
	counts     opCounts
	outcomes   map[string]int64
	violations []Violation
}

// opCounts says how often the interleaving drove the calls whose checks would otherwise be
// vacuous.
type opCounts struct {
	confirms            int64 // ConfirmTombstone calls (after a not-found read)
	revocations         int64 // committed revocations
	revocationsInFlight int64 // of which with a dispatch issued and not yet answered
	uriMismatches       int64 // allocations and answers naming another URI
	notifications       int64 // RecordNotification calls, retries included
	notificationRetries int64 // of which retries of the same notification
}

// revocationWindow brackets the receipts committed while the grant was revoked: every receipt
// with an id above after was committed after the revocation committed, and every receipt with
// an id up to before (0: no re-grant) was committed before the grant was asked for again.
type revocationWindow struct{ after, before int64 }

// Client ids of the goroutines of one interleaving (porcupine shows them as lanes).
const (
	clientPulser = iota
	clientReader1
	clientReader2
	clientChurner
	clientKeeper
	clientRevoker
)

// dispatch is a read ordinal the harness was issued, with the identity it was issued under.
type dispatch struct {
	ord       int64
	req       string
	gen, sgen int64
}

// answer is one response the harness gave to a dispatch.
type answer struct {
	d        dispatch
	notFound bool
	body     string
	wrongURI bool // names a URI the subscription is not for
}

// interleaving is the shared state of the goroutines driving one subscription.
type interleaving struct {
	ctx    context.Context
	st     *ledger.Store
	pool   *pgxpool.Pool
	accept AcceptFunc
	seed   int64
	index  int
	start  time.Time

	srcID, subID int64
	uri, host    string

	mu   sync.Mutex
	cond *sync.Cond
	// view is what the harness last learnt; goroutines act on it while others change it, so
	// calls naturally carry stale generations.
	subGen, subSgen  int64 // the subscription's generation and the session it is bound to
	srcGen           int64 // the source's newest session generation
	notifySeq        int64
	pending          []dispatch // issued, not yet answered by the harness
	answered         []answer   // answered at least once: material for retries and duplicates
	pulserDone       bool
	tombstonePending bool // a not-found read was accepted
	churnerDone      bool
	lifecycleLeft    int // keeper and churner still running
	history          []porcupine.Operation
	keys             []string // idempotency keys of every answer and allocation made
	ops              int64
	counts           opCounts
	revocations      []revocationWindow
	outcomes         map[string]int64
	errs             []error
}

// runInterleaving sets up interleaving i, runs its goroutines to completion and checks it.
func runInterleaving(ctx context.Context, st *ledger.Store, pool *pgxpool.Pool, opts Options, runID string, i int) (result, error) {
	seed := opts.Seed + int64(i)
	iv := &interleaving{ctx: ctx, st: st, pool: pool, accept: opts.Accept, seed: seed, index: i,
		outcomes: map[string]int64{}, host: "shuffle-" + runID}
	iv.cond = sync.NewCond(&iv.mu)
	if err := iv.setup(runID); err != nil {
		return result{}, err
	}
	iv.start = time.Now()
	rng := func(actor uint64) *rand.Rand { return rand.New(rand.NewPCG(uint64(seed), actor)) }
	lifecycle := func(actor func()) func() {
		return func() {
			defer func() {
				iv.mu.Lock()
				iv.lifecycleLeft--
				iv.cond.Broadcast()
				iv.mu.Unlock()
			}()
			actor()
		}
	}
	iv.lifecycleLeft = 2
	actors := []func(){
		func() { iv.pulser(rng(clientPulser)) },
		func() { iv.reader(rng(clientReader1), clientReader1) },
		lifecycle(func() {
			iv.churner(rng(clientChurner))
			iv.mu.Lock()
			iv.churnerDone = true
			iv.cond.Broadcast()
			iv.mu.Unlock()
		}),
		lifecycle(func() { iv.keeper(rng(clientKeeper)) }),
	}
	if rng(99).IntN(2) == 0 {
		actors = append(actors, func() { iv.reader(rng(clientReader2), clientReader2) })
	}
	if rng(98).IntN(2) == 0 {
		actors = append(actors, func() { iv.revoker(rng(clientRevoker)) })
	}
	var wg sync.WaitGroup
	for _, a := range actors {
		wg.Add(1)
		go func() { defer wg.Done(); a() }()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	res := result{ops: iv.ops, counts: iv.counts, outcomes: iv.outcomes}
	for _, err := range iv.errs {
		res.violations = append(res.violations, iv.violation(kindError, err.Error()))
	}
	found, err := iv.check()
	if err != nil {
		return result{}, err
	}
	res.violations = append(res.violations, found...)
	if !opts.SkipLinearizability && len(iv.errs) == 0 {
		res.violations = append(res.violations, iv.checkLinearizable()...)
	}
	return res, nil
}

func (iv *interleaving) violation(kind, detail string) Violation {
	return Violation{Seed: iv.seed, Interleaving: iv.index, SubscriptionID: iv.subID, Kind: kind, Detail: detail}
}

// setup creates the interleaving's source (leased to the harness), its first session and an
// ACTIVE subscription, with the ledger's own calls.
func (iv *interleaving) setup(runID string) error {
	ctx := iv.ctx
	src, _, err := iv.st.AddSource(ctx, ledger.SourceSpec{
		Name: fmt.Sprintf("shuffle-%s-%d", runID, iv.index), Transport: ledger.TransportStdio, Command: []string{"shuffle"},
	})
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	iv.srcID = src.ID
	// The harness is the host of its own source: a fixture, not a fence under test.
	if _, err := iv.pool.Exec(ctx, `UPDATE sources SET host_queue = $2, lease_until = now() + interval '1 day' WHERE id = $1`,
		src.ID, iv.host); err != nil {
		return fmt.Errorf("setup: lease: %w", err)
	}
	sess, _, err := iv.st.OpenSession(ctx, src.ID, iv.host, ledger.CapabilityReceipt{ProtocolVersion: mcpsync.ProtocolVersion20251125, Resources: true, Subscribe: true})
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	iv.uri = fmt.Sprintf("shuffle://resource/%d", iv.index)
	if _, _, err := iv.st.GrantAccess(ctx, "shuffle", src.ID, "shuffle harness"); err != nil {
		return fmt.Errorf("setup: grant: %w", err)
	}
	sub, err := iv.st.EnsureSubscription(ctx, ledger.EnsureSpec{Principal: "shuffle", SourceID: src.ID, URI: iv.uri,
		ServerURI: iv.uri, WorkflowID: fmt.Sprintf("shuffle/%s/%d", runID, iv.index)})
	if err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	iv.subID = sub.ID
	for _, step := range []func(context.Context, int64, int64, int64) (ledger.TransitionResult, error){iv.st.BeginSubscribe, iv.st.Activate} {
		r, err := step(ctx, sub.ID, sub.Generation, sess.Generation)
		if err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		if r.Outcome != mcpsync.OutcomeTransitioned {
			return fmt.Errorf("setup: subscription %d: %+v", sub.ID, r)
		}
	}
	iv.ops = 6
	iv.subGen, iv.subSgen, iv.srcGen = sub.Generation, sess.Generation, sess.Generation
	return nil
}

// now is the interleaving's clock for the linearizability history.
func (iv *interleaving) now() int64 { return int64(time.Since(iv.start)) }

// record adds one finished call to the history and the counters. A call that failed is kept
// out of the history (its effect is unknown) and reported as an error.
func (iv *interleaving) record(client int, in opInput, out opOutput, call int64, err error) {
	ret := iv.now()
	iv.mu.Lock()
	defer iv.mu.Unlock()
	iv.ops++
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			iv.errs = append(iv.errs, fmt.Errorf("%s: %w", in, err))
		}
		return
	}
	iv.outcomes[in.kind.String()+" "+string(out.outcome)]++
	iv.history = append(iv.history, porcupine.Operation{ClientId: client, Input: in, Output: out, Call: call, Return: ret})
}

// fail reports a call of the harness's own fixtures that failed.
func (iv *interleaving) fail(err error) {
	iv.mu.Lock()
	defer iv.mu.Unlock()
	if !errors.Is(err, context.Canceled) {
		iv.errs = append(iv.errs, err)
	}
}

// uriOf is the URI a call names: the subscription's, or another one.
func (iv *interleaving) uriOf(wrong bool) string {
	if wrong {
		return iv.uri + "/other"
	}
	return iv.uri
}

// notify records notification seq of session sgen, as the session host does, and records the
// targets it was routed to.
func (iv *interleaving) notify(sgen, seq int64) {
	call := iv.now()
	targets, audit, err := iv.st.RecordNotification(iv.ctx, ledger.Notification{SourceID: iv.srcID, SessionGeneration: sgen,
		Seq: seq, URI: iv.uri, ServerURI: iv.uri})
	out := opOutput{outcome: mcpsync.Outcome(audit), targets: len(targets)}
	if len(targets) > 0 {
		out.outcome, out.gen = "ROUTED", targets[0].Generation
		if targets[0].SubscriptionID != iv.subID {
			out.targets = -1 // routed to another subscription: no model explains it
		}
	}
	iv.record(clientPulser, opInput{kind: opNotify, sgen: sgen, seq: seq}, out, call, err)
	iv.mu.Lock()
	iv.counts.notifications++
	iv.mu.Unlock()
}

// allocate asks for a read ordinal; a fresh (not replayed) allocation that is issued becomes
// a pending dispatch for the readers. wrong names another URI than the subscription's.
func (iv *interleaving) allocate(client int, gen, sgen int64, req string, fresh, wrong bool) opOutput {
	in := opInput{kind: opAllocate, gen: gen, sgen: sgen, req: req, wrongURI: wrong}
	call := iv.now()
	d, err := iv.st.AllocateReadOrdinal(iv.ctx, ledger.AllocateRequest{SubscriptionID: iv.subID, Generation: gen,
		SessionGeneration: sgen, URI: iv.uriOf(wrong), RequestID: req, Reason: mcpsync.ReasonNotification})
	out := opOutput{outcome: d.Outcome, ord: d.Ordinal}
	iv.record(client, in, out, call, err)
	iv.mu.Lock()
	iv.keys = append(iv.keys, fmt.Sprintf("allocate/%d/%s", iv.subID, req))
	if wrong {
		iv.counts.uriMismatches++
	}
	if err == nil && d.Outcome == mcpsync.OutcomeAllocated && fresh {
		iv.pending = append(iv.pending, dispatch{ord: d.Ordinal, req: req, gen: gen, sgen: sgen})
		iv.cond.Broadcast()
	}
	iv.mu.Unlock()
	return out
}

func digestOf(body string) string { return ledger.Digest([]byte(body)) }

func (iv *interleaving) answer(client int, a answer) {
	call := iv.now()
	var in opInput
	var out opOutput
	var err error
	var key string
	if a.notFound {
		in = opInput{kind: opNotFound, gen: a.d.gen, sgen: a.d.sgen, ord: a.d.ord, req: a.d.req, wrongURI: a.wrongURI}
		var o mcpsync.Outcome
		o, err = iv.st.RecordNotFound(iv.ctx, ledger.NotFoundRequest{SubscriptionID: iv.subID, Generation: a.d.gen,
			SessionGeneration: a.d.sgen, URI: iv.uriOf(a.wrongURI), Ordinal: a.d.ord, RequestID: a.d.req})
		out = opOutput{outcome: o}
		if o == mcpsync.OutcomeTombstonePending {
			iv.mu.Lock()
			iv.tombstonePending = true
			iv.mu.Unlock()
		}
		key = fmt.Sprintf("notfound/%d/%d/%s", iv.subID, a.d.ord, a.d.req)
	} else {
		digest := digestOf(a.body)
		in = opInput{kind: opAccept, gen: a.d.gen, sgen: a.d.sgen, ord: a.d.ord, req: a.d.req, digest: digest, wrongURI: a.wrongURI}
		var r ledger.AcceptResult
		r, err = iv.accept(iv.ctx, iv.st, ledger.AcceptRequest{SubscriptionID: iv.subID, Generation: a.d.gen,
			SessionGeneration: a.d.sgen, URI: iv.uriOf(a.wrongURI), Ordinal: a.d.ord, RequestID: a.d.req,
			Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(a.body))}})
		out = opOutput{outcome: r.Outcome}
		key = fmt.Sprintf("accept/%d/%d/%s/%s", iv.subID, a.d.ord, a.d.req, digest)
	}
	iv.record(client, in, out, call, err)
	iv.mu.Lock()
	iv.keys = append(iv.keys, key)
	if a.wrongURI {
		iv.counts.uriMismatches++
	} else {
		iv.answered = append(iv.answered, a)
	}
	iv.cond.Broadcast()
	iv.mu.Unlock()
}

// transition runs one subscription transition and records it.
func (iv *interleaving) transition(client int, in opInput, call func() (ledger.TransitionResult, error)) ledger.TransitionResult {
	start := iv.now()
	r, err := call()
	iv.record(client, in, opOutput{outcome: r.Outcome}, start, err)
	return r
}
