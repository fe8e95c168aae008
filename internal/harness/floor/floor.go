// Package floor measures the cheapest entity workflow Temporal can run, as the baseline the
// mcpsync throughput bench compares itself with (issue 16 item 1): one workflow per
// subscription that waits for a signal, runs one local activity that does nothing but note
// the time it ran, and loops (continuing as new when the server suggests it). Run offers
// signals at a fixed rate across n such workflows and reports accepted/s and the p50/p99
// latency from signal send to local activity done. Nothing in it touches Postgres or MCP.
//
// With Options.Update the same entities receive each offered update as a workflow update
// (UpdateName) instead of a signal, handled by the same local activity: what a delivery costs
// when the server dispatches it in a speculative workflow task, persisted only when the task
// completes, against a signal's, persisted on arrival and again when its task starts.
package floor

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// WorkflowName is the registered name of the floor entity workflow.
const WorkflowName = "FloorEntity"

// SignalName is the signal each offered update is sent as; its payload is the update's int64
// sequence number.
const SignalName = "floor-update"

// UpdateName is the workflow update each offered update is sent as with Options.Update; its
// argument is the update's int64 sequence number, and it completes when its local activity has
// run.
const UpdateName = "floor-update"

// Result is what Run measured. Latencies are from just before the SignalWorkflow call (with
// Options.Update, the UpdateWorkflow call) to the end of the local activity it caused; only
// the offered phase counts (the warm-up does not).
type Result struct {
	// Workflows is the number of entity workflows (n).
	Workflows int
	// Sent is the number of signals sent during the offered phase (acknowledged or not).
	Sent int
	// SignalErrors counts SignalWorkflow calls that failed (an overloaded server times them
	// out; such a signal may still have arrived, and then counts as accepted), or with
	// Options.Update the UpdateWorkflow calls that failed.
	SignalErrors int
	// SignalErrorSample holds up to three of those errors' messages.
	SignalErrorSample []string
	// Missing is Sent - Accepted: signals whose local activity had not run when Run stopped
	// waiting.
	Missing int
	// Offered is Sent divided by the offered phase's length (/s).
	Offered float64
	// Accepted is the number of sent signals whose local activity ran.
	Accepted int
	// Repeated counts local activity runs beyond the first for one signal (0 when every
	// signal's local activity ran exactly once).
	Repeated int
	// AcceptedPerSec is Accepted divided by the span from the first send to the later of the
	// phase's end and the last local activity done.
	AcceptedPerSec float64
	// P50, P99 and Max are latency percentiles over the accepted signals.
	P50, P99, Max time.Duration
	// P50All and P99All count every missing signal as Never (infinitely late), as the
	// mcpsync bench counts a mutation never accepted.
	P50All, P99All time.Duration
	// Span is the denominator of AcceptedPerSec.
	Span time.Duration
	// Start is when the offered phase began (for counting history events in the window).
	Start time.Time
	// WorkflowIDs are the n entity workflows' IDs, index i for entity i.
	WorkflowIDs []string
	// PerWorkflow is the number of accepted signals per entity, index i for entity i.
	PerWorkflow []int
	// Unterminated counts the workflows Run could not terminate at the end (left running on
	// an overloaded server), TerminateError the first such failure.
	Unterminated   int
	TerminateError error
}

// Options tune RunWithOptions; the zero value is what Run uses.
type Options struct {
	// Drain bounds the wait, after the offered phase, for outstanding local activities
	// (default 1 minute).
	Drain time.Duration
	// MaxInFlight bounds concurrent SignalWorkflow calls (default 512); when reached, the
	// offered rate falls and Offered shows it.
	MaxInFlight int
	// Keep leaves the workflows running after Run (default: they are terminated).
	Keep bool
	// Seed seeds the choice of entity per signal (default 1).
	Seed uint64
	// Update delivers each offered update as the workflow update UpdateName, waiting for it to
	// complete, instead of as a signal. The entities then do not continue as new (an update
	// in flight at a continue-as-new would fail): a run of Update is meant to be short.
	Update bool
}

// Never is the latency P50All and P99All give a signal whose local activity never ran.
const Never = time.Duration(math.MaxInt64)

// input is the entity workflow's argument.
type input struct {
	// Ready, when non-zero on the first run, is the key the start-up local activity records so
	// the driver knows the workflow is running and cached.
	Ready int64
	// Pending are signals received but not yet processed when the previous run continued as
	// new.
	Pending []int64
	// Updates makes the entity handle UpdateName (Options.Update) and never continue as new.
	Updates bool
}

// recorder is shared by the driver and the in-process worker's local activity.
type recorder struct {
	mu   sync.Mutex
	done map[int64]time.Time
	runs map[int64]int
	cond chan struct{} // closed and replaced on every record
}

func newRecorder() *recorder {
	return &recorder{done: map[int64]time.Time{}, runs: map[int64]int{}, cond: make(chan struct{})}
}

// Noop is the local activity: it records when it ran for seq and nothing else.
func (r *recorder) Noop(_ context.Context, seq int64) error {
	now := time.Now()
	r.mu.Lock()
	if r.runs[seq] == 0 {
		r.done[seq] = now
	}
	r.runs[seq]++
	close(r.cond)
	r.cond = make(chan struct{})
	r.mu.Unlock()
	return nil
}

// waitFor waits until keep says the recorder holds every key it needs, or ctx ends.
func (r *recorder) waitFor(ctx context.Context, keys func(done map[int64]time.Time) bool) error {
	for {
		r.mu.Lock()
		ok := keys(r.done)
		ch := r.cond
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// entity returns the floor workflow bound to rec's local activity.
func entity(rec *recorder) func(workflow.Context, input) error {
	return func(ctx workflow.Context, in input) error {
		// noop runs the local activity for seq on ctx: the workflow's, or an update handler's.
		noop := func(ctx workflow.Context, seq int64) error {
			ctx = workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: 10 * time.Second})
			return workflow.ExecuteLocalActivity(ctx, rec.Noop, seq).Get(ctx, nil)
		}
		run := func(seq int64) error { return noop(ctx, seq) }
		if in.Updates {
			if err := workflow.SetUpdateHandler(ctx, UpdateName, noop); err != nil {
				return err
			}
		}
		if in.Ready != 0 {
			if err := run(in.Ready); err != nil {
				return err
			}
		}
		for _, seq := range in.Pending {
			if err := run(seq); err != nil {
				return err
			}
		}
		if in.Updates {
			return workflow.Await(ctx, func() bool { return false })
		}
		ch := workflow.GetSignalChannel(ctx, SignalName)
		for {
			var seq int64
			ch.Receive(ctx, &seq)
			// The suggestion is fixed for a workflow task, so a task that continues as new
			// runs no local activity: if the server rejects the continue-as-new because a
			// signal arrived meanwhile, the retried task has no local activity to run twice.
			if workflow.GetInfo(ctx).GetContinueAsNewSuggested() {
				pending := []int64{seq}
				for ch.ReceiveAsync(&seq) {
					pending = append(pending, seq)
				}
				return workflow.NewContinueAsNewError(ctx, WorkflowName, input{Pending: pending})
			}
			if err := run(seq); err != nil {
				return err
			}
		}
	}
}

// Run measures the floor with default Options: it registers the entity workflow and its local
// activity on a new worker for taskQueue (stopped before Run returns), starts n entity
// workflows and waits until each has run, offers signals at rate per second to randomly chosen
// entities for d, waits for the outstanding local activities, terminates the workflows and
// returns the figures. The worker runs in this process: the local activity reports to the
// driver through memory.
func Run(ctx context.Context, c client.Client, taskQueue string, n int, rate float64, d time.Duration) (Result, error) {
	return RunWithOptions(ctx, c, taskQueue, n, rate, d, Options{})
}

// RunWithOptions is Run with tuning; see Options.
func RunWithOptions(ctx context.Context, c client.Client, taskQueue string, n int, rate float64, d time.Duration, opts Options) (res Result, err error) {
	if n <= 0 || rate <= 0 || d <= 0 {
		return Result{}, fmt.Errorf("floor: n (%d), rate (%g) and duration (%s) must be positive", n, rate, d)
	}
	if opts.Drain <= 0 {
		opts.Drain = time.Minute
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = 512
	}
	if opts.Seed == 0 {
		opts.Seed = 1
	}
	rec := newRecorder()
	w := worker.New(c, taskQueue, worker.Options{})
	w.RegisterWorkflowWithOptions(entity(rec), workflow.RegisterOptions{Name: WorkflowName})
	if err := w.Start(); err != nil {
		return Result{}, fmt.Errorf("floor: start worker: %w", err)
	}
	defer w.Stop()

	var tag [4]byte
	_, _ = crand.Read(tag[:])
	prefix := "floor-" + hex.EncodeToString(tag[:]) + "-"
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%05d", prefix, i)
	}
	if !opts.Keep {
		defer func() {
			// Leftover workflows do not spoil the figures: they are counted, not fatal.
			res.Unterminated, res.TerminateError = terminate(context.WithoutCancel(ctx), c, ids)
		}()
	}
	// Start every entity; each runs one local activity keyed -(i+1) once it is up.
	err = forEach(ctx, len(ids), func(ctx context.Context, i int) error {
		id := ids[i]
		_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
			ID: id, TaskQueue: taskQueue,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
		}, WorkflowName, input{Ready: -int64(i + 1), Updates: opts.Update})
		if err != nil {
			return fmt.Errorf("floor: start %s: %w", id, err)
		}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	readyCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	err = rec.waitFor(readyCtx, func(done map[int64]time.Time) bool {
		for i := range n {
			if _, ok := done[-int64(i+1)]; !ok {
				return false
			}
		}
		return true
	})
	cancel()
	if err != nil {
		return Result{}, fmt.Errorf("floor: waiting for %d entities to start: %w", n, err)
	}

	// Offered phase.
	type sent struct {
		at     time.Time
		entity int
	}
	var (
		mu       sync.Mutex
		sentAt   = map[int64]sent{}
		sendErrs []string
		nErrs    int
		wg       sync.WaitGroup
	)
	sem := make(chan struct{}, opts.MaxInFlight)
	rng := rand.New(rand.NewPCG(opts.Seed, 2))
	interval := time.Duration(float64(time.Second) / rate)
	start := time.Now()
	next := start
	var seq int64
	for time.Since(start) < d && ctx.Err() == nil {
		seq++
		i := rng.IntN(n)
		sem <- struct{}{}
		wg.Add(1)
		go func(seq int64, i int) {
			defer func() { <-sem; wg.Done() }()
			at := time.Now()
			// Recorded before the call: the local activity may finish before it returns.
			mu.Lock()
			sentAt[seq] = sent{at, i}
			mu.Unlock()
			if err := deliver(ctx, c, ids[i], seq, opts.Update); err != nil {
				mu.Lock()
				nErrs++
				if len(sendErrs) < 3 {
					sendErrs = append(sendErrs, err.Error())
				}
				mu.Unlock()
			}
		}(seq, i)
		next = next.Add(interval)
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
	}
	phase := time.Since(start) // the offered phase, not the wait for the last acknowledgements
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if nErrs == len(sentAt) {
		what := "signal"
		if opts.Update {
			what = "workflow update"
		}
		return Result{}, fmt.Errorf("floor: every %s failed, e.g.: %s", what, strings.Join(sendErrs, "; "))
	}
	drainCtx, cancel := context.WithTimeout(ctx, opts.Drain)
	_ = rec.waitFor(drainCtx, func(done map[int64]time.Time) bool {
		for s := range sentAt {
			if _, ok := done[s]; !ok {
				return false
			}
		}
		return true
	})
	cancel()

	res = Result{Workflows: n, Sent: len(sentAt), SignalErrors: nErrs, SignalErrorSample: sendErrs,
		Start: start, WorkflowIDs: ids, PerWorkflow: make([]int, n)}
	res.Offered = float64(res.Sent) / phase.Seconds()
	rec.mu.Lock()
	var lat []time.Duration
	last := start
	for s, snt := range sentAt {
		at, ok := rec.done[s]
		if !ok {
			continue
		}
		lat = append(lat, at.Sub(snt.at))
		res.PerWorkflow[snt.entity]++
		res.Repeated += rec.runs[s] - 1
		if at.After(last) {
			last = at
		}
	}
	for s, runs := range rec.runs {
		if s < 0 {
			res.Repeated += runs - 1
		}
	}
	rec.mu.Unlock()
	res.Accepted = len(lat)
	res.Span = max(phase, last.Sub(start))
	res.AcceptedPerSec = float64(res.Accepted) / res.Span.Seconds()
	res.Missing = res.Sent - res.Accepted
	res.P50, res.P99, res.Max = Percentile(lat, 0.50), Percentile(lat, 0.99), Percentile(lat, 1)
	for range res.Missing {
		lat = append(lat, Never)
	}
	res.P50All, res.P99All = Percentile(lat, 0.50), Percentile(lat, 0.99)
	return res, nil
}

// deliver sends update seq to workflow id: as a signal, or as a workflow update that it waits
// for until the update has completed.
func deliver(ctx context.Context, c client.Client, id string, seq int64, update bool) error {
	if !update {
		return c.SignalWorkflow(ctx, id, "", SignalName, seq)
	}
	h, err := c.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{
		UpdateID: fmt.Sprintf("floor-%d", seq), WorkflowID: id, UpdateName: UpdateName, Args: []any{seq},
		WaitForStage: client.WorkflowUpdateStageCompleted,
	})
	if err != nil {
		return err
	}
	return h.Get(ctx, nil)
}

// StartOptions tune Starts; the zero value starts 32 at a time with a worker of default
// options and no deadline.
type StartOptions struct {
	// Parallel is how many StartWorkflowExecution calls are in flight at once (default 32).
	Parallel int
	// Window bounds how many entities may be started and not yet up (default 200, as
	// `mcpsync subscribe --window`): past it, starts wait, so that starts do not outrun the
	// workflow tasks and leave a backlog of entities not up.
	Window int
	// Deadline, if not zero, stops the measurement: Starts then returns how many entities were
	// up by then (Up < Workflows).
	Deadline time.Time
	// Worker configures the in-process worker that runs the entities.
	Worker worker.Options
}

// StartResult is what Starts measured.
type StartResult struct {
	// Workflows is the number of entities asked for (n).
	Workflows int
	// Started is how many start calls succeeded; Up how many entities ran their start-up local
	// activity (the end of their first workflow task's work).
	Started, Up int
	// Elapsed is from the first start call to the last entity up (or to the deadline).
	Elapsed time.Duration
	// PerSec is Up divided by Elapsed.
	PerSec float64
}

// Starts measures the cheapest start of n entity workflows on taskQueue: each one started
// (opts.Parallel calls in flight, at most opts.Window not yet up) runs its start-up local
// activity in its first workflow task and then waits for signals, as a subscription workflow starts with its first read and then
// waits. It returns when every entity is up, or at opts.Deadline with how many were. The
// entities are left running: the caller measures on a server it discards afterwards. Nothing
// in it touches Postgres or MCP. Each start asks for eager execution, as a bulk subscribe's
// starts from the worker do (launch.SubscriptionEager, within the same window): c must be the
// client the entities' worker is built with, which Starts does.
func Starts(ctx context.Context, c client.Client, taskQueue string, n int, opts StartOptions) (StartResult, error) {
	if n <= 0 {
		return StartResult{}, fmt.Errorf("floor: n (%d) must be positive", n)
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 32
	}
	if opts.Window <= 0 {
		opts.Window = 200
	}
	rec := newRecorder()
	w := worker.New(c, taskQueue, opts.Worker)
	w.RegisterWorkflowWithOptions(entity(rec), workflow.RegisterOptions{Name: WorkflowName})
	if err := w.Start(); err != nil {
		return StartResult{}, fmt.Errorf("floor: start worker: %w", err)
	}
	defer w.Stop()
	if !opts.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, opts.Deadline)
		defer cancel()
	}
	var tag [4]byte
	_, _ = crand.Read(tag[:])
	prefix := "floor-start-" + hex.EncodeToString(tag[:]) + "-"
	res := StartResult{Workflows: n}
	var started atomic.Int64
	began := time.Now()
	// Entity i is admitted once fewer than Window of the i before it are not yet up.
	err := forEachN(ctx, n, opts.Parallel, func(ctx context.Context, i int) error {
		if err := rec.waitFor(ctx, func(done map[int64]time.Time) bool { return i-len(done) < opts.Window }); err != nil {
			return err
		}
		_, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
			ID: fmt.Sprintf("%s%05d", prefix, i), TaskQueue: taskQueue,
			WorkflowIDConflictPolicy: enumspb.WORKFLOW_ID_CONFLICT_POLICY_FAIL,
			EnableEagerStart:         true, // as a bulk subscribe's batches start (launch.SubscriptionEager)
		}, WorkflowName, input{Ready: -int64(i + 1)})
		if err != nil {
			return fmt.Errorf("floor: start %d: %w", i, err)
		}
		started.Add(1)
		return nil
	})
	if err != nil && ctx.Err() == nil {
		return StartResult{}, err
	}
	// No signal is sent: the recorder holds the start-up keys alone, one per entity up.
	_ = rec.waitFor(ctx, func(done map[int64]time.Time) bool { return len(done) == n })
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return StartResult{}, err
	}
	last := began
	rec.mu.Lock()
	res.Up = len(rec.done)
	for _, at := range rec.done {
		if at.After(last) {
			last = at
		}
	}
	rec.mu.Unlock()
	res.Started = int(started.Load())
	res.Elapsed = last.Sub(began)
	if res.Up < n {
		res.Elapsed = time.Since(began)
	}
	if res.Elapsed > 0 {
		res.PerSec = float64(res.Up) / res.Elapsed.Seconds()
	}
	return res, nil
}

// Percentile returns the p-quantile (0..1) of lat by the nearest-rank rule, 0 for none; it
// sorts lat in place.
func Percentile(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return lat[min(len(lat)-1, int(p*float64(len(lat))))]
}

// terminate ends the floor's workflows (a workflow already closed is not an error), trying
// each up to three times: an overloaded server times calls out. It returns how many it could
// not terminate and the first such error.
func terminate(ctx context.Context, c client.Client, ids []string) (int, error) {
	var mu sync.Mutex
	failed := 0
	var first error
	_ = forEach(ctx, len(ids), func(ctx context.Context, i int) error {
		var err error
		for range 3 {
			err = c.TerminateWorkflow(ctx, ids[i], "", "floor bench done")
			var nf *serviceerror.NotFound
			if err == nil || errors.As(err, &nf) {
				return nil
			}
			if ctx.Err() != nil {
				break
			}
		}
		mu.Lock()
		failed++
		if first == nil {
			first = fmt.Errorf("floor: terminate %s: %w", ids[i], err)
		}
		mu.Unlock()
		return nil
	})
	return failed, first
}

// forEach runs fn for 0..n-1 with at most 32 calls at once and returns the first error; after
// an error, the remaining calls see a cancelled context.
func forEach(ctx context.Context, n int, fn func(context.Context, int) error) error {
	return forEachN(ctx, n, 32, fn)
}

// forEachN is forEach with at most parallel calls at once.
func forEachN(ctx context.Context, n, parallel int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := fn(ctx, i); err != nil {
				cancel(err)
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return err
	}
	return nil
}
