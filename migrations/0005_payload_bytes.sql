-- 0005_payload_bytes: why: a claim is bounded in payload bytes as well as in jobs, so a
-- worker's memory does not grow with the size of its jobs. Enqueue records each payload's
-- size as it was sent; measuring it at claim time would read every candidate's payload.
-- Rows enqueued before this migration have NULL and are measured by their stored size.
ALTER TABLE shardworker.jobs ADD COLUMN payload_bytes int;
