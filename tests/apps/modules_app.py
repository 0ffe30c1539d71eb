"""Handlers that report what of the database their child process holds: the sockets it
has open to the database server's port and the psycopg connections alive in it
(``database_holdings``), and the driver's modules and libraries loaded in it
(``driver_loaded``). A child is forked from the parent before the parent imports the
driver, so it holds neither its modules nor a connection."""

from __future__ import annotations

import gc
import os
import sys

from shardworker import App, Job

app = App()


def socket_inodes_to(port: int) -> set[str]:
    """Inodes of the TCP sockets on this host whose remote end is ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


@app.handler("database_holdings")
def database_holdings(job: Job) -> dict[str, int]:
    to_database = socket_inodes_to(int(job.payload["port"]))
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[len("socket:["):-1])
    driver = sys.modules.get("psycopg")
    connections = [] if driver is None else [
        o for o in gc.get_objects() if isinstance(o, driver.BaseConnection) and not o.closed]
    return {"sockets": len(mine & to_database), "connections": len(connections)}


@app.handler("driver_loaded")
def driver_loaded(job: Job) -> dict[str, int]:
    """How many psycopg modules this process imported, and how many of its mapped files are libpq."""
    with open("/proc/self/maps") as f:
        libpq = sum(1 for line in f if "libpq" in line)
    return {"modules": sum(1 for name in sys.modules if name.split(".")[0].startswith("psycopg")), "libpq": libpq}


HEAVY = ("psycopg", "prometheus_client", "starlette", "uvicorn", "jinja2")


@app.handler("heavy_modules")
def heavy_modules(job: Job) -> list[str]:
    """Which of the libraries a child has no use for this process has imported: the database
    driver, the metrics' and the dashboard's. Read at its first job, it is what the child
    loaded before running anything."""
    return sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))


@app.handler("exit_child")
def exit_child(job: Job) -> None:
    """Ends the child's process: the worker starts another (spawned, not forked)."""
    os._exit(3)
