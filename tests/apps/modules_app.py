"""One handler that reports which database drivers its child process has loaded: a child
holds no connection, so it has no reason to import psycopg."""

from __future__ import annotations

import sys

from shardworker import App, Job

app = App()


@app.handler("loaded_drivers")
def loaded_drivers(job: Job) -> dict[str, object]:
    return {"psycopg": sorted(name for name in sys.modules if name.split(".")[0] in ("psycopg", "psycopg_binary")),
            "store": sorted(name for name in sys.modules if name.startswith("shardworker.store"))}
