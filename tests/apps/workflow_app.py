"""A document workflow for the workflow fault tests: ``split`` fans a document out into
``part`` jobs and one ``merge`` after all of them (``job.enqueue``, ``after=``).

* ``split`` {"doc": d, "parts": n}: enqueues n ``part`` follow-ups {"doc": d, "part": i} and one
  ``merge`` {"doc": d, "parts": n} after all of them, at priority -1 (claimed before the
  splits still due); returns {"parts": n}.
* ``part``: returns {"text": "d/i"}.
* ``merge``: reads ``job.dependencies`` and returns what it saw: the ids of the jobs it waited
  on and whether their texts are exactly the document's n parts.

Every run appends "kind id attempt event time note" to a per-process ledger under
$SW_TEST_COUNT_DIR (workflow-PID.log) and fsyncs it: event ``start`` first thing, so a run cut
short by a kill still counts, and ``end`` just before the handler returns (its outcome is
committed after that). ``note`` is ``-``, or for a merge the number of results it saw.
Sleeps, in seconds, from the environment: SW_WORKFLOW_SPLIT_SLEEP (default 0) and
SW_WORKFLOW_PART_SLEEP (default 0.005), so a test can keep jobs in hand at an outage.
"""

from __future__ import annotations

import os
import time
from typing import Any

import run_ledger

from shardworker import App, Job

app = App()


def ledger(job: Job, event: str, note: str = "-") -> None:
    """Append this run's line to this process's ledger, durably."""
    run_ledger.append("workflow", f"{job.kind} {job.id} {job.attempt} {event} {time.time():.6f} {note}\n")


def pause(name: str, default: float) -> None:
    time.sleep(float(os.environ.get(name, default)))


@app.handler("split")
def split(job: Job) -> dict[str, Any]:
    ledger(job, "start")
    doc, n = job.payload["doc"], job.payload["parts"]
    pause("SW_WORKFLOW_SPLIT_SLEEP", 0.0)
    # Priority -1: a document under way is finished before the next one is split.
    parts = [job.enqueue("part", {"doc": doc, "part": i}, priority=-1) for i in range(n)]
    job.enqueue("merge", {"doc": doc, "parts": n}, priority=-1, after=parts)
    ledger(job, "end")
    return {"parts": n}


@app.handler("part")
def part(job: Job) -> dict[str, Any]:
    ledger(job, "start")
    pause("SW_WORKFLOW_PART_SLEEP", 0.005)
    ledger(job, "end")
    return {"text": f"{job.payload['doc']}/{job.payload['part']}"}


@app.handler("merge")
def merge(job: Job) -> dict[str, Any]:
    ledger(job, "start", str(len(job.dependencies)))
    doc, n = job.payload["doc"], job.payload["parts"]
    texts = sorted(result["text"] for result in job.dependencies.values())
    complete = texts == sorted(f"{doc}/{i}" for i in range(n))
    ledger(job, "end")
    return {"doc": doc, "seen": sorted(job.dependencies), "complete": complete}
