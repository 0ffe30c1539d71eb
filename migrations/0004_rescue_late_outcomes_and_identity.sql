-- 0004_rescue_late_outcomes_and_identity: why: a rescued job remembers the attempt it was
-- rescued from, so that attempt's outcome, fsync'd on a host that was stopped or cut off
-- and applied late, lands instead of the job running again (until it is claimed anew);
-- and the database gets an identity that an outbox directory is bound to, so outcomes are
-- never applied to (and thrown away by) some other database.
ALTER TABLE shardworker.jobs ADD COLUMN rescued_attempt int;

CREATE TABLE shardworker.instance (
    id          uuid        PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now(),
    only_row    boolean     NOT NULL DEFAULT true UNIQUE CHECK (only_row)
);
-- md5 of randomness as a uuid: gen_random_uuid() needs PostgreSQL 13.
INSERT INTO shardworker.instance (id) VALUES (md5(random()::text || clock_timestamp()::text)::uuid);
