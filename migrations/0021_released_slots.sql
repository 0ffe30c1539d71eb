-- 0021_released_slots: why: a worker killed while it held slots of a kind or queue limited
-- across workers (global_concurrency, a queue's concurrency) kept them until its jobs were
-- rescued, an hour later by default: its peers ran below the limit meanwhile, and nothing
-- said why. Each worker's heartbeat row now also says after how much silence its peers stop
-- counting its running jobs toward those limits (its --release-slots-after); the jobs
-- themselves stay its own until the rescue (a late outcome still lands, nothing runs them
-- again). Peers release only silence they watched while they beat themselves, as the rescue
-- does, so an outage that silenced everyone releases nobody's slots when it ends.
ALTER TABLE shardworker.workers ADD COLUMN slots_after_s float8;
