-- 0024_key_weights: why: keys take turns one job each; an operator may give a key a bigger
-- share of its queue (a paying tenant: `queues limit mail --weight acme=3`, three of its jobs
-- to each other key's one). Weights live with the queue's other settings.
ALTER TABLE shardworker.queues ADD COLUMN key_weights jsonb;

-- A key's weight in its queue (1 when none is set, and for jobs without a key); the claims
-- divide each key's nth job by it, and give its turn that many times the share.
CREATE FUNCTION shardworker.key_weight(queue text, key text) RETURNS int
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT (q.key_weights ->> key)::int FROM shardworker.queues q WHERE q.name = queue), 1)
$$;
