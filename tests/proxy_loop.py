"""The loop side of ``tests.proxy.PgProxy``: the connections, the pumps in both directions,
and the fault rules applied to the bytes, all on the proxy's asyncio thread.

``tests/proxy.py`` holds the proxy's public API (the test's thread) and the fixtures; this module
is its base class, never used on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from typing import Any

from tests.pg_wire import Conn, CutRule, ProxyEvent, summary
from tests.proxy_cuts import REPLY_WAIT_S, CutRules

LOOPBACK = "127.0.0.1"
READ_SIZE = 65536
UPSTREAM_CONNECT_TIMEOUT_S = 3.0
_RESET = object()  # queue sentinel: reset the connection once everything before it is written


class ProxyLoop(CutRules):
    """State shared by both threads, and everything that runs on the proxy's event loop."""

    def __init__(self, upstream_port: int, *, dbname: str = "postgres", user: str = "postgres",
                 password: str | None = None) -> None:
        self.upstream_port = upstream_port
        self.dbname, self.user, self.password = dbname, user, password
        self._port = 0
        self._mode = "pass"
        self._latency_s = 0.0
        self._cut_after: tuple[int, int] | None = None  # (n bytes, times left)
        self._cut_rules: list[CutRule] = []
        self._conns: dict[int, Conn] = {}
        self._next_id = 0
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._events: list[ProxyEvent] = []
        self._cond = threading.Condition()
        self.swallowed_bytes = 0


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

    async def _add_cut_rule(self, rule: CutRule) -> None:
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
        conn = Conn(self._next_id, reader, writer)
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

    def _blackholed(self, conn: Conn, n: int) -> bool:
        if conn.poisoned or self._mode == "blackhole":
            if not conn.poisoned:
                self._event("blackholed", conn.id, "bytes lost")
            conn.poisoned = True
            self.swallowed_bytes += n
            return True
        return False

    async def _pump_c2s(self, conn: Conn) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while not conn.closed:
                data = await conn.client_reader.read(READ_SIZE)
                if not data:
                    break
                if self._blackholed(conn, len(data)):
                    continue
                due = time.monotonic() + self._latency_s
                if conn.awaiting_reply:  # an "after" cut: only the rest of its pipeline still goes
                    if rest := conn.rest_of_pipeline(data):
                        conn.to_server.put_nowait((due, rest))
                    continue
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
                if when == "commit":
                    conn.cut_at_commit = why
                    conn.reply_kinds.clear()
                elif when == "after":
                    conn.in_flight = b""
                    conn.awaiting_reply = why
                    conn.until_sync = conn.parser.unsynced  # the rest of its pipeline still goes through
                    conn.reply_kinds.clear()
                    asyncio.get_running_loop().call_later(REPLY_WAIT_S + self._latency_s, self._reply_timeout, conn)
                else:
                    conn.to_server.put_nowait((due, _RESET))
                    self._event("cut", conn.id, why)
                    return
        # The client closed (or failed): close the server side once what was sent is written.
        if not conn.closed:
            conn.to_server.put_nowait((time.monotonic() + self._latency_s, None))

    async def _pump_s2c(self, conn: Conn) -> None:
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
                if conn.cut_at_commit and self._transaction_ended(conn, kinds):
                    break
                if conn.awaiting_reply:
                    self._swallow_reply(conn, kinds)
                    continue
                if b"Z" in kinds:
                    conn.in_flight = b""
                conn.to_client.put_nowait((time.monotonic() + self._latency_s, data))
        if not conn.closed:
            conn.to_client.put_nowait((time.monotonic() + self._latency_s, None))

    async def _writer_loop(self, conn: Conn, queue: asyncio.Queue[tuple[float, Any]], side: str) -> None:
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

    def _reset(self, conn: Conn, why: str) -> None:
        if why:
            in_flight = f"; in flight: {summary(conn.in_flight)}" if conn.in_flight and not conn.closed else ""
            self._event("reset", conn.id, why + in_flight)
        self._close(conn, rst=True)

    def _close(self, conn: Conn, *, rst: bool) -> None:
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
