-- 0014_lost_attempts: why: an attempt that never reached an outcome (its worker restarted,
-- was rescued, or lost the outcome to a quarantined outbox segment) is a failed attempt
-- too, and belongs in the job's errors history beside those the apply records. One function
-- builds an entry and keeps the last `kept` (shardworker.limits.ERRORS_KEPT), as
-- job_apply_outcomes does inline.
CREATE FUNCTION shardworker.errors_with(jsonb, int, text, text, timestamptz, int) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT jsonb_agg(e ORDER BY n)
    FROM jsonb_array_elements($1 || jsonb_build_array(jsonb_build_object(
             'attempt', $2, 'error', $3, 'traceback', $4,
             'at', to_char($5 AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'))))
         WITH ORDINALITY AS x(e, n)
    WHERE n > jsonb_array_length($1) + 1 - $6
$$;
