-- See migrations/sqlite/0011_trace_context.sql. Nullable without a default: no rewrite.
ALTER TABLE tasks ADD COLUMN traceparent TEXT, ADD COLUMN tracestate TEXT;
