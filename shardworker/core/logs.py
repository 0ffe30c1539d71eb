"""Logging for every process of a worker: readable lines by default, one JSON object per
line with ``--log-format json`` (``python-json-logger`` does the encoding).

Every record carries the process ``role`` (``parent``, ``shard-N``, ``flusher``, ``cli``)
and the ``worker_id`` once it is known; a line about one job carries ``job_id`` and
``kind`` (``extra=job_fields(job)``). A JSON line looks like::

    {"time": "2026-12-04T10:00:00.123456+00:00", "level": "WARNING", "role": "parent",
     "worker_id": "host-1a2b", "logger": "shardworker.worker.dbwatch", "message": "database unreachable ..."}

The parent configures itself with ``configure`` and hands ``current()`` to each process
it spawns, which configures itself the same way with its own role.

Every logger logs at the chosen level (INFO, DEBUG with ``-v``), the app's own included, but
the libraries that log a line per request or per call at INFO (``CHATTY``: HTTP clients, cloud
SDKs) log from WARNING, so a handler's HTTP client does not fill the worker's log. A library's
logger whose level the app set itself keeps it; one that wants those INFO lines sets it (in
``app.on_startup``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, replace
from typing import Any

FORMATS = ("text", "json")
# Libraries that log every request or call at INFO: kept to WARNING unless the app says otherwise.
CHATTY = ("httpx", "httpcore", "urllib3", "requests", "botocore", "boto3", "s3transfer", "aiobotocore",
          "openai", "anthropic", "google.auth", "googleapiclient", "azure", "kafka", "aiokafka", "elastic_transport",
          "hpack", "h2", "websockets", "uvicorn.access")
_TEXT = "%(asctime)s %(role)s %(levelname)s %(message)s"


@dataclass(frozen=True)
class LogSetup:
    """How a process logs; picklable, so it crosses to spawned processes."""

    format: str = "text"
    level: int = logging.INFO
    worker_id: str | None = None
    loggers: tuple[str, ...] = ("shardworker",)  # at ``level``; every other logger at WARNING or above

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {self.format!r}")


class _Context(logging.Filter):
    """Stamps each record with this process's role and worker id."""

    def __init__(self, role: str, worker_id: str | None) -> None:
        super().__init__()
        self.role, self.worker_id = role, worker_id

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = self.role
        record.worker_id = self.worker_id
        return True


_setup = LogSetup()
_context = _Context("cli", None)


def configure(setup: LogSetup, role: str) -> None:
    """Make the root logger write ``setup``'s format to stderr, stamped with ``role``."""
    global _setup
    _setup = setup
    _context.role, _context.worker_id = role, setup.worker_id
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_json_formatter() if setup.format == "json" else logging.Formatter(_TEXT))
    handler.addFilter(_context)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(setup.level)
    for name in setup.loggers:
        logging.getLogger(name).setLevel(setup.level)
    for name in CHATTY:
        chatty = logging.getLogger(name)
        if chatty.level == logging.NOTSET:  # not one the app has set
            chatty.setLevel(max(setup.level, logging.WARNING))


def set_worker_id(worker_id: str) -> None:
    """The worker id, once the outbox directory has told it; processes spawned later inherit it."""
    global _setup
    _setup = replace(_setup, worker_id=worker_id)
    _context.worker_id = worker_id


def current() -> LogSetup:
    return _setup


def job_fields(job: Any) -> dict[str, Any]:
    """``extra=`` for a line about one job."""
    return {"job_id": job.id, "kind": job.kind}


def log_traceback(logger: logging.Logger, level: int, traceback: str | None, msg: str, *args: Any,
                  extra: dict[str, Any] | None = None) -> None:
    """A line that carries ``traceback`` (text: a failed attempt's, formatted in the child) as
    its record's formatted exception: text logs print it on the lines after the message, JSON
    logs hold it in the ``exc_info`` field."""
    if not logger.isEnabledFor(level):
        return
    record = logger.makeRecord(logger.name, level, "(shardworker)", 0, msg, args, None, extra=extra)
    record.exc_text = traceback
    logger.handle(record)


def _json_formatter() -> logging.Formatter:
    from pythonjsonlogger.json import JsonFormatter

    return JsonFormatter("%(levelname)s %(role)s %(worker_id)s %(name)s %(message)s", timestamp="time",
                         rename_fields={"levelname": "level", "name": "logger"})
