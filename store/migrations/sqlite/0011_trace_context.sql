-- The W3C trace context a task was submitted with (docs/design.md, "Tracing"):
-- `traceparent` as version 00 (55 characters, validated by the API), `tracestate` as
-- given, at most 512 bytes. Read only when the task is claimed, so no index.
ALTER TABLE tasks ADD COLUMN traceparent TEXT;
ALTER TABLE tasks ADD COLUMN tracestate TEXT;
