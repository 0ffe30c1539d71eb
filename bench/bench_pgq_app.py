"""The pgqueuer consumer of bench/iobound.py, run as its docs run one: ``pgq run
bench_pgq_app:main`` (asyncpg, uvloop), with the DSN in ``BENCH_DSN`` and the wait in
``BENCH_SLEEP_MS``. Its handler is shardworker's ``bench_async``: an ``async def`` awaiting
20 ms."""
import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver

ENTRYPOINT = "bench_async"
SLEEP_S = float(os.environ.get("BENCH_SLEEP_MS", "20")) / 1000


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run`` calls (an async context manager, as pgqueuer 1.6's CLI requires):
    one asyncpg connection, one entrypoint."""
    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def wait_async(job) -> None:
        await asyncio.sleep(SLEEP_S)

    try:
        yield pgq
    finally:
        await connection.close()


def consume(batch_size: int, max_concurrent_tasks: int) -> None:
    """What ``pgq run bench_pgq_app:main --mode drain --batch-size B --max-concurrent-tasks C
    --log-level WARNING`` does: that command's own function, called with its options as typed
    values, because pgqueuer 1.6's CLI passes ``--log-level`` on as a string that its logger
    setup cannot read under typer 0.29 ("'str' object has no attribute 'name'")."""
    from pgqueuer.adapters.cli import cli
    from pgqueuer.core.logconfig import LogLevel
    from pgqueuer.domain.types import QueueExecutionMode

    cli.run(factory_fn="bench_pgq_app:main", factory_args=[], dequeue_timeout=30.0, batch_size=batch_size,
            heartbeat_timeout=30.0, restart_delay=5.0, restart_on_failure=False, log_level=LogLevel.WARNING,
            mode=QueueExecutionMode.drain, max_concurrent_tasks=max_concurrent_tasks,
            shutdown_on_listener_failure=False)


if __name__ == "__main__":
    import sys

    consume(int(sys.argv[1]), int(sys.argv[2]))
