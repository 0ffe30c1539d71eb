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
import dataclasses
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

from tests.pg_wire import BackendParser, FrontendParser, summary

LOOPBACK = "127.0.0.1"
READ_SIZE = 65536
REPLY_WAIT_S = 5.0  # "after" cuts: RST anyway if the server has not answered by then
UPSTREAM_CONNECT_TIMEOUT_S = 3.0
_RESET = object()  # queue sentinel: reset the connection once everything before it is written


@dataclasses.dataclass(frozen=True)
class ProxyEvent:
    at: float  # time.monotonic()
    kind: str  # accept, reset, cut, blackholed, closed
    conn: int
    detail: str = ""


@dataclasses.dataclass
class _CutRule:
    needles: tuple[bytes, ...]
    when: str  # "before" or "after"
    times: int


class _Conn:
    def __init__(self, cid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.id = cid
        self.client_reader, self.client_writer = reader, writer
        self.up_reader: asyncio.StreamReader | None = None
        self.up_writer: asyncio.StreamWriter | None = None
        self.c2s_bytes = 0
        self.cut_base = 0  # c2s_bytes when the current cut_after rule was armed
        self.poisoned = False  # lost bytes in a black hole: never forwards again
        self.parser = FrontendParser()
        self.backend = BackendParser(self.parser)
        self.in_flight = b""  # the statement sent to the server and not yet answered by ReadyForQuery
        self.awaiting_reply: str = ""  # an "after" cut: swallow the reply, then reset
        self.reply_kinds = bytearray()
        self.to_server: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()
        self.to_client: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False


class PgProxy:
    """A TCP proxy to ``127.0.0.1:upstream_port`` with switchable faults (see the module docstring)."""

    def __init__(self, upstream_port: int, *, dbname: str = "postgres", user: str = "postgres",
                 password: str | None = None) -> None:
        self.upstream_port = upstream_port
        self.dbname, self.user, self.password = dbname, user, password
        self._port = 0
        self._mode = "pass"
        self._latency_s = 0.0
        self._cut_after: tuple[int, int] | None = None  # (n bytes, times left)
        self._cut_rules: list[_CutRule] = []
        self._conns: dict[int, _Conn] = {}
        self._next_id = 0
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._events: list[ProxyEvent] = []
        self._cond = threading.Condition()
        self.swallowed_bytes = 0

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
        """RST a connection when it executes a statement containing every needle, ``times`` times.
        Rules add up (the first that matches fires); ``set_pass()`` clears them."""
        if when not in ("before", "after") or not needles:
            raise ValueError("when must be 'before' or 'after', with at least one needle")
        self._call(self._add_cut_rule(_CutRule(tuple(needles), when, times)))

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

    # loop side --------------------------------------------------------------------------

    def _call(self, coro: Any, timeout_s: float = 10.0) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _event(self, kind: str, conn: int, detail: str = "") -> None:
        with self._cond:
            self._events.append(ProxyEvent(time.monotonic(), kind, conn, detail))
            self._cond.notify_all()

    async def _set(self, **attrs: Any) -> None:
        for name, value in attrs.items():
            setattr(self, name, value)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, self._port))
        self._port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._on_client, sock=sock, backlog=128)

    async def _unlisten(self) -> None:
        if self._server is not None:
            self._server.close()  # only the listener: current connections live on
            self._server = None

    async def _set_pass(self) -> None:
        self._mode, self._latency_s, self._cut_after, self._cut_rules = "pass", 0.0, None, []
        await self._listen()

    async def _refuse(self, reset_existing: bool) -> None:
        self._mode = "refuse"
        await self._unlisten()
        if reset_existing:
            await self._reset_all("refuse")

    async def _set_mode(self, mode: str) -> None:
        self._mode = mode
        await self._listen()
        if mode == "reset":
            await self._reset_all("reset_mode")

    async def _add_cut_rule(self, rule: _CutRule) -> None:
        self._cut_rules = [*self._cut_rules, rule]

    async def _arm_cut_after(self, n_bytes: int, times: int) -> None:
        for conn in self._conns.values():
            conn.cut_base = conn.c2s_bytes
        self._cut_after = (n_bytes, times)

    async def _reset_all(self, why: str) -> int:
        conns = list(self._conns.values())
        for conn in conns:
            self._reset(conn, why)
        return len(conns)

    async def _shutdown(self) -> None:
        await self._unlisten()
        tasks = [t for conn in self._conns.values() for t in conn.tasks]
        for conn in list(self._conns.values()):
            self._close(conn, rst=True)  # also cancels its tasks
        if tasks:
            await asyncio.wait(tasks, timeout=2.0)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._next_id += 1
        conn = _Conn(self._next_id, reader, writer)
        self._conns[conn.id] = conn
        self._event("accept", conn.id, self._mode)
        if self._mode == "refuse":  # accepted in the instant before the listener closed
            self._reset(conn, "refuse")
            return
        if self._mode == "reset":
            self._reset(conn, "reset_mode")
            return
        if self._mode == "blackhole":
            conn.poisoned = True
            self._event("blackholed", conn.id, "new connection")
        else:
            try:
                conn.up_reader, conn.up_writer = await asyncio.wait_for(
                    asyncio.open_connection(LOOPBACK, self.upstream_port), UPSTREAM_CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                self._reset(conn, f"upstream connect failed: {exc}")
                return
            if conn.closed:
                self._close(conn, rst=True)
                return
        conn.tasks = [asyncio.ensure_future(c) for c in (
            self._pump_c2s(conn), self._pump_s2c(conn),
            self._writer_loop(conn, conn.to_server, "server"), self._writer_loop(conn, conn.to_client, "client"))]

    # pumps ---------------------------------------------------------------------------------

    def _blackholed(self, conn: _Conn, n: int) -> bool:
        if conn.poisoned or self._mode == "blackhole":
            if not conn.poisoned:
                self._event("blackholed", conn.id, "bytes lost")
            conn.poisoned = True
            self.swallowed_bytes += n
            return True
        return False

    async def _pump_c2s(self, conn: _Conn) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while not conn.closed:
                data = await conn.client_reader.read(READ_SIZE)
                if not data:
                    break
                if self._blackholed(conn, len(data)) or conn.awaiting_reply:
                    continue
                due = time.monotonic() + self._latency_s
                statements = conn.parser.feed(data)
                conn.c2s_bytes += len(data)
                cut = self._cut_point(conn, data, statements)
                if cut is None:
                    conn.to_server.put_nowait((due, data))
                    if statements:
                        conn.in_flight = statements[-1][2]
                    continue
                upto, when, why = cut
                if upto > 0:
                    conn.to_server.put_nowait((due, data[:upto]))
                if when == "after":
                    conn.in_flight = b""
                    conn.awaiting_reply = why
                    conn.reply_kinds.clear()
                    asyncio.get_running_loop().call_later(REPLY_WAIT_S + self._latency_s, self._reply_timeout, conn)
                else:
                    conn.to_server.put_nowait((due, _RESET))
                    self._event("cut", conn.id, why)
                    return
        # The client closed (or failed): close the server side once what was sent is written.
        if not conn.closed:
            conn.to_server.put_nowait((time.monotonic() + self._latency_s, None))

    def _cut_point(self, conn: _Conn, data: bytes, statements: list[tuple[int, int, bytes]]
                   ) -> tuple[int, str, str] | None:
        """Where to cut this chunk, if a rule fires: (bytes to forward first, before/after, why)."""
        for start, end, query in statements:
            for rule in self._cut_rules:
                if all(n in query for n in rule.needles):
                    rule.times -= 1
                    self._cut_rules = [r for r in self._cut_rules if r.times > 0]
                    text = summary(query)
                    if rule.when == "before":
                        return max(0, start), "before", f"before execute of: {text}"
                    return end, "after", f"after execute of: {text}"
        if self._cut_after is not None:
            n_bytes, times = self._cut_after
            carried = conn.c2s_bytes - conn.cut_base
            if carried >= n_bytes:
                self._cut_after = (n_bytes, times - 1) if times > 1 else None
                return len(data) - (carried - n_bytes), "before", f"after {n_bytes} bytes"
        return None

    async def _pump_s2c(self, conn: _Conn) -> None:
        if conn.up_reader is None:  # black-holed from the start: nothing upstream
            return
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while not conn.closed:
                data = await conn.up_reader.read(READ_SIZE)
                if not data:
                    break
                if self._blackholed(conn, len(data)):
                    continue
                kinds = conn.backend.feed(data)
                if conn.awaiting_reply:
                    self._swallow_reply(conn, kinds)
                    continue
                if b"Z" in kinds:
                    conn.in_flight = b""
                conn.to_client.put_nowait((time.monotonic() + self._latency_s, data))
        if not conn.closed:
            conn.to_client.put_nowait((time.monotonic() + self._latency_s, None))

    def _swallow_reply(self, conn: _Conn, kinds: bytes) -> None:
        """Drop the server's reply to an executed statement; reset once ReadyForQuery came."""
        conn.reply_kinds += kinds
        if b"Z" in kinds:
            committed = b"C" in conn.reply_kinds and b"E" not in conn.reply_kinds
            shown = conn.reply_kinds.decode(errors="replace")
            shown = shown if len(shown) < 12 else f"{shown[:4]}...{shown[-4:]} ({len(shown)} messages)"
            self._event("cut", conn.id, f"{conn.awaiting_reply}; server replied {shown} (committed={committed})")
            self._reset(conn, "")

    def _reply_timeout(self, conn: _Conn) -> None:
        if not conn.closed and conn.awaiting_reply:
            self._event("cut", conn.id, f"{conn.awaiting_reply}; no reply within {REPLY_WAIT_S}s")
            self._reset(conn, "")

    async def _writer_loop(self, conn: _Conn, queue: asyncio.Queue[tuple[float, Any]], side: str) -> None:
        writer = conn.up_writer if side == "server" else conn.client_writer
        try:
            while True:
                due, item = await queue.get()
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if item is _RESET:
                    self._reset(conn, "")
                    return
                if item is None or writer is None:
                    self._close(conn, rst=False)
                    return
                writer.write(item)
                await writer.drain()
        except (OSError, ConnectionError):
            self._close(conn, rst=True)

    # closing ---------------------------------------------------------------------------------

    def _reset(self, conn: _Conn, why: str) -> None:
        if why:
            in_flight = f"; in flight: {summary(conn.in_flight)}" if conn.in_flight and not conn.closed else ""
            self._event("reset", conn.id, why + in_flight)
        self._close(conn, rst=True)

    def _close(self, conn: _Conn, *, rst: bool) -> None:
        if conn.closed:
            return
        conn.closed = True
        self._conns.pop(conn.id, None)
        for writer in (conn.client_writer, conn.up_writer):
            if writer is None:
                continue
            with contextlib.suppress(OSError, RuntimeError):
                if rst:
                    sock = writer.get_extra_info("socket")
                    if sock is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                else:
                    writer.close()
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current:
                task.cancel()
        self._event("closed", conn.id, "rst" if rst else "fin")


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
