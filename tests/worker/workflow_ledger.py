"""Reading the ledger of ``tests/apps/workflow_app.py`` and checking a finished run of
document workflows against it and against the table: every job done, every handler run
once, every merge started after all of its parts had finished, and seeing all of them."""

from __future__ import annotations

import collections
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from tests.helpers import query


class Entry(NamedTuple):
    """One ledger line: a handler run's start or end."""

    kind: str
    job_id: int
    attempt: int
    event: str
    at: float
    note: str


def ledger(count_dirs: Iterable[Path]) -> list[Entry]:
    """Every line of every process's ledger under ``count_dirs``, in time order."""
    entries = []
    for count_dir in count_dirs:
        for path in count_dir.glob("workflow-*.log"):
            for line in path.read_text().splitlines():
                kind, job_id, attempt, event, at, note = line.split()
                entries.append(Entry(kind, int(job_id), int(attempt), event, float(at), note))
    return sorted(entries, key=lambda e: e.at)


def open_runs(count_dirs: Iterable[Path], kind: str) -> list[int]:
    """Ids of the jobs of ``kind`` whose handler started and has not ended (by the ledger)."""
    started: dict[int, int] = collections.Counter()
    for entry in ledger(count_dirs):
        if entry.kind == kind:
            started[entry.job_id] += 1 if entry.event == "start" else -1
    return [job_id for job_id, n in started.items() if n > 0]


def assert_workflows_once(dsn: str, count_dirs: list[Path], docs: int, parts: int) -> None:
    """The promise for a run of ``docs`` splits of ``parts`` parts each (see the module docstring)."""
    rows = query(dsn, "SELECT id, kind, status, payload, result FROM shardworker.jobs")
    assert len(rows) == docs * (parts + 2), f"{len(rows)} rows, expected {docs * (parts + 2)}"
    assert collections.Counter(r[2] for r in rows) == {"done": len(rows)}
    assert collections.Counter(r[1] for r in rows) == {"split": docs, "part": docs * parts, "merge": docs}
    entries = ledger(count_dirs)
    starts = collections.Counter(e.job_id for e in entries if e.event == "start")
    reran = sorted(job_id for job_id, n in starts.items() if n > 1)
    assert not reran, f"{len(reran)} handlers ran again, e.g. {reran[:10]}"
    assert set(starts) == {r[0] for r in rows}, "the ledger and the table disagree on which jobs ran"
    part_ids: dict[str, list[int]] = collections.defaultdict(list)
    for job_id, kind, _, payload, result in rows:
        if kind == "part":
            assert result == {"text": f"{payload['doc']}/{payload['part']}"}
            part_ids[payload["doc"]].append(job_id)
    assert all(len(ids) == parts for ids in part_ids.values()) and len(part_ids) == docs
    ended = {e.job_id: e.at for e in entries if e.event == "end"}
    begun = {e.job_id: e for e in entries if e.event == "start"}
    edges = collections.defaultdict(set)
    for job_id, depends_on in query(dsn, "SELECT job_id, depends_on FROM shardworker.job_dependencies"):
        edges[job_id].add(depends_on)
    for job_id, kind, _, payload, result in rows:
        if kind != "merge":
            continue
        mine = sorted(part_ids[payload["doc"]])
        assert result == {"doc": payload["doc"], "seen": mine, "complete": True}, f"merge {job_id}: {result}"
        assert begun[job_id].note == str(parts)
        assert edges[job_id] == set(mine)
        last_part = max(ended[p] for p in mine)
        assert begun[job_id].at > last_part, f"merge {job_id} started before its parts had all finished"
