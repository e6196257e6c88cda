-- See migrations/sqlite/0011_trace_context.sql. Instant on InnoDB (nullable columns
-- added last).
ALTER TABLE tasks ADD COLUMN traceparent VARCHAR(55) CHARACTER SET ascii NULL,
                  ADD COLUMN tracestate VARCHAR(512) CHARACTER SET ascii NULL;
