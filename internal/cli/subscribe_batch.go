package cli

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync"
	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/ledger"
)

// Bulk subscribes hand their starts to the worker in batches (contract.StartBatchWorkflowName,
// issue 16 item 4): a start from the worker's own client is eager, so the new workflow's first
// workflow task skips the trip through the task queue, which is a third of the server's and
// PostgreSQL's work per start. bulkBatchers batches are in flight at once (each starts its
// share of r.parallel at once on the worker); a batch takes what the start window has admitted,
// waiting up to bulkBatchLinger for more.
const (
	bulkBatchers    = 2
	bulkBatchLinger = 20 * time.Millisecond
)

// The batch workflow's type and timeout (tests replace them: export_bulk_test.go).
var (
	startBatchWorkflow = contract.StartBatchWorkflowName
	startBatchTimeout  = contract.StartBatchTimeout
)

// startBatches is the feed's consumer when a worker is known to run (the bulk subscribe
// waits): it starts the items sent on next in batches through the worker, and each item whose
// subscription was CLOSED before (its closing run must end first) or that no batch could start
// (the worker does not know the batch workflow, or it failed) from this process as before.
// Every start is idempotent (launch.Subscription, launch.SubscriptionEager: conflict policy
// USE_EXISTING), so an item started twice is started once.
type startBatches struct {
	e        *runEnv
	tc       client.Client
	src      ledger.Source
	r        bulkRequest
	existing map[string]ledger.Subscription
	results  []bulkResult
	// direct is set once a batch failed: the rest start from here, without waiting on
	// batches a worker does not run to their timeout.
	direct atomic.Bool
}

// run consumes next until it is closed, bulkBatchers batches at a time.
func (b *startBatches) run(ctx context.Context, next <-chan int) {
	var wg sync.WaitGroup
	for range bulkBatchers {
		wg.Go(func() {
			carry := -1
			for {
				batch, more := b.collect(next, &carry)
				if len(batch) > 0 {
					b.start(ctx, batch)
				}
				if !more {
					return
				}
			}
		})
	}
	wg.Wait()
}

// collect takes the next batch from next: the carried item first, then what arrives within
// bulkBatchLinger of the first, up to contract.StartBatchMax items and
// contract.StartBatchMaxBytes of URIs; an item that would pass the byte bound is carried to
// the next batch. more is false once next is closed.
func (b *startBatches) collect(next <-chan int, carry *int) (batch []int, more bool) {
	size := 0
	add := func(i int) bool {
		n := len(b.r.items[i].raw) + len(b.r.items[i].norm)
		if len(batch) > 0 && size+n > contract.StartBatchMaxBytes {
			*carry = i
			return false
		}
		batch, size = append(batch, i), size+n
		return len(batch) < contract.StartBatchMax
	}
	if *carry >= 0 {
		i := *carry
		*carry = -1
		add(i)
	} else {
		i, ok := <-next
		if !ok {
			return nil, false
		}
		add(i)
	}
	linger := time.NewTimer(bulkBatchLinger)
	defer linger.Stop()
	for len(batch) < contract.StartBatchMax && *carry < 0 {
		select {
		case i, ok := <-next:
			if !ok {
				return batch, false
			}
			if !add(i) {
				return batch, true
			}
		case <-linger.C:
			return batch, true
		}
	}
	return batch, true
}

// start starts one batch: CLOSED items from here, the rest through the worker, falling back
// to starting them from here when the batch fails for any reason but the command's end.
func (b *startBatches) start(ctx context.Context, batch []int) {
	in := contract.StartBatchInput{
		Principal: b.r.principal, Source: b.src.Name, SourceID: b.src.ID,
		BackstopSeconds: b.src.BackstopSeconds, PollSeconds: b.src.PollSeconds,
		Parallel: max(1, b.r.parallel/bulkBatchers), // r.parallel in flight in all
	}
	var sent []int
	for _, i := range batch {
		if prev, ok := b.existing[b.r.items[i].norm]; (ok && prev.State == mcpsync.StateClosed) || b.direct.Load() {
			b.results[i] = startOne(ctx, b.e, b.tc, b.src, b.r, b.r.items[i], b.existing)
			continue
		}
		sent = append(sent, i)
		in.Items = append(in.Items, contract.StartItem{URI: b.r.items[i].norm, ServerURI: b.r.items[i].raw})
	}
	if len(sent) == 0 {
		return
	}
	out, err := b.runBatch(ctx, in)
	if err != nil && ctx.Err() == nil {
		b.direct.Store(true)
		for _, i := range sent {
			b.results[i] = startOne(ctx, b.e, b.tc, b.src, b.r, b.r.items[i], b.existing)
		}
		return
	}
	for k, i := range sent {
		res := pendingResult(b.r, b.src.Name, b.r.items[i], b.existing)
		switch {
		case err != nil:
			res.startErr = err
		case out.Errors[k] != "":
			res.startErr = errors.New(out.Errors[k])
		}
		b.results[i] = res
	}
}

// runBatch runs one batch workflow to its answer, which must hold one entry per item.
func (b *startBatches) runBatch(ctx context.Context, in contract.StartBatchInput) (contract.StartBatchOutput, error) {
	run, err := b.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: "start-batch/" + b.src.Name + "/" + newID(), TaskQueue: contract.TaskQueue,
		WorkflowExecutionTimeout: startBatchTimeout,
	}, startBatchWorkflow, in)
	if err != nil {
		return contract.StartBatchOutput{}, err
	}
	var out contract.StartBatchOutput
	if err := run.Get(ctx, &out); err != nil {
		return contract.StartBatchOutput{}, err
	}
	if len(out.Errors) != len(in.Items) {
		return contract.StartBatchOutput{}, errors.New("start batch answered a different number of items")
	}
	return out, nil
}
