package cli_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	enums "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflow/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/cli"
)

// runningRun is a Temporal client (a unit-test fake) whose one run stays RUNNING until ends
// (zero: never), and whose result wait ends at once with the error a server gives when it
// ends a long poll near its deadline: what subscribe's wait must not take for the run's end.
type runningRun struct {
	client.Client
	ends      time.Time
	describes atomic.Int32
}

func (c *runningRun) DescribeWorkflowExecution(ctx context.Context, id, runID string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	c.describes.Add(1)
	status := enums.WORKFLOW_EXECUTION_STATUS_RUNNING
	if !c.ends.IsZero() && time.Now().After(c.ends) {
		status = enums.WORKFLOW_EXECUTION_STATUS_COMPLETED
	}
	return &workflowservice.DescribeWorkflowExecutionResponse{WorkflowExecutionInfo: &workflow.WorkflowExecutionInfo{Status: status}}, nil
}

func (c *runningRun) GetWorkflow(ctx context.Context, id, runID string) client.WorkflowRun {
	return earlyPoll{}
}

type earlyPoll struct{ client.WorkflowRun }

func (earlyPoll) Get(ctx context.Context, _ any) error {
	time.Sleep(10 * time.Millisecond)
	return serviceerror.NewDeadlineExceeded("context deadline exceeded")
}

// The wait for the run that closed a subscription ends when the run has ended — as Temporal
// says when asked, not when the wait for its result returns an error of the server's own — and
// says so when the run is still going at the timeout.
func TestAwaitEndedRunAsksTheRun(t *testing.T) {
	c := &runningRun{}
	err := cli.AwaitEndedRun(t.Context(), c, "sub/x", 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "is still finishing after 300ms") {
		t.Errorf("a run still RUNNING at the timeout: %v; want the still-finishing error", err)
	}
	c = &runningRun{ends: time.Now().Add(150 * time.Millisecond)}
	if err := cli.AwaitEndedRun(t.Context(), c, "sub/x", 5*time.Second); err != nil {
		t.Errorf("a run that ends during the wait: %v; want nil", err)
	}
	if n := c.describes.Load(); n < 2 {
		t.Errorf("the run's status asked %d times; want it asked again after the first answer", n)
	}
}
