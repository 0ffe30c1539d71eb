"""A handler that returns, leaving behind a timer that kills its process a moment later, and
an innocent neighbour that is running when it fires (tests/worker/test_leftover_killer.py)."""

from __future__ import annotations

import os
import threading
import time

from run_ledger import record

from shardworker import App, Job

app = App()


@app.handler("careless", max_attempts=1)
def careless(job: Job) -> str:
    record(job)
    threading.Timer(0.3, os._exit, (3,)).start()  # a leftover of a library, say: it ends the process later
    return "returned"


@app.handler("neighbour", max_attempts=1)
def neighbour(job: Job) -> str:
    record(job)
    time.sleep(1.0)
    return "done"
