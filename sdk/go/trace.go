package asyncd

import "context"

// W3C Trace Context headers: sent at submit when the ctx carries a trace, received on
// every executor call of a task submitted with one.
const (
	TraceParentHeader = "traceparent"
	TraceStateHeader  = "tracestate"
)

type traceKey struct{}

type traceContext struct{ parent, state string }

// ContextWithTraceParent returns a ctx whose submits carry this W3C traceparent (and
// tracestate, which may be empty): asyncd stores it with the task and passes the trace
// on to every executor call. With OpenTelemetry, pass the current span's context
// formatted by its propagator. asyncd ignores a malformed traceparent.
func ContextWithTraceParent(ctx context.Context, traceparent, tracestate string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return context.WithValue(ctx, traceKey{}, traceContext{traceparent, tracestate})
}

// TraceParent returns the W3C traceparent and tracestate ctx carries: in an executor
// handler, those of the call (the submitter's trace, under the attempt's span when
// asyncd exports spans); empty when there are none. A handler that submits with its
// ctx continues the same trace.
func TraceParent(ctx context.Context) (traceparent, tracestate string) {
	t, _ := ctx.Value(traceKey{}).(traceContext)
	return t.parent, t.state
}
