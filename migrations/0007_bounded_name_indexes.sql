-- 0007_bounded_name_indexes: why: the partial indexes of failed and cancelled jobs held
-- (queue, kind) whole, and a btree entry holds at most 2,704 bytes: a job whose queue and
-- kind together were longer (enqueued before shardworker.limits, or by raw SQL) could be
-- claimed and run, but its failure, its cancellation, its rescue and its orphan requeue
-- could never be written, so it stayed running and wedged the flusher. These indexes hold
-- at most 255 characters of each name (2,056 bytes at worst), so no row can overflow them;
-- names within the enqueue limit (255 bytes) are indexed whole, and the queries that count
-- or find failed and cancelled jobs match on the same expressions.
CREATE INDEX jobs_failed_bounded_idx ON shardworker.jobs (left(queue, 255), left(kind, 255))
    WHERE status = 'failed';
CREATE INDEX jobs_cancelled_bounded_idx ON shardworker.jobs (left(queue, 255), left(kind, 255))
    WHERE status = 'cancelled';
DROP INDEX shardworker.jobs_failed_idx;
DROP INDEX shardworker.jobs_cancelled_idx;
