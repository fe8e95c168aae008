package mcphost

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/mcpsync/mcpsync/internal/tracing"
)

// traceNotification starts the span of one routed notification (issue 17 part 3), from when
// it arrived on this host (the latest arrival, for merged copies) until its signals are sent.
// The Temporal client's tracing interceptor carries it through each signal's headers into the
// subscription workflow, so the read and acceptance it causes join the same trace. With
// tracing off the span is a no-op.
func (c *Conn) traceNotification(ctx context.Context, n notification) (context.Context, trace.Span) {
	if !tracing.Enabled() {
		return ctx, tracing.NoopSpan()
	}
	return tracing.Tracer().Start(ctx, tracing.SpanNotification,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithTimestamp(n.receivedAt),
		trace.WithAttributes(
			tracing.AttrSource.Int64(c.source.ID), tracing.AttrGeneration.Int64(c.gen),
			tracing.AttrSeq.Int64(n.seq), tracing.AttrPulses.Int(n.pulses), tracing.URI(n.serverURI),
		))
}
