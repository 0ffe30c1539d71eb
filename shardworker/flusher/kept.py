"""What the flusher keeps on disk beside the outbox, for a person to read: a record the
database refused or could not decode (``deadletter/``, one file each), and outcomes not
applied because their attempt was stale, cancelled or their job missing (JSON lines)."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Iterable

import orjson

from outbox import append_durably, atomic_write, ensure_dir
from shardworker.core import layout, wire
from shardworker.core.model import ApplyResult, Outcome

log = logging.getLogger(__name__)


def deadletter(outbox_dir: str, payload: bytes, reason: str, outcome: Outcome | None = None) -> str:
    """Keep a record the database refused (with its outcome, readable) or could not decode
    (its bytes in base64) in ``deadletter/``; returns the file's name."""
    directory = layout.deadletter_dir(outbox_dir)
    ensure_dir(directory)
    name = f"{time.time_ns()}.json"
    letter: dict[str, object] = {"reason": reason, "record_base64": base64.b64encode(payload).decode()}
    if outcome is not None:
        letter.update(readable(outcome))
    atomic_write(directory, name, orjson.dumps(letter))
    return name


def keep_unapplied(outbox_dir: str, result: ApplyResult, outcomes: list[Outcome], *, may_come: bool = False) -> None:
    """Keep, whole, the outcomes of ``outcomes`` that a batch's ``result`` did not apply
    (stale, cancelled, or of a job this database does not have, with its record, so that it
    can land if the job comes: ``shardworker.flusher.setaside``), saying so once each.
    ``may_come``: the database went back in time, and some worker re-applies what it lost (or
    checks whether it must): a missing job may be inserted again any moment."""
    def keep_these(path: str, job_ids: tuple[int, ...], reason: str, *, records: bool = False) -> None:
        wanted = set(job_ids)
        keep(path, (o for o in outcomes if o.job_id in wanted), reason, records=records)

    if result.stale:
        log.warning("%d stale outcomes kept in %s, not applied (a newer attempt owns the job): ids %s",
                    result.stale, layout.STALE_LOG, list(result.stale_ids[:10]))
        keep_these(layout.stale_log(outbox_dir), result.stale_ids,
                   "stale: a newer attempt owns the job (rescued, or cancelled and retried)")
    if result.cancelled_ids:
        log.info("%d outcomes not applied, kept in %s: their jobs were cancelled while they ran: ids %s",
                 len(result.cancelled_ids), layout.STALE_LOG, list(result.cancelled_ids[:10]))
        keep_these(layout.stale_log(outbox_dir), result.cancelled_ids, layout.CANCELLED_REASON)
    missing = result.missing_ids + result.late_ids
    if missing:
        if may_come:
            log.info("%d outcomes wait in %s while the workers re-apply what the database lost: their jobs do not "
                     "exist here yet (one may insert them again); tried again until they land: ids %s",
                     len(missing), layout.SETASIDE_LOG, list(missing[:10]))
        else:
            log.error("%d outcomes set aside in %s: their jobs do not exist in this database: ids %s",
                      len(missing), layout.SETASIDE_LOG, list(missing[:10]))
        keep_these(layout.setaside_log(outbox_dir), missing, "set aside: no such job in this database",
                   records=True)


def keep(path: str, outcomes: Iterable[Outcome], reason: str, *, records: bool = False) -> None:
    """Append each outcome whole to ``path`` (JSON lines), durably; with ``records``, its
    outbox record too (base64), to apply it again later."""
    lines = []
    for outcome in outcomes:
        entry: dict[str, object] = {"at": time.time(), "reason": reason, **readable(outcome)}
        if records:
            entry["record"] = base64.b64encode(wire.encode_outcome(outcome)).decode()
        lines.append(orjson.dumps(entry) + b"\n")
    append_durably(path, b"".join(lines))


def readable(outcome: Outcome) -> dict[str, object]:
    """An outcome as a JSON object for a person: the result as a JSON value (or, when it
    is not valid JSON, its text under ``result_text``)."""
    value: dict[str, object] = {"job_id": outcome.job_id, "attempt": outcome.attempt,
                                "disposition": outcome.disposition.value, "delay_s": outcome.delay_s,
                                "result": None, "error": outcome.error}
    if outcome.result_json is not None:
        try:
            value["result"] = orjson.loads(outcome.result_json)
        except orjson.JSONDecodeError:
            value["result_text"] = outcome.result_json.decode(errors="replace")
    return value
