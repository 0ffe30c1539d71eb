-- 0003_apply_and_claim_tracking: why: the flusher must tell a replay (this attempt's outcome was
-- applied before) from a stale outcome (its attempt was rescued) even while the job is
-- queued again at the same attempt number; the row now records which attempt's outcome
-- was last applied.
ALTER TABLE shardworker.jobs ADD COLUMN applied_attempt int;

-- And which claim statement took the current attempt, so a claim whose reply was lost
-- (the connection broke after the server committed it) can be given back.
ALTER TABLE shardworker.jobs ADD COLUMN claim_token text;
