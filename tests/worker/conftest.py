"""Fixtures of tests/worker: ``store``, a real ``PgStore`` behind ``FlakyStore`` (the dispatcher tests)."""

from tests.worker.dispatcher_harness import store

__all__ = ["store"]
