package workflows_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/workflows"
)

// StartBatchWorkflow hands its batch to one ActStartSubscriptions activity and returns the
// activity's answer item by item; a failed attempt is retried, a permanent one (a malformed
// batch) fails the workflow at once.
func TestStartBatchWorkflow(t *testing.T) {
	in := contract.StartBatchInput{Principal: "p", Source: "s", SourceID: 7, Parallel: 4,
		Items: []contract.StartItem{{URI: "demo://a", ServerURI: "demo://a"}, {URI: "demo://b", ServerURI: "demo://B"}}}
	answer := contract.StartBatchOutput{Errors: []string{"", "starting subscription workflow x: refused"}}
	tests := []struct {
		name      string
		failures  []error // what the attempts before the last return
		last      error   // the last attempt's error (nil: answer)
		want      contract.StartBatchOutput
		wantErr   bool
		wantCalls int
	}{
		{name: "answered", want: answer, wantCalls: 1},
		{name: "retried after a failed attempt", failures: []error{errors.New("worker stopping")}, want: answer, wantCalls: 2},
		{name: "malformed batch: no retry", last: temporal.NewNonRetryableApplicationError("malformed", contract.ErrTypePermanent, nil), wantErr: true, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s testsuite.WorkflowTestSuite
			env := s.NewTestWorkflowEnvironment()
			calls := 0
			env.RegisterActivityWithOptions(func(_ context.Context, got contract.StartBatchInput) (contract.StartBatchOutput, error) {
				calls++
				if diff := cmp.Diff(in, got); diff != "" {
					t.Errorf("activity input (-want +got):\n%s", diff)
				}
				if calls <= len(tt.failures) {
					return contract.StartBatchOutput{}, tt.failures[calls-1]
				}
				if tt.last != nil {
					return contract.StartBatchOutput{}, tt.last
				}
				return answer, nil
			}, activity.RegisterOptions{Name: contract.ActStartSubscriptions})
			env.ExecuteWorkflow(workflows.StartBatchWorkflow, in)
			if !env.IsWorkflowCompleted() {
				t.Fatal("workflow did not complete")
			}
			err := env.GetWorkflowError()
			if (err != nil) != tt.wantErr {
				t.Fatalf("workflow error %v, want error %v", err, tt.wantErr)
			}
			if !tt.wantErr {
				var got contract.StartBatchOutput
				if err := env.GetWorkflowResult(&got); err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tt.want, got); diff != "" {
					t.Errorf("result (-want +got):\n%s", diff)
				}
			}
			if calls != tt.wantCalls {
				t.Errorf("activity ran %d times, want %d", calls, tt.wantCalls)
			}
		})
	}
}
