"""Every bound on what a worker holds in memory, in one place.

Fixed limits (the same for every worker):

* ``MAX_PAYLOAD_BYTES``: one job's payload, as JSON text in UTF-8. ``enqueue`` and
  ``enqueue_many`` refuse a bigger one with ``EnqueueError``; a bigger payload written
  into the table by other means fails its job for good in the child, with the reason.
* ``MAX_RESULT_BYTES``: one handler's return value, as JSON text in UTF-8. A bigger one
  fails its job for good with the reason (running it again would compute it again).

Budgets (``WorkerConfig`` fields; each stage takes at least one item, so a single job or
outcome over a budget goes alone and nothing is ever stuck behind it):

==========================  =============================  ==================================
stage                       count                          bytes
==========================  =============================  ==================================
claim (parent)              ``claim_batch`` (500)          ``claim_bytes`` (16 MiB of payload)
prefetch, pipe (per child)  ``prefetch_max_jobs`` (1,000)  ``prefetch_bytes`` (8 MiB)
uncommitted outcomes        ``group_commit_max_records``   ``group_commit_max_bytes`` (8 MiB)
  (per child)
flusher read and apply      ``flush_batch`` (1,000)        ``flush_bytes`` (16 MiB)
==========================  =============================  ==================================

Beyond these, a child holds what its running handlers hold (``--concurrency`` of them
for ``async def`` and ``threads=True`` kinds): a handler's own payload and result. At
``--procs 2`` with the defaults and jobs up to a few MiB, a worker's processes stay under
about 512 MiB together (``bench/large.py`` measures it).
"""

from __future__ import annotations

MiB = 1024 * 1024

MAX_PAYLOAD_BYTES = 64 * MiB
# An outbox record holds the result and a small header; the outbox caps a record at 64 MiB.
MAX_RESULT_BYTES = 64 * MiB - 4096
