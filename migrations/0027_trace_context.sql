-- 0027_trace_context: why: a job carries the trace it was enqueued in (OpenTelemetry), so that
-- the runs of its attempts continue that trace, and a retry links to the runs before it. NULL
-- (nothing to write, nothing to read) whenever the enqueuing process traces nothing.
--   {"carrier": {"traceparent": ..., "tracestate": ...}}: the enqueue's context, as the
--   application's propagator wrote it (shardworker.core.tracing.carrier);
--   "runs": ["00-<trace id>-<span id>-<flags>", ...]: the run spans of the attempts that ended
--   to run again (a retry, a snooze, a wait), newest last, at most 32.
ALTER TABLE shardworker.jobs ADD COLUMN trace jsonb;
