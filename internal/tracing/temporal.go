package tracing

import (
	"fmt"

	"go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
	"go.temporal.io/sdk/workflow"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// spanKey is the workflow-context key under which the Temporal tracing interceptor keeps its
// current span; the signal link reads and sets it.
type spanKey struct{}

// TemporalInterceptors returns the interceptors that trace Temporal calls when tracing is on
// (nil when it is off), in order: the Temporal SDK's OpenTelemetry interceptor (client spans
// for signals and starts with the trace context in the Temporal headers; workflow, signal and
// activity spans on workers; replay never records spans, so workflows stay deterministic),
// then the signal link (see below). Put them on the client whose signals should carry the
// trace (the session host's) and on every worker, in this order.
//
// The signal link ties a workflow's read to the notification that caused it: the SDK
// interceptor parents the spans of activities a workflow starts on the workflow's run, not on
// the signal being handled (its channel hides which signal led to which call). The link
// remembers the span of the last resource-updated signal or update handled (not during replay) and
// makes it the parent of the next read: the ordinal allocation, the MCP read and its
// acceptance (or not-found record), so one update is one trace. A read with no signal since
// the previous one (the initial read, a backstop revalidation) stays under the run's span. The
// link only changes span parents and trace headers, never a command, so histories and
// replays are unchanged.
func TemporalInterceptors() ([]interceptor.Interceptor, error) {
	if !Enabled() {
		return nil, nil
	}
	otelIc, err := opentelemetry.NewTracingInterceptor(opentelemetry.TracerOptions{
		Tracer:         Tracer(),
		SpanContextKey: spanKey{},
	})
	if err != nil {
		return nil, fmt.Errorf("temporal tracing interceptor: %w", err)
	}
	return []interceptor.Interceptor{otelIc, &signalLink{}}, nil
}

// readStart is the activity that begins a read on the regular path; readSteps are the
// activities of one read. The fast path (contract.ActLocalRead, issue 16 item 2) begins a read
// too; an allocation right after it is the same read's regular path.
const readStart = contract.ActAllocateReadOrdinal

var readSteps = map[string]bool{
	contract.ActLocalRead:             true,
	contract.ActAllocateReadOrdinal:   true,
	contract.ActMCPRead:               true,
	contract.ActAcceptResourceVersion: true,
	contract.ActRecordNotFound:        true,
}

// signalLink parents a read's activity spans on the signal that caused the read (see
// TemporalInterceptors).
type signalLink struct {
	interceptor.InterceptorBase
}

// InterceptWorkflow gives each workflow execution its own link state.
func (l *signalLink) InterceptWorkflow(_ workflow.Context, next interceptor.WorkflowInboundInterceptor) interceptor.WorkflowInboundInterceptor {
	return &linkInbound{WorkflowInboundInterceptorBase: interceptor.WorkflowInboundInterceptorBase{Next: next}}
}

type linkInbound struct {
	interceptor.WorkflowInboundInterceptorBase
	// pending is the span of the last resource-updated signal not yet taken by a read;
	// current is the span the read in progress was taken from (nil: the run's span).
	pending, current any
	// afterLocalRead: the last read step was the fast path's local activity.
	afterLocalRead bool
}

func (i *linkInbound) Init(outbound interceptor.WorkflowOutboundInterceptor) error {
	return i.Next.Init(&linkOutbound{WorkflowOutboundInterceptorBase: interceptor.WorkflowOutboundInterceptorBase{Next: outbound}, in: i})
}

// HandleSignal runs inside the SDK interceptor's HandleSignal span, which ctx carries.
func (i *linkInbound) HandleSignal(ctx workflow.Context, in *interceptor.HandleSignalInput) error {
	if in.SignalName == contract.SignalResourceUpdated && !workflow.IsReplaying(ctx) {
		if s := ctx.Value(spanKey{}); s != nil {
			i.pending = s
		}
	}
	return i.Next.HandleSignal(ctx, in)
}

// ExecuteUpdate runs inside the SDK interceptor's HandleUpdate span, which ctx carries: a
// notification delivered as a workflow update links its read as its signal would.
func (i *linkInbound) ExecuteUpdate(ctx workflow.Context, in *interceptor.UpdateInput) (any, error) {
	if in.Name == contract.UpdateResourceUpdated && !workflow.IsReplaying(ctx) {
		if s := ctx.Value(spanKey{}); s != nil {
			i.pending = s
		}
	}
	return i.Next.ExecuteUpdate(ctx, in)
}

// parent returns ctx with the span a read step's span should hang from.
func (i *linkInbound) parent(ctx workflow.Context, activityType string) workflow.Context {
	if activityType == contract.ActLocalRead || activityType == readStart && !i.afterLocalRead {
		i.current, i.pending = i.pending, nil
	}
	if readSteps[activityType] {
		i.afterLocalRead = activityType == contract.ActLocalRead
	}
	if !readSteps[activityType] || i.current == nil {
		return ctx
	}
	return workflow.WithValue(ctx, spanKey{}, i.current)
}

type linkOutbound struct {
	interceptor.WorkflowOutboundInterceptorBase
	in *linkInbound
}

func (o *linkOutbound) ExecuteActivity(ctx workflow.Context, activityType string, args ...any) workflow.Future {
	return o.Next.ExecuteActivity(o.in.parent(ctx, activityType), activityType, args...)
}

func (o *linkOutbound) ExecuteLocalActivity(ctx workflow.Context, activityType string, args ...any) workflow.Future {
	return o.Next.ExecuteLocalActivity(o.in.parent(ctx, activityType), activityType, args...)
}
