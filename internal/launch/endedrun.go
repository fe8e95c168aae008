package launch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"
)

// ErrStillRunning is AwaitEndedRun's answer when the run is still running at its timeout.
var ErrStillRunning = errors.New("launch: the run is still running")

// AwaitEndedRun waits up to timeout for the running run of workflow wfID, if any, to end — the
// run that closed a subscription's previous generation, which a start now would join instead
// of opening the next one. It returns nil once no run of wfID is running (at once when none
// was), ErrStillRunning when one still is at the timeout, ctx's error when ctx ends first, or
// the error of asking Temporal. Whether the run ended is always what Temporal says of its
// status: the wait for its result also returns when the server ends that long poll early
// (near the deadline, under load) with an error of its own.
func AwaitEndedRun(ctx context.Context, tc client.Client, wfID string, timeout time.Duration) error {
	running, runID, err := isRunning(ctx, tc, wfID, "")
	if err != nil || !running {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for wctx.Err() == nil {
		// Its outcome belongs to the closed generation; only its end matters here.
		_ = tc.GetWorkflow(wctx, wfID, runID).Get(wctx, nil)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if running, _, err = isRunning(ctx, tc, wfID, runID); err != nil || !running {
			return err
		}
		select {
		case <-wctx.Done():
		case <-time.After(25 * time.Millisecond):
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return ErrStillRunning
}

// isRunning reports whether run runID of wfID ("": its latest run) is running, and its run ID.
func isRunning(ctx context.Context, tc client.Client, wfID, runID string) (bool, string, error) {
	desc, err := tc.DescribeWorkflowExecution(ctx, wfID, runID)
	var nf *serviceerror.NotFound
	switch {
	case errors.As(err, &nf):
		return false, "", nil
	case err != nil:
		return false, "", fmt.Errorf("describing workflow %s: %w", wfID, err)
	}
	info := desc.GetWorkflowExecutionInfo()
	return info.GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_RUNNING, info.GetExecution().GetRunId(), nil
}
