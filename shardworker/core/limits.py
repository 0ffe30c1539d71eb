"""The fixed bounds on what a job carries and a worker holds, the budgets that bound the
rest (their numbers live in ``shardworker.core.config``), and the times and defaults that
several floors share, each written once here.

Fixed limits (the same for every worker):

* ``MAX_PAYLOAD_BYTES``: one job's payload, as JSON text in UTF-8. ``enqueue`` and
  ``enqueue_many`` refuse a bigger one with ``EnqueueError``; a bigger payload written
  into the table by other means fails its job for good in the child, with the reason.
* ``MAX_RESULT_BYTES``: one handler's return value, as JSON text in UTF-8. A bigger one
  fails its job for good with the reason (running it again would compute it again).
* ``MAX_JOB_INPUT_BYTES`` (256 MiB): what one run is given besides its payload, the steps
  its earlier attempts recorded and the results of the jobs it waited on, together, as the
  JSON text the handler reads (``shardworker/store/claiming.py`` counts it before gathering
  it; PostgreSQL's own cap on one jsonb value is the same 256 MiB, on text 1 GiB). A job
  over it fails for good before its handler starts, with the sizes: another attempt would
  meet the same input, and a claim that tried would fail for every job it claims.
* ``MAX_TRACEBACK_BYTES`` (16 KiB): a failed attempt's traceback, as the child records it;
  a longer one (a deep recursion) keeps its end, where the error is. ``MAX_ERROR_CHARS``
  (16,384): an error message as a job's ``errors`` history keeps it (its start). The
  history keeps the last ``ERRORS_KEPT`` (20) failed attempts, so a row holds at most
  about 1.6 MiB of them.

Names and keys (PostgreSQL indexes them; a btree entry holds at most 2,704 bytes, a
third of an 8 KiB page less its headers, and a value that does not fit is refused with
``program_limit_exceeded`` on every write that would index it):

* ``MAX_KIND_BYTES`` and ``MAX_QUEUE_BYTES`` (255 bytes of UTF-8 each): the partial indexes
  of failed and cancelled jobs hold ``left(queue, 255)`` and ``left(kind, 255)`` (migration
  0007), at most 255 characters of at most 4 bytes each: 2 x (1,020 + a 4-byte header) +
  an 8-byte tuple header = 2,056 bytes, under 2,704 whatever a row holds. The 255-byte
  limit at enqueue keeps the expressions equal to the names, so those indexes answer
  exactly. Also handler kinds, periodic kinds and queues, and ``run --queues``. A queue's
  name is a name ``run --queues`` can give (``unservable_queue_name``): no comma, control
  character, or white space at either end.
* ``MAX_DEDUPE_KEY_BYTES`` (1,024): ``jobs_dedupe_idx`` holds the whole key.
* ``MAX_JOB_KEY_BYTES`` (255): a job's key (a tenant's), held whole by the key indexes of
  migration 0022 beside a queue's and a kind's name.
* ``MAX_TAG_BYTES`` (255) and ``MAX_TAGS`` (20): a job's tags (``enqueue(..., tags=)``), which a
  GIN index holds (migration 0026).
* ``MAX_EVENT_KEY_BYTES`` (1,024): an event's key, held whole by ``jobs_wait_key_idx`` and
  ``events_key_idx`` (migration 0025). An event's payload is at most ``MAX_EVENT_BYTES``
  (1 MiB: it is recorded as a step of every job it wakes), a ``job.progress`` value at most
  ``MAX_PROGRESS_BYTES`` (8 KiB: it is a note on the job's row, not a result).
* ``MAX_WORKER_ID_BYTES`` (255): ``jobs_running_idx`` holds ``locked_by`` and the workers
  table's primary key the id. ``MAX_PERIODIC_NAME_BYTES`` (255): the periodic table's key.

Each is checked before anything is sent (``too_long``); the error names the field, its
size and the limit.

Budgets (``WorkerConfig`` fields; each stage takes at least one item, so a single job or
outcome over a budget goes alone and nothing is ever stuck behind it):

==========================  =============================  ==================================
stage                       count                          bytes
==========================  =============================  ==================================
claim (parent)              ``claim_batch`` (500)          ``claim_bytes`` (16 MiB of payload,
                                                           recorded steps, dependencies' results)
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

import unicodedata

MiB = 1024 * 1024

MAX_PAYLOAD_BYTES = 64 * MiB
# An outbox record holds the result and a small header; the outbox caps a record at 64 MiB.
MAX_RESULT_BYTES = 64 * MiB - 4096

# What one run may be given besides its payload: the steps its earlier attempts recorded and
# the results of the jobs it waited on, as JSON text.
MAX_JOB_INPUT_BYTES = 256 * MiB

MAX_TRACEBACK_BYTES = 16 * 1024
MAX_ERROR_CHARS = 16 * 1024
ERRORS_KEPT = 20

MAX_KIND_BYTES = 255
MAX_QUEUE_BYTES = 255
MAX_DEDUPE_KEY_BYTES = 1024
MAX_JOB_KEY_BYTES = 255
MAX_WORKER_ID_BYTES = 255
MAX_PERIODIC_NAME_BYTES = 255
MAX_EVENT_KEY_BYTES = 1024
MAX_TAGS = 20  # tags one job may carry
MAX_TAG_BYTES = 255
MAX_EVENT_BYTES = 1 * MiB
MAX_PROGRESS_BYTES = 8 * 1024

# Shared by the API, the commands and the store.
MAX_DELAY_S = 100 * 365.25 * 86400  # the longest delay, snooze or duration accepted: 100 years (36525d)
DEFAULT_MAX_ATTEMPTS = 25  # a job's attempts when its enqueue, handler or schedule names none
# A worker whose last heartbeat is older is not counted live (30 missed beats of 2 s): by
# `shardworker workers`, doctor, the dashboard and the backlog of kinds no live worker handles.
SILENT_AFTER_S = 60.0


def too_long(field: str, value: str, limit: int) -> str | None:
    """Why ``value`` is over ``limit`` bytes of UTF-8 (a message naming ``field``, its size
    and the limit), or None when it fits. Lone surrogates count as their 3 bytes here;
    whether they may be stored at all is checked elsewhere."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size <= limit:
        return None
    return (f"{field} is {size} bytes of UTF-8, the limit is {limit} "
            "(shardworker.core.limits: the database indexes it)")


def not_storable_text(field: str, value: str) -> str | None:
    """Why PostgreSQL's text cannot hold ``value`` (a NUL, or a lone surrogate: what Python
    gives for bytes that are not UTF-8, from ``sys.argv`` or ``os.listdir``), or None."""
    if "\x00" in value:
        return f"{field} holds a NUL character, which PostgreSQL text cannot store"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{field} is not valid UTF-8 text (a lone surrogate at character {exc.start})"
    return None


def unservable_queue_name(value: str) -> str | None:
    """Why no worker could be given ``value`` in ``run --queues`` (comma-separated names, each
    trimmed), or why it would break a table that lists it; None when it can name a queue."""
    if "," in value:
        return f"queue name {value!r} holds a comma, which separates the names of run --queues"
    if any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in value):
        return f"queue name {value!r} holds a control character or a line break"
    if value != value.strip():
        return f"queue name {value!r} begins or ends with white space"
    return None
