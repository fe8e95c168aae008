package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/launch"
)

// StartBatch starts the subscription workflows of a bulk subscribe's batch from the worker's
// own Temporal client, so that every start is eager (launch.SubscriptionEager; issue 16 item 4).
type StartBatch struct {
	// Client is the client the worker polling contract.TaskQueue was built with: eager starts
	// go to a worker of the same client.
	Client client.Client
	// Namespace the workflows are started in.
	Namespace string
}

// Register registers the activity under contract.ActStartSubscriptions.
func (a *StartBatch) Register(r Registry) {
	r.RegisterActivityWithOptions(a.StartSubscriptions, activity.RegisterOptions{Name: contract.ActStartSubscriptions})
}

// StartSubscriptions starts every item of in, in.Parallel at once, and answers item by item.
// A start that failed is its item's error, not the activity's: the others stand, and starting
// again is safe (conflict policy USE_EXISTING). The activity fails (and is retried) only when
// its context ends first; a malformed batch is a non-retryable error.
func (a *StartBatch) StartSubscriptions(ctx context.Context, in contract.StartBatchInput) (contract.StartBatchOutput, error) {
	if in.Principal == "" || in.Source == "" || len(in.Items) == 0 || len(in.Items) > contract.StartBatchMax {
		return contract.StartBatchOutput{}, temporal.NewNonRetryableApplicationError(
			fmt.Sprintf("start batch: a principal, a source and 1 to %d items are required, got %d items", contract.StartBatchMax, len(in.Items)),
			contract.ErrTypePermanent, nil)
	}
	out := contract.StartBatchOutput{Errors: make([]string, len(in.Items))}
	var next atomic.Int64 // the next item to start
	var wg sync.WaitGroup
	for range max(1, min(in.Parallel, len(in.Items))) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(in.Items) && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				sub := in.Subscription(i)
				wfID := contract.SubscriptionWorkflowID(sub.Principal, sub.Source, sub.URI)
				if _, err := launch.SubscriptionEager(ctx, a.Client, a.Namespace, wfID, sub); err != nil {
					out.Errors[i] = "starting subscription workflow " + wfID + ": " + err.Error()
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return contract.StartBatchOutput{}, errors.Join(errors.New("start batch: ended before every start was answered"), err)
	}
	return out, nil
}
