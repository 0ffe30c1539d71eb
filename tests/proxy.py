"""A fault-injecting TCP proxy in front of PostgreSQL, for network fault tests (durability.md row 10).

``PgProxy`` runs an asyncio loop in a background thread, listens on a free 127.0.0.1 port and
forwards every connection to the PostgreSQL port. Faults switch at runtime, from the test's thread:

* ``set_pass()``              forward everything (clears latency and cut rules too)
* ``refuse()``                stop listening: new connects get ECONNREFUSED (optionally RST the current ones)
* ``reset_all()``             RST every current connection now (``SO_LINGER`` 0, then close); mode unchanged
* ``reset_mode()``            RST every current connection, and every new one right after accept
* ``blackhole()``             accept and keep connections, swallow every byte in both directions, never answer
* ``latency(ms)``             delay every chunk, both directions, order kept
* ``cut_after(n)``            RST a connection once it has carried ``n`` bytes client->server (the ``n``-th
                              byte still goes through, so a message can be cut mid-way)
* ``cut_on_query(...)``       RST a connection when the client executes a statement whose text holds every
                              needle: ``when="before"``: before its Execute reaches the server (nothing
                              applied), or
                              ``when="after"``: the statement and its Sync reach the server, the server's reply
                              (up to ReadyForQuery) is swallowed, then RST: the client sees "maybe applied"
                              while the server has committed.

Statements are recognised by a small parser of the frontend protocol (startup packet, then
Parse/Bind/Execute/Sync and simple Query), which maps prepared statements and portals back to their
text, so a statement psycopg has prepared (``_pg3_N``) is still recognised.

A black hole is a partition whose bytes are lost: a connection that lost a byte in it can never be
consistent again, so it stays silent after ``set_pass()`` until the client gives up on it. Connections
that carried nothing during the black hole resume (as TCP would). New connections after
``set_pass()`` work normally.

Only loopback: the proxy binds 127.0.0.1 and connects to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

from tests.pg_wire import CutRule, ProxyEvent
from tests.proxy_loop import LOOPBACK, ProxyLoop

__all__ = ["PgProxy", "ProxyEvent", "pg_proxy", "running_proxy"]


class PgProxy(ProxyLoop):
    """A TCP proxy to ``127.0.0.1:upstream_port`` with switchable faults (see the module docstring)."""

    # lifecycle (test thread) ------------------------------------------------------------

    def start(self) -> PgProxy:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg-proxy", daemon=True)
        self._thread.start()
        self._call(self._listen())
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close the listener and every connection, stop the loop and join its thread (bounded)."""
        if self._loop is None or self._thread is None:
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown(), timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> PgProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def dsn(self) -> str:
        return self.dsn_for(self.dbname)

    def dsn_for(self, dbname: str) -> str:
        auth = quote(self.user, safe="")
        if self.password is not None:
            auth += ":" + quote(self.password, safe="")
        return f"postgresql://{auth}@{LOOPBACK}:{self._port}/{quote(dbname, safe='')}"

    @property
    def mode(self) -> str:
        extra = []
        if self._latency_s:
            extra.append(f"latency={self._latency_s * 1000:g}ms")
        if self._cut_after:
            extra.append(f"cut_after={self._cut_after[0]}x{self._cut_after[1]}")
        extra.extend(f"cut_on_query={r.when}x{r.times}" for r in self._cut_rules)
        return " ".join([self._mode, *extra])

    # faults (test thread) ----------------------------------------------------------------

    def set_pass(self) -> None:
        """Forward everything again: listen if refused, no latency, no cut rules."""
        self._call(self._set_pass())

    def refuse(self, *, reset_existing: bool = False) -> None:
        """Stop listening, so connects are refused; optionally RST every current connection too."""
        self._call(self._refuse(reset_existing))

    def reset_all(self) -> int:
        """RST every current connection now; returns how many. The mode is unchanged."""
        return int(self._call(self._reset_all("reset_all")))

    def reset_mode(self) -> None:
        """RST every current connection, and each new one as soon as it is accepted."""
        self._call(self._set_mode("reset"))

    def blackhole(self) -> None:
        """Swallow every byte of every connection, current and new; nothing is ever answered."""
        self._call(self._set_mode("blackhole"))

    def latency(self, ms: float) -> None:
        """Delay each chunk by ``ms`` in both directions (0 to stop)."""
        self._call(self._set(_latency_s=ms / 1000.0))

    def cut_after(self, n_bytes: int, *, times: int = 1_000_000) -> None:
        """RST connections once they carried ``n_bytes`` client->server (counted from now for current
        connections, from their start for new ones), for the next ``times`` connections."""
        self._call(self._arm_cut_after(n_bytes, times))

    def cut_on_query(self, *needles: bytes, when: str = "before", times: int = 1) -> None:
        """RST a connection when it executes a statement containing every needle, ``times`` times:
        ``before`` it reaches the server; ``after`` the server ran it and the rest of its
        pipeline (up to the Sync), its reply dropped; ``commit`` once the transaction it ran in
        ended (the reply to the statement that ended it dropped: "maybe committed").
        Rules add up (the first that matches fires); ``set_pass()`` clears them."""
        if when not in ("before", "after", "commit") or not needles:
            raise ValueError("when must be 'before', 'after' or 'commit', with at least one needle")
        self._call(self._add_cut_rule(CutRule(tuple(needles), when, times)))

    # observation (test thread) -----------------------------------------------------------

    def events(self, kind: str | None = None) -> list[ProxyEvent]:
        with self._cond:
            return [e for e in self._events if kind is None or e.kind == kind]

    def wait_events(self, kind: str, count: int, timeout_s: float) -> list[ProxyEvent]:
        """Block until ``count`` events of ``kind`` happened; AssertionError on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                found = [e for e in self._events if e.kind == kind]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"proxy: {len(found)} of {count} '{kind}' events after {timeout_s}s "
                                         f"(mode {self.mode}); events: {self._events[-20:]}")
                self._cond.wait(left)

    def open_connections(self) -> int:
        return len(self._conns)


@contextlib.contextmanager
def running_proxy(upstream_dsn: str) -> Iterator[PgProxy]:
    """A started ``PgProxy`` in front of the server ``upstream_dsn`` names (same user, password, database)."""
    url = urlsplit(upstream_dsn)
    assert url.port is not None, f"the proxy needs a TCP DSN: {url.hostname}"
    proxy = PgProxy(url.port, dbname=unquote(url.path.lstrip("/")) or "postgres",
                    user=unquote(url.username or "postgres"),
                    password=None if url.password is None else unquote(url.password)).start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def pg_proxy(private_pg: Any) -> Iterator[PgProxy]:
    """A ``PgProxy`` in front of the test's own server (``private_pg``); ``.dsn`` goes through it."""
    with running_proxy(private_pg.dsn_for("postgres")) as proxy:
        yield proxy
