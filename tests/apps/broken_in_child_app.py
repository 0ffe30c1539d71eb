"""An app that imports in the parent but raises in every child: a crash loop."""

from __future__ import annotations

import multiprocess

from shardworker import App

app = App()


@app.handler("count")
def count(job: object) -> None:
    return None


if multiprocess.current_process().name.startswith("shardworker-shard"):
    raise RuntimeError("this app cannot start in a child")
