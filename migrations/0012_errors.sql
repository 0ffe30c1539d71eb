-- 0012_errors: why: every failure visible. last_error keeps only the last failure; errors
-- keeps the last 20 failed attempts (shardworker.limits.ERRORS_KEPT), oldest first, each
-- {"attempt": n, "at": "ISO 8601 UTC", "error": "message", "traceback": "text" or null}.
-- It is written by the fenced apply that writes last_error (job_apply_outcomes), so a
-- replayed or stale outcome adds nothing. A constant default: no table rewrite.
ALTER TABLE shardworker.jobs ADD COLUMN errors jsonb NOT NULL DEFAULT '[]';
