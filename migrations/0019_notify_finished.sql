-- 0019_notify_finished: why: five statements that end jobs (apply, cancel, delete, and the two
-- that settle waiting jobs) each announced the ids they ended on the channel
-- shardworker_finished (shardworker.jobs.wait_for listens) with the same chunking: written once.

-- Announce the ids of jobs that just ended, 300 to a notification (well under the 8,000-byte
-- payload limit); sent at commit. Returns how many notifications it queued.
CREATE FUNCTION shardworker.notify_finished(ids bigint[]) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT count(*) FROM (
        SELECT pg_notify('shardworker_finished', string_agg(id::text, ','))
        FROM (SELECT id, (row_number() OVER ()) / 300 AS chunk FROM unnest(ids) AS id) numbered
        GROUP BY chunk) sent
$$;
