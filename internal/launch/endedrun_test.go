package launch_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/launch"
)

// fakeRun is a Temporal client (a unit-test fake) with one run of one workflow, RUNNING until
// ends (zero: never; missing: no run at all), whose result wait ends at once with the error a
// server gives when it ends a long poll near its deadline.
type fakeRun struct {
	client.Client
	missing   bool
	ends      time.Time
	describes atomic.Int32
}

func (c *fakeRun) DescribeWorkflowExecution(ctx context.Context, id, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	c.describes.Add(1)
	if c.missing {
		return nil, serviceerror.NewNotFound("workflow not found")
	}
	status := enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	if !c.ends.IsZero() && time.Now().After(c.ends) {
		status = enums.WORKFLOW_EXECUTION_STATUS_COMPLETED
	}
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: &workflow.WorkflowExecutionInfo{Status: status}}, nil
}

func (c *fakeRun) GetWorkflow(ctx context.Context, id, runID string) client.WorkflowRun {
	return earlyPoll{}
}

type earlyPoll struct{ client.WorkflowRun }

func (earlyPoll) Get(ctx context.Context, _ any) error {
	time.Sleep(10 * time.Millisecond)
	return serviceerror.NewDeadlineExceeded("context deadline exceeded")
}

// AwaitEndedRun answers what Temporal says of the run's status — not that it ended when the
// wait for its result returns an error of the server's own: still running at the timeout, ended
// during the wait, or no run at all.
func TestAwaitEndedRunAsksTheRun(t *testing.T) {
	for _, tt := range []struct {
		name    string
		c       *fakeRun
		timeout time.Duration
		want    error
	}{
		{"still running at the timeout", &fakeRun{}, 300 * time.Millisecond, launch.ErrStillRunning},
		{"ends during the wait", &fakeRun{ends: time.Now().Add(150 * time.Millisecond)}, 5 * time.Second, nil},
		{"no run", &fakeRun{missing: true}, time.Second, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if err := launch.AwaitEndedRun(t.Context(), tt.c, "sub/x", tt.timeout); !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Errorf("AwaitEndedRun: %v; want %v", err, tt.want)
			}
		})
	}
}
