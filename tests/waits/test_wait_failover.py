"""A wait's end and a database that comes back older, for real: a primary with a lagging
streaming replica (tests/replica.py). Jobs wait for their approval on the primary; the replica
stops replicating; the approvals are sent, the jobs run past their waits, record a step and fail
once (a retry due a little later); then the primary dies and the replica, which never saw the
approvals, is promoted. The events are gone with it, but the runs that passed the waits kept
their ends in the outbox: the worker applies them again, and every job ends done with no step
run twice and no job stuck at its wait."""

from __future__ import annotations

import collections
import os
import subprocess
import textwrap
from pathlib import Path

import psycopg

import shardworker
from tests import replica as replica_module
from tests.cli.test_project_dir import shardworker_script
from tests.helpers import STARTED, kill_worker_group, wait_for
from tests.replica import ReplicaSet

replica_set = replica_module.replica_set

APP = '''
    import os

    from shardworker import App, Job, Retry

    app = App()
    LEDGER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "ledger")


    def ledger(line: str) -> None:
        fd = os.open(os.path.join(LEDGER, f"runs-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    def step(job: Job, name: str) -> str:
        def work() -> str:
            ledger(f"step {job.id} {name}")
            return f"{name}-{job.id}"
        return job.step(name, work)


    @app.handler("refund")
    def refund(job: Job) -> dict:
        ledger(f"run {job.id} {job.attempt}")
        step(job, "ask")
        decision = job.wait_event("approval", f"refund:{job.id}")
        step(job, "pay")
        if job.attempt - job.snoozes == 1:
            raise Retry("the bank said later", delay_s=8)
        return {"decision": decision}
'''


def _project(parent: Path) -> Path:
    root = parent / "bank"
    (root / "bank").mkdir(parents=True)
    (root / "var" / "ledger").mkdir(parents=True)
    (root / "bank" / "__init__.py").write_text("")
    (root / "bank" / "tasks.py").write_text(textwrap.dedent(APP).lstrip())
    return root


def _start(project: Path, dsn: str) -> subprocess.Popen[bytes]:
    log = open(project / "var" / "w1.log", "ab")  # noqa: SIM115 (kept for the worker's life)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}
    proc = subprocess.Popen([*shardworker_script(), "run", "--app", "bank.tasks", "--procs", "2",
                             "--outbox-dir", "var/w1-outbox", "--worker-id", "w1", "--dsn", dsn, "--backoff-cap", "1"],
                            cwd=project, env=env, stdout=log, stderr=log, start_new_session=True)
    STARTED.append(proc)
    return proc


def _statuses(rs: ReplicaSet, which: str = "primary") -> collections.Counter[str]:
    return collections.Counter({s: int(n) for s, n in rs.execute(
        which, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status")})


def test_waits_passed_on_a_primary_that_dies_are_not_waited_again(replica_set: ReplicaSet, tmp_path: Path) -> None:
    rs, project = replica_set, _project(tmp_path)
    ids = shardworker.enqueue_many(rs.dsn, [shardworker.JobSpec("refund") for _ in range(20)])
    worker = _start(project, rs.dsn)
    log = project / "var" / "w1.log"
    try:
        wait_for(lambda: _statuses(rs)["waiting"] == 20, 60, "every refund waiting for its approval")
        rs.wait_replica_caught_up(30)
        rs.pause_replica()
        with psycopg.connect(rs.dsn) as conn, conn.transaction():
            for job_id in ids:
                shardworker.send_event(conn, f"refund:{job_id}", {"approved": True})
        # Past their waits, "pay" recorded, a retry due 8 s later: on the primary alone.
        wait_for(lambda: rs.execute("primary", "SELECT count(*) FROM shardworker.jobs WHERE status = 'queued' "
                                               "AND attempt = 2")[0][0] == 20, 60, "every refund's second run applied")
        rs.kill_primary()
        rs.promote_replica()
        rs.move_to_replica()
        assert _statuses(rs, "replica")["waiting"] == 20  # the promoted replica never saw the approvals
        wait_for(lambda: _statuses(rs, "replica") == {"done": 20}, 90,
                 f"every refund done after the failover:\n{log.read_text()[-4000:]}")
        assert worker.poll() is None
    finally:
        if worker.poll() is None:
            worker.terminate()
            try:
                worker.wait(60)
            except subprocess.TimeoutExpired:
                kill_worker_group(worker)
    ran = collections.Counter()
    for path in (project / "var" / "ledger").glob("runs-*.log"):
        ran.update(line for line in path.read_text().splitlines() if line)
    steps = {line: n for line, n in ran.items() if line.startswith("step ")}
    assert len(steps) == 40 and set(steps.values()) == {1}, steps  # ask and pay, once each
    runs = collections.Counter(int(line.split()[1]) for line in ran if line.startswith("run "))
    assert runs == {job_id: 3 for job_id in ids}  # to the wait, past it (the retry), the last
    results = rs.execute("replica", "SELECT DISTINCT result::text FROM shardworker.jobs")
    assert results == [('{"decision": {"approved": true}}',)]
