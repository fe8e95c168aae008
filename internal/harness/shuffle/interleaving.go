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

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// result is what one interleaving contributes to the report.
type result struct {
	ops        int64
	outcomes   map[string]int64
	violations []Violation
}

// Client ids of the goroutines of one interleaving (porcupine shows them as lanes).
const (
	clientPulser = iota
	clientReader1
	clientReader2
	clientChurner
	clientKeeper
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
	subGen, subSgen int64 // the subscription's generation and the session it is bound to
	srcGen          int64 // the source's newest session generation
	notifySeq       int64
	pending         []dispatch // issued, not yet answered by the harness
	answered        []answer   // answered at least once: material for retries and duplicates
	pulserDone      bool
	churnerDone     bool
	lifecycleLeft   int // keeper and churner still running
	history         []porcupine.Operation
	keys            []string // idempotency keys of every answer and allocation made
	ops             int64
	outcomes        map[string]int64
	errs            []error
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
	var wg sync.WaitGroup
	for _, a := range actors {
		wg.Add(1)
		go func() { defer wg.Done(); a() }()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return result{}, err
	}
	res := result{ops: iv.ops, outcomes: iv.outcomes}
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
	sess, _, err := iv.st.OpenSession(ctx, src.ID, iv.host, ledger.CapabilityReceipt{ProtocolVersion: "2025-11-25", Resources: true, Subscribe: true})
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
		if r.Outcome != ledger.Transitioned {
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

// allocate asks for a read ordinal; a fresh (not replayed) allocation that is issued becomes
// a pending dispatch for the readers.
func (iv *interleaving) allocate(client int, gen, sgen int64, req string, fresh bool) opOutput {
	in := opInput{kind: opAllocate, gen: gen, sgen: sgen, req: req}
	call := iv.now()
	d, err := iv.st.AllocateReadOrdinal(iv.ctx, ledger.AllocateRequest{SubscriptionID: iv.subID, Generation: gen,
		SessionGeneration: sgen, URI: iv.uri, RequestID: req, Reason: ledger.ReasonNotification})
	out := opOutput{outcome: d.Outcome, ord: d.Ordinal}
	iv.record(client, in, out, call, err)
	iv.mu.Lock()
	iv.keys = append(iv.keys, fmt.Sprintf("allocate/%d/%s", iv.subID, req))
	if err == nil && d.Outcome == ledger.Allocated && fresh {
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
		in = opInput{kind: opNotFound, gen: a.d.gen, sgen: a.d.sgen, ord: a.d.ord, req: a.d.req}
		var o ledger.Outcome
		o, err = iv.st.RecordNotFound(iv.ctx, ledger.NotFoundRequest{SubscriptionID: iv.subID, Generation: a.d.gen,
			SessionGeneration: a.d.sgen, URI: iv.uri, Ordinal: a.d.ord, RequestID: a.d.req})
		out = opOutput{outcome: o}
		key = fmt.Sprintf("notfound/%d/%d/%s", iv.subID, a.d.ord, a.d.req)
	} else {
		digest := digestOf(a.body)
		in = opInput{kind: opAccept, gen: a.d.gen, sgen: a.d.sgen, ord: a.d.ord, req: a.d.req, digest: digest}
		var r ledger.AcceptResult
		r, err = iv.accept(iv.ctx, iv.st, ledger.AcceptRequest{SubscriptionID: iv.subID, Generation: a.d.gen,
			SessionGeneration: a.d.sgen, URI: iv.uri, Ordinal: a.d.ord, RequestID: a.d.req,
			Version: ledger.VersionInfo{MIMEType: "text/plain", Digest: digest, Size: int64(len(a.body))}})
		out = opOutput{outcome: r.Outcome}
		key = fmt.Sprintf("accept/%d/%d/%s/%s", iv.subID, a.d.ord, a.d.req, digest)
	}
	iv.record(client, in, out, call, err)
	iv.mu.Lock()
	iv.keys = append(iv.keys, key)
	iv.answered = append(iv.answered, a)
	iv.mu.Unlock()
}

// transition runs one subscription transition and records it.
func (iv *interleaving) transition(client int, in opInput, call func() (ledger.TransitionResult, error)) ledger.TransitionResult {
	start := iv.now()
	r, err := call()
	iv.record(client, in, opOutput{outcome: r.Outcome}, start, err)
	return r
}

// pulser stands for the session host and the workflow's dispatch: notification pulses, each
// followed by a read ordinal allocation on the subscription as the harness last saw it, some
// retried with the same request ID, some sent with a stale session generation.
func (iv *interleaving) pulser(rng *rand.Rand) {
	defer func() {
		iv.mu.Lock()
		iv.pulserDone = true
		iv.cond.Broadcast()
		iv.mu.Unlock()
	}()
	n := 3 + rng.IntN(4)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		iv.mu.Lock()
		gen, sgen, srcGen := iv.subGen, iv.subSgen, iv.srcGen
		iv.notifySeq++
		seq := iv.notifySeq
		iv.mu.Unlock()
		if rng.IntN(2) == 0 {
			_, _, err := iv.st.RecordNotification(iv.ctx, ledger.Notification{SourceID: iv.srcID, SessionGeneration: srcGen,
				Seq: seq, URI: iv.uri, ServerURI: iv.uri})
			iv.mu.Lock()
			iv.ops++
			if err != nil && !errors.Is(err, context.Canceled) {
				iv.errs = append(iv.errs, fmt.Errorf("record notification: %w", err))
			}
			iv.mu.Unlock()
		}
		if sgen > 1 && rng.IntN(10) == 0 {
			sgen-- // a dispatch from a session that is already gone
		}
		req := fmt.Sprintf("p%d", i)
		iv.allocate(clientPulser, gen, sgen, req, true)
		if rng.IntN(5) == 0 {
			iv.allocate(clientPulser, gen, sgen, req, false) // the activity retried
		}
	}
}

// reader answers dispatches in random order: fresh content (from a small set of bodies, so
// some answers revalidate), not-found, exact retries of earlier answers, and second, different
// answers to dispatches already answered. Some reads are slow: the reader holds their answer
// back until the session churner and the lifecycle keeper have finished, so it arrives after
// whatever they did — a close, a new generation, a new session.
func (iv *interleaving) reader(rng *rand.Rand, client int) {
	bodies := []string{"alpha", "beta", "gamma"}
	var slow []answer
	defer func() {
		iv.mu.Lock()
		for iv.lifecycleLeft > 0 && len(slow) > 0 {
			iv.cond.Wait()
		}
		iv.mu.Unlock()
		for _, a := range slow {
			iv.answer(client, a)
		}
	}()
	n := 3 + rng.IntN(3)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		iv.mu.Lock()
		for len(iv.pending) == 0 && len(iv.answered) == 0 && !iv.pulserDone {
			iv.cond.Wait()
		}
		var a answer
		switch {
		case len(iv.pending) > 0 && (len(iv.answered) == 0 || rng.IntN(4) != 0):
			k := rng.IntN(len(iv.pending))
			a.d = iv.pending[k]
			iv.pending = append(iv.pending[:k], iv.pending[k+1:]...)
			a.notFound = rng.IntN(8) == 0
			a.body = bodies[rng.IntN(len(bodies))]
			if rng.IntN(4) == 0 {
				slow = append(slow, a)
				iv.mu.Unlock()
				continue
			}
		case len(iv.answered) > 0:
			a = iv.answered[rng.IntN(len(iv.answered))]
			if rng.IntN(2) == 0 { // a different answer to the same dispatch
				a.notFound = rng.IntN(6) == 0
				a.body = bodies[rng.IntN(len(bodies))] + "'"
			}
		default:
			iv.mu.Unlock()
			return
		}
		iv.mu.Unlock()
		iv.answer(client, a)
		if rng.IntN(10) == 0 {
			iv.answer(client, a) // the activity retried
		}
	}
}

// churner changes the source's session: a new connection (OpenSession), or the connection
// ends first (CloseSession) and then a new one opens; sometimes it ends an old generation
// again.
func (iv *interleaving) churner(rng *rand.Rand) {
	n := rng.IntN(3)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		iv.mu.Lock()
		cur := iv.srcGen
		iv.mu.Unlock()
		if rng.IntN(3) == 0 {
			iv.closeSession(cur)
		}
		if cur > 1 && rng.IntN(5) == 0 {
			iv.closeSession(cur - 1) // a late end of a superseded session
		}
		call := iv.now()
		sess, _, err := iv.st.OpenSession(iv.ctx, iv.srcID, iv.host, ledger.CapabilityReceipt{ProtocolVersion: "2025-11-25", Resources: true, Subscribe: true})
		iv.record(clientChurner, opInput{kind: opOpenSession}, opOutput{outcome: ledger.Transitioned, gen: sess.Generation}, call, err)
		if err == nil {
			iv.mu.Lock()
			iv.srcGen = max(iv.srcGen, sess.Generation)
			iv.mu.Unlock()
		}
	}
}

func (iv *interleaving) closeSession(gen int64) {
	call := iv.now()
	o, err := iv.st.CloseSession(iv.ctx, iv.srcID, gen, "shuffle")
	iv.record(clientChurner, opInput{kind: opCloseSession, sgen: gen}, opOutput{outcome: o}, call, err)
}

// keeper is the subscription workflow's lifecycle: it re-establishes the subscription on the
// newest session when a session change parked it, unsubscribes (begin, acknowledgement lost or
// not, complete — with retries), re-subscribes after CLOSED (a new generation), parks it for
// reconciliation and restores it from a pending tombstone. Its last step waits for the session
// churner to finish and then reacts to where the subscription stands, as the workflow reacts
// to SessionChanged, so slow answers often meet a subscription re-established on a newer
// session or generation.
func (iv *interleaving) keeper(rng *rand.Rand) {
	n := 2 + rng.IntN(3)
	for i := 0; i < n && iv.ctx.Err() == nil; i++ {
		if i == n-1 {
			iv.mu.Lock()
			for !iv.churnerDone {
				iv.cond.Wait()
			}
			iv.mu.Unlock()
		}
		sub, err := iv.st.SubscriptionByID(iv.ctx, iv.subID)
		iv.mu.Lock()
		iv.ops++
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				iv.errs = append(iv.errs, err)
			}
			iv.mu.Unlock()
			return
		}
		srcGen := iv.srcGen
		iv.mu.Unlock()
		gen, sgen := sub.Generation, sub.SessionGeneration
		switch sub.State {
		case ledger.StateDiscovered, ledger.StateReconciliationRequired:
			iv.establish(rng, gen, srcGen)
		case ledger.StateSubscribing:
			iv.establish(rng, gen, sgen)
		case ledger.StateTombstonePending:
			if rng.IntN(2) == 0 {
				iv.transition(clientKeeper, opInput{kind: opRestore, gen: gen, sgen: sgen}, func() (ledger.TransitionResult, error) {
					return iv.st.RestoreFromTombstone(iv.ctx, iv.subID, gen, sgen)
				})
			} else {
				iv.unsubscribe(rng, gen)
			}
		case ledger.StateActive:
			switch k := rng.IntN(10); {
			case k < 4:
				iv.unsubscribe(rng, gen)
			case k < 6:
				iv.transition(clientKeeper, opInput{kind: opMarkRR, gen: gen}, func() (ledger.TransitionResult, error) {
					return iv.st.MarkReconciliationRequired(iv.ctx, iv.subID, gen, "shuffle")
				})
				iv.establish(rng, gen, srcGen)
			}
		case ledger.StateUnsubscribing, ledger.StateUnsubscribeUnknown:
			iv.finishUnsubscribe(rng, gen, sub.CloseEpoch)
		case ledger.StateClosed:
			call := iv.now()
			s, err := iv.st.EnsureSubscription(iv.ctx, ledger.EnsureSpec{Principal: "shuffle", SourceID: iv.srcID,
				URI: iv.uri, ServerURI: iv.uri, WorkflowID: sub.WorkflowID})
			iv.record(clientKeeper, opInput{kind: opEnsure}, opOutput{outcome: ledger.Transitioned, gen: s.Generation}, call, err)
			if err == nil {
				iv.mu.Lock()
				iv.subGen, iv.subSgen = s.Generation, 0
				iv.mu.Unlock()
				iv.establish(rng, s.Generation, srcGen)
			}
		}
	}
}

// establish subscribes on session sgen and activates, as the workflow does after a session
// change; the pulser then dispatches on that binding.
func (iv *interleaving) establish(rng *rand.Rand, gen, sgen int64) {
	r := iv.transition(clientKeeper, opInput{kind: opBeginSubscribe, gen: gen, sgen: sgen}, func() (ledger.TransitionResult, error) {
		return iv.st.BeginSubscribe(iv.ctx, iv.subID, gen, sgen)
	})
	if !r.Outcome.OK() {
		return
	}
	activate := func() ledger.TransitionResult {
		return iv.transition(clientKeeper, opInput{kind: opActivate, gen: gen, sgen: sgen}, func() (ledger.TransitionResult, error) {
			return iv.st.Activate(iv.ctx, iv.subID, gen, sgen)
		})
	}
	r = activate()
	if rng.IntN(5) == 0 {
		activate() // the activity retried
	}
	if r.Outcome.OK() {
		iv.mu.Lock()
		iv.subGen, iv.subSgen = gen, sgen
		iv.mu.Unlock()
	}
}

// unsubscribe passes the close fence and finishes the close.
func (iv *interleaving) unsubscribe(rng *rand.Rand, gen int64) {
	begin := func() ledger.CloseResult {
		call := iv.now()
		cr, err := iv.st.BeginUnsubscribe(iv.ctx, iv.subID, gen, "shuffle")
		iv.record(clientKeeper, opInput{kind: opBeginUnsubscribe, gen: gen},
			opOutput{outcome: cr.Outcome, ord: cr.CloseOrdinal, epoch: cr.CloseEpoch}, call, err)
		return cr
	}
	cr := begin()
	if rng.IntN(4) == 0 {
		cr = begin() // the activity retried
	}
	if cr.Outcome != ledger.Transitioned {
		return
	}
	iv.finishUnsubscribe(rng, gen, cr.CloseEpoch)
}

// finishUnsubscribe loses the acknowledgement or not, then completes the close, with retries.
func (iv *interleaving) finishUnsubscribe(rng *rand.Rand, gen, epoch int64) {
	if rng.IntN(3) == 0 {
		iv.transition(clientKeeper, opInput{kind: opUnknown, gen: gen, epoch: epoch}, func() (ledger.TransitionResult, error) {
			return iv.st.MarkUnsubscribeUnknown(iv.ctx, iv.subID, gen, epoch, "ack lost")
		})
		if rng.IntN(3) == 0 {
			return // stays UNSUBSCRIBE_UNKNOWN until a later step or a session change
		}
	}
	complete := func() {
		iv.transition(clientKeeper, opInput{kind: opComplete, gen: gen, epoch: epoch}, func() (ledger.TransitionResult, error) {
			return iv.st.CompleteUnsubscribe(iv.ctx, iv.subID, gen, epoch)
		})
	}
	complete()
	if rng.IntN(4) == 0 {
		complete() // the activity retried
	}
}
