package activities_test

import (
	"errors"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"

	"github.com/mcpsync/mcpsync/activities"
	"github.com/mcpsync/mcpsync/internal/contract"
)

// A malformed batch (no principal, no source, no items, or more than contract.StartBatchMax)
// is refused before anything is started, with a non-retryable error (the starts from a
// worker's client are exercised end to end in internal/cli's TestBulkSubscribeStartsEagerly).
func TestStartSubscriptionsRefusesMalformedBatch(t *testing.T) {
	item := contract.StartItem{URI: "demo://a", ServerURI: "demo://a"}
	tooMany := make([]contract.StartItem, contract.StartBatchMax+1)
	for i := range tooMany {
		tooMany[i] = item
	}
	tests := []struct {
		name string
		in   contract.StartBatchInput
	}{
		{"no principal", contract.StartBatchInput{Source: "s", Items: []contract.StartItem{item}}},
		{"no source", contract.StartBatchInput{Principal: "p", Items: []contract.StartItem{item}}},
		{"no items", contract.StartBatchInput{Principal: "p", Source: "s"}},
		{"too many items", contract.StartBatchInput{Principal: "p", Source: "s", Items: tooMany}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s testsuite.WorkflowTestSuite
			env := s.NewTestActivityEnvironment()
			a := &activities.StartBatch{} // no client: nothing may be started
			a.Register(env)
			_, err := env.ExecuteActivity(contract.ActStartSubscriptions, tt.in)
			var app *temporal.ApplicationError
			if !errors.As(err, &app) || !app.NonRetryable() || app.Type() != contract.ErrTypePermanent || !strings.Contains(app.Error(), "start batch") {
				t.Errorf("error %v, want a non-retryable %s error naming the batch", err, contract.ErrTypePermanent)
			}
		})
	}
}
