"""An app that imports in the parent but raises in every child spawned afresh: the first
children are forked from the parent and never import it again, so they run; once one dies
(the ``die`` job), its successors cannot start: a crash loop."""

from __future__ import annotations

import os

import multiprocess

from shardworker import App

app = App()


@app.handler("count")
def count(job: object) -> None:
    return None


@app.handler("die")
def die(job: object) -> None:
    os._exit(3)


if multiprocess.current_process().name.startswith("shardworker-shard"):
    raise RuntimeError("this app cannot start in a child")
