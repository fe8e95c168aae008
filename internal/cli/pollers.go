package cli

import (
	"context"
	"fmt"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// pollerFreshness is how recently a poller must have polled to count as a running worker. A
// worker's pollers re-poll at least once per long-poll interval (about a minute); the server
// remembers a poller for five minutes after it stopped (matching.PollerHistoryTTL), so an
// older entry is a worker that is gone.
const pollerFreshness = 2 * time.Minute

// taskQueueDescriber is the part of the Temporal client requireWorker uses.
type taskQueueDescriber interface {
	DescribeTaskQueue(ctx context.Context, taskQueue string, queueType enums.TaskQueueType) (*workflowservice.DescribeTaskQueueResponse, error)
}

// requireWorker fails (exit 1) with "no worker is polling task queue Q" unless some worker
// polled the workflow task queue of mcpsync (contract.TaskQueue) within pollerFreshness: a
// command that waits for a workflow would otherwise wait its whole timeout for nothing
// (issue 14, item 7).
func requireWorker(ctx context.Context, tc taskQueueDescriber, now time.Time) error {
	resp, err := tc.DescribeTaskQueue(ctx, contract.TaskQueue, enums.TASK_QUEUE_TYPE_WORKFLOW)
	if err != nil {
		return fmt.Errorf("describing task queue %s: %w", contract.TaskQueue, err)
	}
	for _, p := range resp.GetPollers() {
		if t := p.GetLastAccessTime(); t != nil && now.Sub(t.AsTime()) <= pollerFreshness {
			return nil
		}
	}
	return fmt.Errorf("no worker is polling task queue %s; start mcpsync-worker (make run) and try again", contract.TaskQueue)
}

// workerGrace is how long awaitWorker gives a worker that is starting (its first poll can
// follow its start by a few seconds) before a command gives up.
const workerGrace = 5 * time.Second

// awaitWorker is requireWorker retried for workerGrace (or until ctx ends): a worker started
// just before the command counts, and a missing one still fails within seconds.
func awaitWorker(ctx context.Context, tc taskQueueDescriber) error {
	deadline := time.Now().Add(workerGrace)
	for {
		err := requireWorker(ctx, tc, time.Now())
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(250 * time.Millisecond):
		}
	}
}
