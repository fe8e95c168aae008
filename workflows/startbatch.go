package workflows

import (
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// StartBatchWorkflow starts a bulk subscribe's batch of subscription workflows through one
// ActStartSubscriptions activity on contract.TaskQueue, so that the starts come from a
// worker's client and are eager (issue 16 item 4), and returns its answer item by item. It
// changes no subscription's state: each started workflow makes its own transitions. The
// activity is retried until the workflow's own timeout (set by the starter,
// contract.StartBatchTimeout), a malformed batch not at all.
func StartBatchWorkflow(ctx workflow.Context, in contract.StartBatchInput) (contract.StartBatchOutput, error) {
	ctx = workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:           contract.TaskQueue,
		StartToCloseTimeout: contract.StartBatchTimeout / 2,
		RetryPolicy: &temporal.RetryPolicy{
			InitialInterval: time.Second, MaximumInterval: 5 * time.Second,
			NonRetryableErrorTypes: []string{contract.ErrTypePermanent},
		},
	})
	var out contract.StartBatchOutput
	if err := workflow.ExecuteActivity(ctx, contract.ActStartSubscriptions, in).Get(ctx, &out); err != nil {
		return contract.StartBatchOutput{}, err
	}
	return out, nil
}
