-- 0023_dedupe_windows: why: a dedupe key held only while its job was live, so "at most once
-- an hour" or "once after the last of these edits" could not be said. An enqueue may now
-- give a window (a job with the key enqueued or finished within it, whatever its status,
-- makes the new one a duplicate), which looks up finished jobs by their key.
CREATE INDEX jobs_dedupe_any_idx ON shardworker.jobs (dedupe_key, created_at) WHERE dedupe_key IS NOT NULL;
