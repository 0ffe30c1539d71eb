"""Record framing for outbox segments.

A segment is a sequence of frames::

    u32 length  | u32 crc32c | u64 seq | i64 ts_ms | u8 kind | payload[length]

The CRC covers the segment's identity (shard, segment number), then every header field
after itself and the payload, so a frame copied from another file never validates.
Frame 0 of every segment is a HEADER; a sealed segment ends with a SEAL frame. Sequence
numbers start at 0 in each segment and grow by one: a gap is corruption.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


def _load_crc32c() -> Callable[..., int]:
    """The ``crc32c`` package's C function. Its ``__init__`` looks up the package's own
    version through ``importlib.metadata``, which costs every process that opens an outbox
    about 20 ms; loading the extension module beside it skips that. Anything unexpected
    (another layout of the package) falls back to the plain import."""
    for entry in sys.path:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(entry or ".", "crc32c", "_crc32c" + suffix)
            if not os.path.isfile(path):
                continue
            try:
                spec = importlib.util.spec_from_file_location("crc32c._crc32c", path)
                if spec is None or spec.loader is None:
                    break
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
                return module.crc32c
            except (ImportError, AttributeError):
                break
    from crc32c import crc32c

    return crc32c


crc32c = _load_crc32c()

HEADER = struct.Struct("<IIQqB")
HEADER_SIZE = HEADER.size  # 25 bytes
_AFTER_CRC = struct.Struct("<IQqB")  # the header fields the CRC covers
_IDENTITY = struct.Struct("<4sIQ")
_MAGIC = b"SWOB"

# A 64 MiB cap: one frame never needs more, and a garbage length field past it is damage.
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024


class Kind(IntEnum):
    HEADER = 0
    DATA = 1
    SEAL = 2


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded frame and where it sits in its segment."""

    kind: Kind
    seq: int
    ts_ms: int
    payload: bytes
    offset: int
    end: int


def _identity(shard: int, segno: int) -> bytes:
    return _IDENTITY.pack(_MAGIC, shard, segno)


def encode(shard: int, segno: int, kind: Kind, seq: int, ts_ms: int, payload: bytes) -> bytes:
    """Return the bytes of one frame."""
    return encode_header(shard, segno, kind, seq, ts_ms, payload) + payload


def encode_header(shard: int, segno: int, kind: Kind, seq: int, ts_ms: int, payload: bytes) -> bytes:
    """Return the header of one frame; the payload follows it (written without a copy)."""
    tail = _AFTER_CRC.pack(len(payload), seq, ts_ms, kind)
    crc = crc32c(payload, crc32c(tail, crc32c(_identity(shard, segno))))
    return HEADER.pack(len(payload), crc, seq, ts_ms, kind)


def decode_at(buf: bytes | memoryview, pos: int, shard: int, segno: int) -> Frame | None:
    """Decode the frame starting at ``pos``; None if it is incomplete or invalid."""
    if len(buf) - pos < HEADER_SIZE:
        return None
    length, crc, seq, ts_ms, kind = HEADER.unpack_from(buf, pos)
    end = pos + HEADER_SIZE + length
    if length > MAX_PAYLOAD_BYTES or end > len(buf) or kind > Kind.SEAL:
        return None
    payload = bytes(buf[pos + HEADER_SIZE : end])
    tail = _AFTER_CRC.pack(length, seq, ts_ms, kind)
    if crc32c(payload, crc32c(tail, crc32c(_identity(shard, segno)))) != crc:
        return None
    return Frame(Kind(kind), seq, ts_ms, payload, pos, end)


def find_valid_after(buf: bytes | memoryview, start: int, shard: int, segno: int) -> int | None:
    """Offset of the first valid frame at or after ``start``, scanning byte by byte.

    Used only to tell a torn tail (nothing valid follows) from corruption (valid frames
    follow damage). A false match needs a 32-bit CRC collision over this segment's
    identity, so it is negligible.
    """
    if not bytes(buf[start:]).strip(b"\0"):
        return None  # a zero-filled tail (a common torn tail) holds no frame: skip the byte scan
    for pos in range(start, len(buf) - HEADER_SIZE + 1):
        if decode_at(buf, pos, shard, segno) is not None:
            return pos
    return None
