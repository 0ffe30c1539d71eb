-- 0018_input_sizes: why: a claim brings a retried job the steps its earlier attempts recorded,
-- and a job that waited on others their results. Their size must be known before they are
-- gathered (one jsonb value holds at most 256 MB, and a run may be given at most
-- shardworker.limits.MAX_JOB_INPUT_BYTES), and known as the JSON text a worker receives:
-- PostgreSQL stores a repetitive 55 MB result in a few kB.

-- A step's result's size as JSON text, as the child recorded it (NULL: a row from before this
-- migration; steps_bytes measures its text then).
ALTER TABLE shardworker.job_steps ADD COLUMN result_bytes bigint;

-- What a job's recorded steps weigh as the JSON object a claim brings: each result and name.
CREATE FUNCTION shardworker.steps_bytes(job bigint) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(coalesce(s.result_bytes, octet_length(s.result::text)) + octet_length(s.name) + 6), 0)
    FROM shardworker.job_steps s WHERE s.job_id = job
$$;

-- What a claim brings, as JSON text, gathered as text: a jsonb object would stop at 256 MB (and
-- fail the whole claim), text at 1 GB, and the claim gathers only what is within
-- MAX_JOB_INPUT_BYTES (far less). A retried job's recorded steps by name; a job's
-- dependencies' results by id (a deleted one is left out). NULL when there are none.
CREATE FUNCTION shardworker.steps_json(job bigint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT '{' || string_agg(to_json(s.name)::text || ': ' || s.result::text, ', ' ORDER BY s.name) || '}'
    FROM shardworker.job_steps s WHERE s.job_id = job
$$;

CREATE FUNCTION shardworker.dependencies_json(job bigint) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT '{"' || string_agg(d.depends_on::text || '": ' || coalesce(r.result::text, 'null'), ', "'
                              ORDER BY d.depends_on) || '}'
    FROM shardworker.job_dependencies d JOIN shardworker.jobs r ON r.id = d.depends_on
    WHERE d.job_id = job
$$;

-- deps_bytes counted results as stored (compressed) until now: count them again as text for
-- the jobs that may still be claimed.
UPDATE shardworker.jobs w
SET deps_bytes = coalesce((SELECT sum(octet_length(t.result::text))
                           FROM shardworker.job_dependencies d JOIN shardworker.jobs t ON t.id = d.depends_on
                           WHERE d.job_id = w.id AND t.status = 'done'), 0)
WHERE w.deps_total > 0 AND w.status IN ('waiting', 'queued');
