"""Just enough of the PostgreSQL wire protocol for the fault proxy (``tests/proxy.py``):
``FrontendParser`` follows the client's byte stream (startup packet, then Parse/Bind/Execute/
Sync and simple Query) and maps prepared statements and portals back to their text;
``BackendParser`` follows the server's replies up to ReadyForQuery."""

from __future__ import annotations

import asyncio
import dataclasses
import struct
from typing import Any

STARTUP_CODES = {196608, 80877102, 80877103, 80877104}  # protocol 3.0, cancel, SSL, GSSENC
SSL_OR_GSS = {80877103, 80877104}
MAX_MESSAGE = 1 << 30


class FrontendParser:
    """Follows the client->server byte stream and reports statements as they are executed.

    ``feed(chunk)`` returns ``(start, end, query)`` for each Execute (or simple Query) completed in the
    chunk, with offsets relative to the chunk (``start`` may be negative when the message began in an
    earlier chunk) and ``end`` the offset just past the Sync that ends it (or past the message itself
    when no Sync is in this chunk). Once the stream cannot be followed (TLS, garbage) it reports nothing.
    """

    def __init__(self) -> None:
        self.buf = bytearray()
        self.pos = 0  # parsed up to here in buf
        self.offset = 0  # absolute stream offset of buf[0]
        self.startup = True
        self.opaque = False
        self.single_byte_replies = 0  # SSL/GSS requests: the server answers each with one byte
        self.statements: dict[bytes, bytes] = {}
        self.portals: dict[bytes, bytes] = {}
        self.unsynced = False
        self.pending_start = -1

    def feed(self, chunk: bytes) -> list[tuple[int, int, bytes]]:
        if self.opaque:
            return []
        chunk_start = self.offset + len(self.buf)
        self.buf += chunk
        try:
            return self._feed(chunk_start)
        finally:
            del self.buf[: self.pos]
            self.offset += self.pos
            self.pos = 0

    def _feed(self, chunk_start: int) -> list[tuple[int, int, bytes]]:
        found: list[tuple[int, int, bytes]] = []
        pending: list[tuple[int, int, bytes]] = []  # executes waiting for their Sync
        while True:
            msg = self._next_message()
            if msg is None:
                break
            kind, start, end, body = msg
            if kind == b"E":
                portal = body.split(b"\0", 1)[0]
                pending.append((start, end, self.portals.get(portal, b"")))
            elif kind == b"Q":
                found.append((start, end, body.split(b"\0", 1)[0]))
            elif kind == b"S":
                found.extend((s, end, q) for s, _, q in pending)
                pending.clear()
            else:
                self._track(kind, body)
        self.unsynced = bool(pending)  # executes whose Sync is still to come (a pipeline sent in parts)
        self.pending_start = pending[0][0] - chunk_start if pending else -1  # where they begin in the chunk
        found.extend(pending)
        return [(s - chunk_start, e - chunk_start, q) for s, e, q in found]

    def _next_message(self) -> tuple[bytes, int, int, bytes] | None:
        buf, pos = self.buf, self.pos
        while not self.opaque:
            left = len(buf) - pos
            if self.startup:
                if left < 8:
                    return None
                length, code = struct.unpack_from("!ii", buf, pos)
                if code not in STARTUP_CODES or not 8 <= length < 10_000:
                    self.opaque = True
                    return None
                if left < length:
                    return None
                pos = self.pos = pos + length
                self.startup = code in SSL_OR_GSS  # after SSL/GSS refused ('N') comes the startup packet
                self.single_byte_replies += self.startup
                continue
            if left < 5:
                return None
            kind = bytes(buf[pos : pos + 1])
            (length,) = struct.unpack_from("!i", buf, pos + 1)
            if not 4 <= length < MAX_MESSAGE:
                self.opaque = True
                return None
            if left < 1 + length:
                return None
            start = self.offset + pos
            body = bytes(buf[pos + 5 : pos + 1 + length]) if kind in b"PBEQC" else b""
            self.pos = pos + 1 + length
            return kind, start, self.offset + self.pos, body
        return None

    def _track(self, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            name, query = body.split(b"\0", 2)[:2]
            self.statements[name] = query
        elif kind == b"B":
            portal, statement = body.split(b"\0", 2)[:2]
            self.portals[portal] = self.statements.get(statement, b"")
        elif kind == b"C" and body[:1] == b"S":
            self.statements.pop(body[1:].split(b"\0", 1)[0], None)


class BackendParser:
    """Follows the server->client byte stream: the type of every message completed."""

    def __init__(self, frontend: FrontendParser) -> None:
        self.frontend = frontend
        self.buf = bytearray()
        self.single_bytes_seen = 0
        self.opaque = False
        self.statuses = b""  # the transaction status of each ReadyForQuery in the last chunk fed

    def feed(self, chunk: bytes) -> bytes:
        if self.opaque:
            return b""
        self.buf += chunk
        kinds, pos, buf = bytearray(), 0, self.buf
        statuses = bytearray()
        while pos < len(buf):
            if self.single_bytes_seen < self.frontend.single_byte_replies:
                self.single_bytes_seen += 1
                if buf[pos : pos + 1] != b"N":  # 'S' or 'G': encrypted from here on
                    self.opaque = True
                    break
                pos += 1
                continue
            if len(buf) - pos < 5:
                break
            (length,) = struct.unpack_from("!i", buf, pos + 1)
            if not 4 <= length < MAX_MESSAGE:
                self.opaque = True
                break
            if len(buf) - pos < 1 + length:
                break
            kinds += buf[pos : pos + 1]
            if buf[pos : pos + 1] == b"Z":
                statuses += buf[pos + 5 : pos + 6]  # I idle (committed or never begun), T in a transaction, E failed
            pos += 1 + length
        del buf[:pos]
        self.statuses = bytes(statuses)
        return bytes(kinds)


def summary(query: bytes) -> str:
    return " ".join(query.decode(errors="replace").split())[:80]


# The proxy's state for one connection, beside the parsers it feeds ------------------------

@dataclasses.dataclass(frozen=True)
class ProxyEvent:
    at: float  # time.monotonic()
    kind: str  # accept, reset, cut, blackholed, closed
    conn: int
    detail: str = ""


@dataclasses.dataclass
class CutRule:
    needles: tuple[bytes, ...]
    when: str  # "before", "after" or "commit"
    times: int


class Conn:
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
        self.cut_at_commit: str = ""  # a "commit" cut: reset once the matched statement's transaction ends
        self.until_sync = False  # after an "after" cut: the rest of the pipeline, up to its Sync, still goes
        self.reply_kinds = bytearray()
        self.to_server: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()
        self.to_client: asyncio.Queue[tuple[float, Any]] = asyncio.Queue()
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def rest_of_pipeline(self, data: bytes) -> bytes:
        """After an "after" cut: what of ``data`` still goes to the server. A pipeline sent in
        parts (BEGIN, the statement, COMMIT, then Sync) goes on up to its Sync, so "after"
        means after the server ran the whole pipeline; anything later is dropped."""
        if not self.until_sync:
            return b""
        statements = self.parser.feed(data)
        if self.parser.unsynced or not statements:
            return data
        self.until_sync = False
        return data[:max(end for _, end, _ in statements)]
