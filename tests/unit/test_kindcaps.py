"""What the worker says at start about caps that leave no child free for other kinds."""

from __future__ import annotations

from shardworker.app import App
from shardworker.worker.kindcaps import caps_that_fill_every_child


def specs() -> App:
    app = App()
    for kind, options in (("slow", {"concurrency": 2}), ("slow_threads", {"concurrency": 2, "threads": True}),
                          ("one", {"concurrency": 1}), ("free", {})):
        app.handler(kind, **options)(lambda job: None)
    return app


def test_a_plain_sync_kind_capped_at_procs_or_more_is_named() -> None:
    """A cap of 2 on a plain sync kind at --procs 2 still lets its jobs hold every child's sync
    lane (a new user's fast jobs waited 0.9 s at the median); threaded kinds and caps below
    --procs leave room."""
    [line] = caps_that_fill_every_child(specs().handlers, procs=2)
    assert line.startswith("kind slow: concurrency=2 lets its plain sync jobs hold every child (--procs 2)"), line
    assert caps_that_fill_every_child(specs().handlers, procs=3) == []
