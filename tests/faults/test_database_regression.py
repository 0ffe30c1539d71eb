"""A database that comes back older, for real: a PostgreSQL primary with an asynchronous
streaming replica (``pg_basebackup -R``, tests/replica.py) behind a forwarder that moves at the
failover. The replica is stopped mid-run so it lags, the primary is killed (``-m immediate``)
after more outcomes landed, the replica is promoted and the address moves to it: the database
the workers reach now holds less than they saw it commit. And a restore of an older base backup,
followed by ``outbox reapply`` by hand.

The workers run through the console script from a project directory (``shop/``: its app
package, its own ``var/`` folders, relative paths). Every handler and every step appends to a
ledger it fsyncs, so a run repeated anywhere is counted; every job's final row is checked."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import psycopg

from tests import replica as replica_module
from tests.cli.test_project_dir import shardworker_script
from tests.helpers import STARTED, kill_worker_group, wait_for
from tests.replica import ReplicaSet

replica_set = replica_module.replica_set

APP = '''
    import os
    import time

    from shardworker import App, Job

    app = App()
    LEDGER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "var", "ledger")


    def ledger(line: str) -> None:
        """One line per run, made durable before the run goes on: what ran is never lost."""
        fd = os.open(os.path.join(LEDGER, f"runs-{os.getpid()}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)


    @app.handler("order")
    def order(job: Job) -> dict:
        ledger(f"job {job.id}")
        time.sleep(0.002)
        return {"order": job.id}


    @app.handler("ticket")
    def ticket(job: Job) -> dict:
        ledger(f"job {job.id}")
        time.sleep(0.02)
        return {"ticket": job.id}


    @app.handler("invoice")
    def invoice(job: Job) -> dict:
        ledger(f"job {job.id}")
        total = 0
        for name in ("fetch", "price", "render"):
            total += job.step(name, step, job.id, name)
        return {"total": total}


    def step(job_id: int, name: str) -> int:
        ledger(f"step {job_id} {name}")
        time.sleep(0.01)
        return len(name)


    @app.handler("batch")
    def batch(job: Job) -> dict:
        ledger(f"job {job.id}")
        # Ahead of the queue (smaller priority first): they run while their parent's outcome is fresh.
        parts = [job.enqueue("part", {"n": n, "of": job.id}, priority=-1) for n in range(5)]
        job.enqueue("merge", {"of": job.id}, after=parts, priority=-1)
        return {"parts": 5}


    # A follow-up inserted again would get another id: the ledger names it by its parent.
    @app.handler("part")
    def part(job: Job) -> int:
        ledger(f"part {job.payload['of']} {job.payload['n']}")
        time.sleep(0.005)
        return job.payload["n"]


    @app.handler("merge")
    def merge(job: Job) -> int:
        ledger(f"merge {job.payload['of']} after {len(job.dependencies)}")
        return sum(v for v in job.dependencies.values())
'''


def _project(parent: Path) -> Path:
    root = parent / "shop"
    (root / "shop").mkdir(parents=True)
    (root / "var" / "ledger").mkdir(parents=True)
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "tasks.py").write_text(textwrap.dedent(APP).lstrip())
    return root


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SHARDWORKER_DSN")}


def _start(project: Path, dsn: str, name: str, *args: str) -> subprocess.Popen[bytes]:
    """``shardworker run`` from ``project``, its outbox and log under ``var/``."""
    log = open(project / "var" / f"{name}.log", "ab")  # noqa: SIM115 (kept for the worker's life)
    proc = subprocess.Popen([*shardworker_script(), "run", "--app", "shop.tasks", "--procs", "2",
                             "--outbox-dir", f"var/{name}-outbox", "--worker-id", name, "--dsn", dsn,
                             "--backoff-cap", "1", *args],
                            cwd=project, env=_env(), stdout=log, stderr=log, start_new_session=True)
    STARTED.append(proc)
    return proc


def _cli(project: Path, dsn: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``shardworker ARGS`` from ``project`` (with ``--dsn`` unless None)."""
    return subprocess.run([*shardworker_script(), *args, *(["--dsn", dsn] if dsn else [])], cwd=project,
                          env=_env(), capture_output=True, text=True, timeout=120)


def _ledger(project: Path) -> collections.Counter[str]:
    counted: collections.Counter[str] = collections.Counter()
    for path in (project / "var" / "ledger").glob("runs-*.log"):
        counted.update(line for line in path.read_text().splitlines() if line)
    return counted


def _log(project: Path, name: str) -> str:
    path = project / "var" / f"{name}.log"
    return path.read_text(errors="replace")[-6000:] if path.exists() else ""


def _enqueue(dsn: str, kind: str, count: int) -> None:
    _enqueue_mix(dsn, {kind: count})


def _enqueue_mix(dsn: str, counts: dict[str, int]) -> None:
    """The kinds interleaved, in proportion, so that every stretch of the run has each of them."""
    from shardworker.client import JobSpec, enqueue_many

    total = sum(counts.values())
    specs = sorted((n * total / count, kind) for kind, count in counts.items() for n in range(count))
    enqueue_many(dsn, [JobSpec(kind, {"i": i}) for i, (_, kind) in enumerate(specs)])


def _counts(rs: ReplicaSet, which: str = "primary") -> dict[str, int]:
    return {status: int(n) for status, n in rs.execute(
        which, "SELECT status, count(*) FROM shardworker.jobs GROUP BY status")}


def _through(rs: ReplicaSet) -> dict[str, int]:
    with psycopg.connect(rs.dsn, connect_timeout=3) as conn:
        return {s: int(n) for s, n in conn.execute("SELECT status, count(*) FROM shardworker.jobs GROUP BY status")}


def _fail_over(rs: ReplicaSet, lag_while: object) -> float:
    """Stop the replica so it lags, let ``lag_while()`` become true on the primary, kill the
    primary, promote the replica, move the address; when the promotion was done."""
    rs.wait_replica_caught_up(30)
    rs.pause_replica()
    wait_for(lag_while, 60, "outcomes to land on the primary alone")  # type: ignore[arg-type]
    rs.kill_primary()
    rs.promote_replica()
    promoted = time.monotonic()
    rs.move_to_replica()
    return promoted


def _stop(proc: subprocess.Popen[bytes], project: Path, name: str) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(60)
    except subprocess.TimeoutExpired:
        kill_worker_group(proc)
        raise AssertionError(f"{name} did not stop:\n{_log(project, name)}") from None
    assert code == 0, f"{name} exited {code}:\n{_log(project, name)}"


def _repeats(ran: collections.Counter[str]) -> dict[str, int]:
    return {line: n for line, n in ran.items() if n > 1}


def test_a_failover_to_a_replica_that_lagged_reruns_nothing(replica_set: ReplicaSet, tmp_path: Path) -> None:
    """3,000 jobs on one worker; about a third applied on the primary alone before it dies. After
    the promotion every job is done within 30 s, none ran twice, none is left running, and the
    worker stayed up throughout."""
    rs, project = replica_set, _project(tmp_path)
    _enqueue(rs.dsn, "order", 3000)
    worker = _start(project, rs.dsn, "w1")
    wait_for(lambda: _counts(rs).get("done", 0) >= 600, 90, "a first part done")
    promoted = _fail_over(rs, lambda: _counts(rs).get("done", 0) >= 1800)
    lost = 3000 - _through(rs).get("done", 0)
    assert lost > 1000, "the promoted replica should hold much less than the primary had done"
    wait_for(lambda: _through(rs) == {"done": 3000}, 60, f"every job done after the failover:\n{_log(project, 'w1')}")
    took = time.monotonic() - promoted
    assert worker.poll() is None, _log(project, "w1")
    _stop(worker, project, "w1")
    ran = _ledger(project)
    assert len(ran) == 3000 and _repeats(ran) == {}, f"handler runs repeated: {len(_repeats(ran))}"
    assert took < 30, f"{took:.1f}s after the promotion"
    with psycopg.connect(rs.dsn) as conn:
        rows = conn.execute("SELECT count(*) FROM shardworker.jobs WHERE status = 'done' AND attempt = 1 "
                            "AND result = jsonb_build_object('order', id)").fetchone()
        holds = conn.execute("SELECT count(*) FROM shardworker.claim_holds WHERE until > now()").fetchone()
    assert rows == (3000,) and holds == (0,)
    assert "the database went back in time" in _log(project, "w1")


def test_two_workers_with_steps_and_fan_out_rerun_nothing_after_a_failover(replica_set: ReplicaSet,
                                                                           tmp_path: Path) -> None:
    """Two workers on one database, a mix of plain jobs, three-step jobs and fan-outs (five parts
    and a merge after them): after a failover that lost hundreds of outcomes, claims and
    follow-ups, no handler and no step ran twice, each follow-up exists once, every merge ran
    after its parts, and every job is done."""
    rs, project = replica_set, _project(tmp_path)
    _enqueue_mix(rs.dsn, {"order": 1200, "invoice": 150, "batch": 60})
    # Follow-ups inserted again wait --rescue-grace before they may run (an outcome of theirs kept
    # by the other worker lands meanwhile): 10 s here, so the test ends soon.
    workers = {name: _start(project, rs.dsn, name, "--rescue-grace", "10") for name in ("w1", "w2")}
    wait_for(lambda: _counts(rs).get("done", 0) >= 400, 90, "a first part done")
    _fail_over(rs, lambda: _counts(rs).get("done", 0) >= 1100)
    total = 1200 + 150 + 60 * 7
    wait_for(lambda: _through(rs) == {"done": total}, 90,
             f"every job done after the failover:\n{_log(project, 'w1')}\n{_log(project, 'w2')}")
    for name, proc in workers.items():
        assert proc.poll() is None, _log(project, name)
        _stop(proc, project, name)
    ran = _ledger(project)
    assert _repeats(ran) == {}, f"repeated: {sorted(_repeats(ran))[:20]}"
    assert sum(1 for line in ran if line.startswith("step ")) == 150 * 3
    assert sum(1 for line in ran if line.startswith("part ")) == 300
    assert sum(1 for line in ran if line.startswith("merge ") and line.endswith("after 5")) == 60
    with psycopg.connect(rs.dsn) as conn:
        kinds = dict(conn.execute("SELECT kind, count(*) FROM shardworker.jobs GROUP BY kind").fetchall())
        merged = conn.execute("SELECT count(*) FROM shardworker.jobs WHERE kind = 'merge' AND result = '10'").fetchone()
        steps = conn.execute("SELECT count(*) FROM shardworker.job_steps").fetchone()
    assert kinds == {"order": 1200, "invoice": 150, "batch": 60, "part": 300, "merge": 60}
    assert merged == (60,) and steps == (450,)


def test_a_restore_of_an_older_backup_is_reapplied_by_hand(replica_set: ReplicaSet, tmp_path: Path) -> None:
    """A base backup; more jobs done; the primary lost and the backup restored, with the worker
    stopped. ``outbox reapply --dry-run`` says how many jobs it would change and changes none;
    ``outbox reapply`` lands them; a worker started then runs only what never ran."""
    rs, project, jobs = replica_set, _project(tmp_path), 900
    _enqueue(rs.dsn, "ticket", jobs)
    worker = _start(project, rs.dsn, "w1")
    wait_for(lambda: _counts(rs).get("done", 0) >= 100, 90, "a first part done")
    backup = rs.take_base_backup()
    # The backup holds what was done when it ended, at most this (on a busy machine it can take
    # seconds, while the worker goes on): 150 more make the restore lose 150 at least.
    at_backup = _counts(rs).get("done", 0)
    wait_for(lambda: _counts(rs).get("done", 0) >= min(at_backup + 150, jobs), 90, "more done after the backup")
    _stop(worker, project, "w1")
    done_before = _counts(rs)["done"]
    rs.kill_primary()
    rs.restore_backup(backup)
    restored = _through(rs).get("done", 0)
    assert restored < done_before - 100
    status = _cli(project, None, "outbox", "status", "--outbox-dir", "var/w1-outbox", "--json")
    kept = json.loads(status.stdout)["kept_for_reapply"]
    assert kept["records"] >= done_before and kept["bytes"] > 0, kept
    doctor = _cli(project, rs.dsn, "doctor", "--outbox-dir", "var/w1-outbox")
    assert doctor.returncode == 1 and "went back in time" in doctor.stdout and "outbox reapply" in doctor.stdout
    dry = _cli(project, rs.dsn, "outbox", "reapply", "--outbox-dir", "var/w1-outbox", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    would = json.loads(dry.stdout)
    assert would["jobs_changed"] == done_before - restored, would
    assert _through(rs).get("done", 0) == restored  # a dry run changes nothing
    done = _cli(project, rs.dsn, "outbox", "reapply", "--outbox-dir", "var/w1-outbox", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs_changed"] == done_before - restored
    assert _through(rs).get("done", 0) == done_before
    worker = _start(project, rs.dsn, "w1", "--exit-when-idle")
    assert worker.wait(90) == 0, _log(project, "w1")
    ran = _ledger(project)
    assert len(ran) == jobs and _repeats(ran) == {}
    assert _through(rs) == {"done": jobs}
