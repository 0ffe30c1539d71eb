-- 0011_snoozes: why: one max_attempts. A snooze (a handler's Snooze, or a run a neighbour's
-- death cut short) used to add one to max_attempts so that it used no attempt, and a row read
-- "2/26" where its handler said 25. Now max_attempts stays what the enqueuer or the handler
-- set, and snoozes counts the runs that used none: attempts used = attempt - snoozes, and a
-- failed attempt is retried while that is below max_attempts. attempt still counts every run
-- (each run has an attempt of its own, which fences its outcome).
ALTER TABLE shardworker.jobs ADD COLUMN snoozes int NOT NULL DEFAULT 0;
