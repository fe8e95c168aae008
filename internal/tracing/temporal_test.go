package tracing_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
	"github.com/mcpsync/mcpsync/internal/tracing"
)

// readTwice runs the read path twice: once before any notification (an initial read), then
// once after a resource-updated signal or workflow update, as the subscription workflow does.
func readTwice(ctx workflow.Context) error {
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{StartToCloseTimeout: time.Minute})
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute})
	read := func() error {
		if err := workflow.ExecuteLocalActivity(lctx, contract.ActAllocateReadOrdinal).Get(ctx, nil); err != nil {
			return err
		}
		if err := workflow.ExecuteActivity(actx, contract.ActMCPRead).Get(ctx, nil); err != nil {
			return err
		}
		return workflow.ExecuteLocalActivity(lctx, contract.ActAcceptResourceVersion).Get(ctx, nil)
	}
	if err := read(); err != nil {
		return err
	}
	updates := workflow.NewBufferedChannel(ctx, 1)
	if err := workflow.SetUpdateHandler(ctx, contract.UpdateResourceUpdated, func(ctx workflow.Context, u contract.ResourceUpdated) error {
		updates.Send(ctx, u)
		return nil
	}); err != nil {
		return err
	}
	var u contract.ResourceUpdated
	sel := workflow.NewSelector(ctx)
	sel.AddReceive(workflow.GetSignalChannel(ctx, contract.SignalResourceUpdated), func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, &u) })
	sel.AddReceive(updates, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, &u) })
	sel.Select(ctx)
	return read()
}

func noop(context.Context) error { return nil }

// The signal link parents the activities of a read that follows a resource-updated signal or
// workflow update on that signal's or update's span (so they join the notification's trace),
// and leaves a read with no notification before it under the workflow run's span.
func TestSignalLinkParentsReadOnSignal(t *testing.T) {
	tests := []struct {
		name, handled string
		send          func(env *testsuite.TestWorkflowEnvironment)
	}{
		{"signal", "HandleSignal:" + contract.SignalResourceUpdated, func(env *testsuite.TestWorkflowEnvironment) {
			env.SignalWorkflow(contract.SignalResourceUpdated, contract.ResourceUpdated{Seq: 1})
		}},
		{"update", "HandleUpdate:" + contract.UpdateResourceUpdated, func(env *testsuite.TestWorkflowEnvironment) {
			env.UpdateWorkflow(contract.UpdateResourceUpdated, "u1", &testsuite.TestUpdateCallback{
				OnReject: func(error) {}, OnAccept: func() {}, OnComplete: func(any, error) {}}, contract.ResourceUpdated{Seq: 1})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { testSignalLink(t, tt.handled, tt.send) })
	}
}

func testSignalLink(t *testing.T, handled string, send func(env *testsuite.TestWorkflowEnvironment)) {
	tp, exp := tracing.NewInMemory()
	defer tracing.Install(tp)()
	ics, err := tracing.TemporalInterceptors()
	if err != nil {
		t.Fatal(err)
	}
	var wics []interceptor.WorkerInterceptor
	for _, ic := range ics {
		wics = append(wics, ic)
	}
	var s testsuite.WorkflowTestSuite
	env := s.NewTestWorkflowEnvironment()
	env.SetWorkerOptions(worker.Options{Interceptors: wics})
	env.RegisterWorkflowWithOptions(readTwice, workflow.RegisterOptions{Name: "readTwice"})
	for _, name := range []string{contract.ActAllocateReadOrdinal, contract.ActMCPRead, contract.ActAcceptResourceVersion} {
		env.RegisterActivityWithOptions(noop, activity.RegisterOptions{Name: name})
	}
	env.RegisterDelayedCallback(func() { send(env) }, time.Second)
	env.ExecuteWorkflow("readTwice")
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}

	spans := exp.GetSpans()
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		byID[s.SpanContext.SpanID().String()] = s
	}
	parentName := func(s tracetest.SpanStub) string {
		if p, ok := byID[s.Parent.SpanID().String()]; ok {
			return p.Name
		}
		return "<none>"
	}
	var got []string
	for _, s := range spans {
		if len(s.Name) > len("StartActivity:") && s.Name[:len("StartActivity:")] == "StartActivity:" {
			got = append(got, s.Name+" <- "+parentName(s))
		}
	}
	want := []string{
		"StartActivity:" + contract.ActAllocateReadOrdinal + " <- RunWorkflow:readTwice",
		"StartActivity:" + contract.ActMCPRead + " <- RunWorkflow:readTwice",
		"StartActivity:" + contract.ActAcceptResourceVersion + " <- RunWorkflow:readTwice",
		"StartActivity:" + contract.ActAllocateReadOrdinal + " <- " + handled,
		"StartActivity:" + contract.ActMCPRead + " <- " + handled,
		"StartActivity:" + contract.ActAcceptResourceVersion + " <- " + handled,
	}
	if len(got) != len(want) {
		t.Fatalf("start-activity spans:\n%v\nwant:\n%v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("span %d: %s, want %s", i, got[i], want[i])
		}
	}
}
