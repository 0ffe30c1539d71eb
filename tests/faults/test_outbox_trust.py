"""An outbox directory is trusted only when this user owns it and it is no symlink; no file
in it is opened through a symlink. Run as root: ``os.chown`` to uid 65534 plays the other
user who pre-created the directory or planted files in it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import outbox
from outbox import OutboxReader, OutboxUntrusted, ShardWriter
from shardworker.cli.main import main as cli
from shardworker.core import layout
from shardworker.core.model import Outcome
from shardworker.core.wire import encode_outcome
from shardworker.doctor import Status, check_permissions, gather_outbox
from shardworker.store.pg_store import PgStore, StoreConfig
from tests.helpers import enqueue, query, runs, worker_env

OTHER_UID = 65534  # "nobody": the other local user
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="giving files to another user needs root")

FORGED = b'{"forged": true}'


@pytest.fixture
def store(pg_dsn: str) -> Iterator[PgStore]:
    s = PgStore(StoreConfig(dsn=pg_dsn))
    yield s
    s.close()


def chown_tree(path: Path, uid: int) -> None:
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, -1, follow_symlinks=False)
    os.chown(path, uid, -1)


def foreign_outbox(path: Path) -> Path:
    """A directory pre-created by another user, mode 0700 as the worker would want it."""
    path.mkdir(mode=0o700)
    os.chown(path, OTHER_UID, -1)
    return path


def one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in output, output
    return lines[0]


def test_outbox_api_refuses_a_directory_owned_by_another_user(tmp_path: Path) -> None:
    """Writer, reader, status and verify all refuse another user's directory, and create nothing in it."""
    d = foreign_outbox(tmp_path / "outbox")
    for use in (lambda: ShardWriter.open(str(d), 0), lambda: OutboxReader.open(str(d)),
                lambda: outbox.status(str(d)), lambda: outbox.verify(str(d))):
        with pytest.raises(OutboxUntrusted, match="owned by"):
            use()
    assert os.listdir(d) == []


def test_outbox_api_refuses_a_symlinked_directory(tmp_path: Path) -> None:
    """An outbox path that is a symlink is refused, even to a directory this user owns."""
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "outbox"
    link.symlink_to(real)
    for use in (lambda: ShardWriter.open(str(link), 0), lambda: OutboxReader.open(str(link)),
                lambda: outbox.status(str(link)), lambda: layout.lock_outbox(str(link), "worker")):
        with pytest.raises(OutboxUntrusted, match="symlink"):
            use()
    assert os.listdir(real) == []


def test_a_subdirectory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    """quarantine/ planted by another user: verify refuses instead of reading it."""
    d = tmp_path / "outbox"
    d.mkdir(mode=0o700)
    (d / "quarantine").mkdir(mode=0o700)
    os.chown(d / "quarantine", OTHER_UID, -1)
    with pytest.raises(OutboxUntrusted, match="quarantine"):
        outbox.verify(str(d))


@pytest.mark.parametrize("state", ["checkpoint.json", "worker-id"])
def test_planted_tmp_symlink_is_not_followed(tmp_path: Path, state: str) -> None:
    """A symlink to a root-only file outside, planted where the writer puts its tmp
    (``NAME.PID.tmp``): the state file is written, the target is unchanged."""
    d = tmp_path / "outbox"
    d.mkdir(mode=0o700)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only\n")
    secret.chmod(0o600)
    name = f"{state}.{os.getpid()}.tmp"
    (d / name).symlink_to(secret)
    if state.startswith("checkpoint"):
        with ShardWriter.open(str(d), 0) as w:
            w.append({"n": 1})
            w.commit()
        with OutboxReader.open(str(d)) as reader:
            reader.mark_flushed(reader.poll(10))
            reader.checkpoint()
    else:
        layout.resolve_worker_id(str(d), "w-1")
    assert secret.read_bytes() == b"root only\n"
    assert not (d / name).exists() and (d / state).is_file()
    assert not (d / state).is_symlink()


def test_planted_lock_symlink_is_not_followed(tmp_path: Path) -> None:
    """A shard lock that is a symlink to a file outside is an error, and the target is untouched."""
    d = tmp_path / "outbox"
    d.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    (d / "shard-0000.lock").symlink_to(target)
    with pytest.raises(OSError):
        ShardWriter.open(str(d), 0)
    assert not target.exists()


def _forge(directory: Path, jobs: list[tuple[int, int]]) -> None:
    """Segments of forged outcomes, as another user could write them (then given to that user)."""
    with ShardWriter.open(str(directory), 5) as writer:
        for job_id, attempt in jobs:
            writer.append_bytes(encode_outcome(Outcome.done(job_id, attempt, FORGED)))
        writer.commit()


def test_drain_never_applies_forged_outcomes_from_another_users_directory(
        tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """Outcomes forged for running jobs in a directory another user owns: `outbox drain` and
    `outbox status`/`verify` refuse with one line, and no forged result lands."""
    d = tmp_path / "outbox"
    enqueue(pg_dsn, "count", 10)
    jobs = store.claim(["count"], None, "w-1", 10)
    _forge(d, [(j.id, j.attempt) for j in jobs])
    chown_tree(d, OTHER_UID)
    runner = CliRunner()
    for args in (["drain", "--dsn", pg_dsn, "--timeout", "5"], ["status"], ["verify"]):
        result = runner.invoke(cli, ["outbox", *args, "--outbox-dir", str(d)])
        assert result.exit_code == 1, result.output
        assert "owned by" in one_error_line(result.output)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE result = %s::jsonb", FORGED.decode()) == [(0,)]
    assert query(pg_dsn, "SELECT DISTINCT status FROM shardworker.jobs") == [("running",)]


def test_worker_refuses_another_users_directory_before_claiming(tmp_path: Path, pg_dsn: str) -> None:
    """`run` on a directory another user pre-created (with forged outcomes waiting) exits 1 with
    one line, claims nothing and runs nothing."""
    d = tmp_path / "outbox"
    ids = enqueue(pg_dsn, "count", 10)
    _forge(d, [(i, 1) for i in ids])
    chown_tree(d, OTHER_UID)
    counts = tmp_path / "counts"
    counts.mkdir()
    done = subprocess.run([sys.executable, "-m", "shardworker", "run", "--app", "counting_app", "--procs", "1",
                           "--outbox-dir", str(d), "--dsn", pg_dsn, "--exit-when-idle"],
                          env=worker_env(counts), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "owned by" in one_error_line(done.stderr)
    assert query(pg_dsn, "SELECT DISTINCT status FROM shardworker.jobs") == [("queued",)]
    assert sum(runs(counts).values()) == 0


def test_doctor_fails_another_users_directory_without_handing_it_over(tmp_path: Path) -> None:
    """doctor: a failed check for a directory another user owns, or a symlink; no advice to chown to them."""
    d = foreign_outbox(tmp_path / "outbox")
    check = check_permissions(gather_outbox(str(d)))
    assert check.status is Status.FAIL and "nobody" in check.detail
    assert "chown" not in (check.action or "").replace("never chown", "")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "outbox")
    check = check_permissions(gather_outbox(str(link)))
    assert check.status is Status.FAIL and "symlink" in check.detail


def test_a_directory_others_could_write_to_is_refused_not_tightened(tmp_path: Path) -> None:
    """Ours, but group- or world-writable before the first start: another account may have
    planted segments in it, so it is refused, with what to do, instead of made 0700 and read
    (20 of 20 forged results landed; issue 41, 5)."""
    d = tmp_path / "outbox"
    d.mkdir()
    os.chmod(d, 0o777)
    for opener in (lambda: OutboxReader.open(str(d)), lambda: ShardWriter.open(str(d), 0),
                   lambda: layout.lock_outbox(str(d), "worker")):
        with pytest.raises(OutboxUntrusted, match="writable by other users"):
            opener()
    assert os.listdir(d) == [] and oct(os.stat(d).st_mode & 0o777) == "0o777"  # nothing made, nothing changed


def test_a_file_another_account_owns_in_our_directory_is_refused_by_name(
        tmp_path: Path, pg_dsn: str, store: PgStore) -> None:
    """Our 0700 directory holding a segment another account planted (it was open once): the
    reader (a worker's flusher, a drain) refuses, naming the file, and no forged result lands."""
    d = tmp_path / "outbox"
    enqueue(pg_dsn, "count", 4)
    jobs = store.claim(["count"], None, "w-1", 4)
    _forge(d, [(j.id, j.attempt) for j in jobs])
    planted = sorted(name for name in os.listdir(d) if name.endswith(".seg"))[0]
    os.chown(d / planted, OTHER_UID, -1)
    with pytest.raises(OutboxUntrusted, match=planted):
        OutboxReader.open(str(d))
    result = CliRunner().invoke(cli, ["outbox", "drain", "--dsn", pg_dsn, "--timeout", "5", "--outbox-dir", str(d)])
    assert result.exit_code == 1 and planted in one_error_line(result.output)
    assert query(pg_dsn, "SELECT count(*) FROM shardworker.jobs WHERE result = %s::jsonb", FORGED.decode()) == [(0,)]
